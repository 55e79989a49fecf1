"""Repeated flash_attn_func and flash_attn_varlen_func calls without repeating the checks their
signature passed (the scheme: _plans.py), whether autograd records them (training) or not
(inference, prefill under no_grad).

Such a call spent ~46 us on the H200's host before its launch (~26 us on the 2-core CI host):
checks, two allocations and ~35 ctypes field writes from tensor attributes, against ~22 us for
SDPA's whole call; at 512 tokens the kernel takes 10-30 us.  A recorded call goes through
_ops._LaunchedFwd with the plan's launch, so autograd sees the same node and saved tensors as on
the full path.  Calls with dropout (a new Philox offset each time), attention probabilities, or
copied inputs take the full path each time.
"""

import torch

from . import _ffi, _ops
from ._plans import Plans, fill_call, on_other_device, tensor_key, traced

_plans = Plans()
hits = 0  # calls served from a plan since import (tests check the fast path really ran)


def options_key(dropout_p, softmax_scale, causal, window_size, softcap, deterministic,
                 return_attn_probs):
    """The options' part of a signature (values and types), or None when no plan may serve the
    call: dropout, attention probabilities, a window that is not a pair, or dynamo tracing."""
    if (torch.compiler.is_compiling() or return_attn_probs is not False
            or type(dropout_p) not in (float, int) or dropout_p != 0
            or type(window_size) is not tuple or len(window_size) != 2):
        return None
    left, right = window_size
    return (torch.is_grad_enabled(), type(dropout_p), type(softmax_scale), softmax_scale,
            type(causal), causal, type(left), left, type(right), right, type(softcap), softcap,
            type(deterministic), deterministic)


def signature(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
              deterministic, return_attn_probs):
    """A flash_attn_func call's signature, or None when it cannot have a plan.  Grad mode and the
    tensors' requires_grad are in it, so a plan is for recorded calls or for unrecorded ones."""
    options = options_key(dropout_p, softmax_scale, causal, window_size, softcap, deterministic,
                           return_attn_probs)
    if options is None:
        return None
    try:
        return (tensor_key(q), tensor_key(k), tensor_key(v), tensor_key(alibi_slopes)) + options
    except AttributeError:
        return None


def varlen_signature(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                     softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                     return_attn_probs, seqused_k):
    """A flash_attn_varlen_func call's signature: the batch form's with the index tensors and the
    maximum lengths (values and types; the library reads the index tensors' contents)."""
    options = options_key(dropout_p, softmax_scale, causal, window_size, softcap, deterministic,
                           return_attn_probs)
    if options is None:
        return None
    try:
        return ("varlen", tensor_key(q), tensor_key(k), tensor_key(v), tensor_key(alibi_slopes),
                tensor_key(cu_seqlens_q), tensor_key(cu_seqlens_k), tensor_key(seqused_k),
                type(max_seqlen_q), max_seqlen_q, type(max_seqlen_k), max_seqlen_k) + options
    except AttributeError:
        return None


def store(key, params, lse, recorded, options):
    """Keep an accepted call's parameters for the next call with its signature, with the op's
    arguments after q, k, v (`options`) without their tensors: a recorded call's context is
    built from them and the next call's own tensors."""
    kept = tuple(None if isinstance(x, torch.Tensor) else x for x in options)
    _plans.store(key, (params, tuple(lse.shape), params.device == _ffi.DEVICE_CUDA, recorded,
                       kept))


class Rerouted:
    """The plan of calls that the full path sends elsewhere (decode steps to the KV-cache kernels,
    _batch_decode_route.py): `call` takes the call's tensors and returns out, or None where it no
    longer applies."""

    __slots__ = ("call",)

    def __init__(self, call):
        self.call = call


def store_rerouted(key, call):
    """Keep `call` for the next call with this signature."""
    _plans.store(key, Rerouted(call))


def _rerouted(plan, *tensors):
    """out of a Rerouted plan, or None when the full path must run."""
    global hits
    if traced():
        return None
    out = plan.call(*tensors)
    if out is not None:
        hits += 1
    return out


def _ready(plan, q):
    """`plan` where it may serve this call, else None."""
    if plan is None or traced() or (plan[2] and on_other_device(q)):
        return None
    return plan


def _run(plan, form, q, k, v, alibi_slopes, options, fill_more=None):
    """out from `plan`: launched as is, or through _ops._LaunchedFwd when the call is recorded
    (`options`: the op's arguments after q, k, v, this call's tensors in place)."""
    global hits
    template, lse_shape, on_cuda, recorded, _ = plan

    def launch(q, k, v):
        out = _ops._new_output(q)
        lse = _ops._new_output(q, lse_shape, torch.float32)
        params = _ffi.FwdParams.from_buffer_copy(template)
        fill_call(params, on_cuda, q, k, v, out, lse, alibi_slopes)
        if fill_more is not None:
            fill_more(params)
        _ffi.library().forward(params)
        return out, lse

    out = (_ops._LaunchedFwd.apply(launch, form, q, k, v, (q, k, v, *options)) if recorded
           else launch(q, k, v)[0])
    hits += 1
    return out


def run(key, q, k, v, alibi_slopes):
    """flash_attn_func's out from the plan of `key`, or None when the full path must run."""
    plan = _plans.get(key)
    if isinstance(plan, Rerouted):
        return _rerouted(plan, q, k, v, alibi_slopes)
    plan = _ready(plan, q)
    if plan is None:
        return None
    kept = plan[4]  # (dropout_p, scale, left, right, softcap, alibi_slopes, return_probs, det)
    return _run(plan, _ops._BATCH, q, k, v, alibi_slopes, kept[:5] + (alibi_slopes,) + kept[6:])


def run_varlen(key, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes):
    """flash_attn_varlen_func's out from the plan of `key`, or None when the full path must run."""
    plan = _plans.get(key)
    if isinstance(plan, Rerouted):
        return _rerouted(plan, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes)
    plan = _ready(plan, q)
    if plan is None:
        return None
    kept = plan[4]  # (cu_q, cu_k, seqused_k, max_q, max_k, dropout_p, scale, left, right, softcap,
    #                 alibi_slopes, return_probs, det)
    options = (cu_seqlens_q, cu_seqlens_k, seqused_k) + kept[3:10] + (alibi_slopes,) + kept[11:]

    def fill_more(params):
        params.cu_seqlens_q, params.cu_seqlens_k = cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr()
        if seqused_k is not None:
            params.seqused_k = seqused_k.data_ptr()

    return _run(plan, _ops._VARLEN, q, k, v, alibi_slopes, options, fill_more)
