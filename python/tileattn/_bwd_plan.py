"""The backward of recorded flash_attn_func and flash_attn_varlen_func calls, as autograd's engine
runs it eagerly (a training step), without repeating the checks its signature passed (the
scheme: _plans.py).

Building the parameters from the saved tensors took ~20 us of the H200 host's time per backward
(~8 us on the 2-core CI host: a fwd+bwd step 132 -> 124 us with the library stubbed), on top of
the engine's own 30-58 us for a Python autograd.Function.  Calls with dropout (their Philox state
is read from rng_state) and calls that copy an input take the full path each time.
"""

import torch

from . import _ffi, _ops
from ._plans import Plans, call_with_workspace, fill_call, on_other_device, tensor_key, traced

_plans = Plans()
hits = 0  # calls served from a plan since import (tests check the fast path really ran)


def signature(dout, q, k, v, out, lse, dropout_p, softmax_scale, window_left, window_right,
              softcap, alibi_slopes, deterministic):
    """The call's signature, or None when it cannot have a plan.  The options come from the
    forward's context, which the forward's checks already typed."""
    if dropout_p != 0:
        return None
    return (tensor_key(dout), tensor_key(q), tensor_key(k), tensor_key(v), tensor_key(out),
            tensor_key(lse), tensor_key(alibi_slopes), softmax_scale, window_left, window_right,
            softcap, bool(deterministic))


def _backward(key, full, fill_more, dout, q, k, v, out, lse, alibi_slopes):
    """(dq, dk, dv) from the plan of `key` (`fill_more(params)` writes the form's own pointers),
    or from `full()` -> (params, dq, dk, dv, copies), the full path, whose accepted parameters
    become the plan."""
    global hits
    plan = None if key is None or traced() else _plans.get(key)
    if plan is not None and not (plan[1] and on_other_device(q)):
        template, on_cuda, workspace_bytes = plan
        dq, dk, dv = _ops._new_output(q), _ops._new_output(k), _ops._new_output(v)
        params = _ffi.BwdParams.from_buffer_copy(template)
        fill_call(params.fwd, on_cuda, q, k, v, out, lse, alibi_slopes)
        if fill_more is not None:
            fill_more(params.fwd)
        params.dout = dout.data_ptr()
        params.dq, params.dk, params.dv = dq.data_ptr(), dk.data_ptr(), dv.data_ptr()
        if call_with_workspace(_plans, key, _ffi.library().backward, params, on_cuda,
                               workspace_bytes, q):
            hits += 1
            return dq, dk, dv
    params, dq, dk, dv, copies = full()
    workspace_bytes = _ops._on_device(q.device, _ops.backward, params)
    on_cuda = params.fwd.device == _ffi.DEVICE_CUDA
    # A plan launches on the current device, so none from a call on another one.
    if key is not None and not copies and not (on_cuda and on_other_device(q)):
        _plans.store(key, (params, on_cuda, workspace_bytes))
    return dq, dk, dv


def backward(dout, q, k, v, out, lse, dropout_p, softmax_scale, window_left, window_right,
             softcap, alibi_slopes, deterministic, rng_state):
    """(dq, dk, dv) as _ops._bwd_impl returns them, from a plan when the signature has one."""
    key = signature(dout, q, k, v, out, lse, dropout_p, softmax_scale, window_left, window_right,
                    softcap, alibi_slopes, deterministic)
    return _backward(key, lambda: _ops._bwd_params(
        dout, q, k, v, out, lse, dropout_p, softmax_scale, window_left, window_right, softcap,
        alibi_slopes, deterministic, rng_state), None, dout, q, k, v, out, lse, alibi_slopes)


def varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                    max_seqlen_k, dropout_p, softmax_scale, window_left, window_right, softcap,
                    alibi_slopes, deterministic, rng_state):
    """(dq, dk, dv) as _ops._varlen_bwd_impl returns them, from a plan when the signature has
    one: the batch form's signature with the index tensors and the maximum lengths."""
    key = signature(dout, q, k, v, out, lse, dropout_p, softmax_scale, window_left, window_right,
                    softcap, alibi_slopes, deterministic)
    if key is not None:
        key += ("varlen", tensor_key(cu_seqlens_q), tensor_key(cu_seqlens_k),
                tensor_key(seqused_k), max_seqlen_q, max_seqlen_k)

    def fill_more(fwd):
        fwd.cu_seqlens_q, fwd.cu_seqlens_k = cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr()
        if seqused_k is not None:
            fwd.seqused_k = seqused_k.data_ptr()

    return _backward(key, lambda: _ops._varlen_bwd_params(
        dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
        max_seqlen_k, dropout_p, softmax_scale, window_left, window_right, softcap, alibi_slopes,
        deterministic, rng_state), fill_more, dout, q, k, v, out, lse, alibi_slopes)
