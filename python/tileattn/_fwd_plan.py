"""Repeated flash_attn_func calls without repeating the checks their signature passed (the
scheme: _plans.py), whether autograd records them (training) or not (inference, prefill under
no_grad).

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


def signature(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
              deterministic, return_attn_probs):
    """The call's signature, or None when it cannot have a plan.  Grad mode and the tensors'
    requires_grad are in it, so a plan is for recorded calls or for unrecorded ones."""
    if (torch.compiler.is_compiling() or return_attn_probs is not False
            or type(dropout_p) not in (float, int) or dropout_p != 0
            or type(window_size) is not tuple or len(window_size) != 2):
        return None
    left, right = window_size
    try:
        return (tensor_key(q), tensor_key(k), tensor_key(v), tensor_key(alibi_slopes),
                torch.is_grad_enabled(), type(dropout_p), type(softmax_scale), softmax_scale,
                type(causal), causal, type(left), left, type(right), right, type(softcap),
                softcap, type(deterministic), deterministic)
    except AttributeError:
        return None


def store(key, params, lse, recorded, saved):
    """Keep an accepted call's parameters for the next call with its signature; `saved`: the
    resolved options the backward of a recorded call needs."""
    _plans.store(key, (params, tuple(lse.shape), params.device == _ffi.DEVICE_CUDA, recorded,
                       saved))


def run(key, q, k, v, alibi_slopes):
    """out from the plan of `key`, or None when the full path must run."""
    global hits
    plan = _plans.get(key)
    if plan is None or traced():
        return None
    template, lse_shape, on_cuda, recorded, saved = plan
    if on_cuda and on_other_device(q):
        return None

    def launch(q, k, v, alibi_slopes):
        out = _ops._new_output(q)
        lse = _ops._new_output(q, lse_shape, torch.float32)
        params = _ffi.FwdParams.from_buffer_copy(template)
        fill_call(params, on_cuda, q, k, v, out, lse, alibi_slopes)
        _ffi.library().forward(params)
        return out, lse

    out = (_ops._LaunchedFwd.apply(launch, q, k, v, alibi_slopes, saved) if recorded
           else launch(q, k, v, alibi_slopes)[0])
    hits += 1
    return out
