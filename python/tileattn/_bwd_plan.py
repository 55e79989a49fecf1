"""The backward of flash_attn_func's recorded calls, as autograd's engine runs it eagerly (a
training step), without repeating the checks its signature passed (the scheme: _plans.py).

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


def backward(dout, q, k, v, out, lse, dropout_p, softmax_scale, window_left, window_right,
             softcap, alibi_slopes, deterministic, rng_state):
    """(dq, dk, dv) as _ops._bwd_impl returns them, from a plan when the signature has one."""
    global hits
    key = signature(dout, q, k, v, out, lse, dropout_p, softmax_scale, window_left, window_right,
                    softcap, alibi_slopes, deterministic)
    plan = None if key is None or traced() else _plans.get(key)
    if plan is not None and not (plan[1] and on_other_device(q)):
        template, on_cuda, workspace_bytes = plan
        dq, dk, dv = _ops._new_output(q), _ops._new_output(k), _ops._new_output(v)
        params = _ffi.BwdParams.from_buffer_copy(template)
        fill_call(params.fwd, on_cuda, q, k, v, out, lse, alibi_slopes)
        params.dout = dout.data_ptr()
        params.dq, params.dk, params.dv = dq.data_ptr(), dk.data_ptr(), dv.data_ptr()
        try:
            call_with_workspace(_ffi.library().backward, params, workspace_bytes, q)
        except _ffi.InvalidArgumentError as error:
            if error.argument != "workspace":
                raise
            _plans.drop(key)  # the kernel choice moved under the plan: start over
        else:
            hits += 1
            return dq, dk, dv
    params, dq, dk, dv, copies = _ops._bwd_params(
        dout, q, k, v, out, lse, dropout_p, softmax_scale, window_left, window_right, softcap,
        alibi_slopes, deterministic, rng_state)
    on_cuda = params.fwd.device == _ffi.DEVICE_CUDA
    if on_cuda and on_other_device(q):
        _ops._on_device(q.device, _ops.backward, params)
        return dq, dk, dv
    workspace_bytes = _ops.backward(params)
    if key is not None and not copies:
        _plans.store(key, (params, on_cuda, workspace_bytes))
    return dq, dk, dv
