"""Repeated flash_attn_func calls that autograd does not record (inference, prefill under
no_grad) without repeating the checks their signature passed (the scheme: _plans.py).

Such a call spent ~46 us on the H200's host before its launch (~26 us on the 2-core CI host):
checks, two allocations and ~35 ctypes field writes from tensor attributes, against ~22 us for
SDPA's whole call; at 512 tokens the kernel takes 10-30 us.  Calls with dropout (a new Philox
offset each time), attention probabilities, or tensors autograd records take the full path.
"""

import torch

from . import _ffi, _ops
from ._plans import Plans, on_other_device, tensor_key, traced

_plans = Plans()
hits = 0  # calls served from a plan since import (tests check the fast path really ran)


def signature(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
              deterministic, return_attn_probs):
    """The call's signature, or None when it cannot have a plan."""
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


def store(key, params, lse):
    """Keep an accepted call's parameters for the next call with its signature."""
    _plans.store(key, (params, tuple(lse.shape), params.device == _ffi.DEVICE_CUDA))


def run(key, q, k, v, alibi_slopes):
    """out from the plan of `key`, or None when the full path must run."""
    global hits
    plan = _plans.get(key)
    if plan is None or traced():
        return None
    template, lse_shape, on_cuda = plan
    if on_cuda and on_other_device(q):
        return None
    out = _ops._new_output(q)
    lse = _ops._new_output(q, lse_shape, torch.float32)
    params = _ffi.FwdParams.from_buffer_copy(template)
    params.q, params.k, params.v = q.data_ptr(), k.data_ptr(), v.data_ptr()
    params.out, params.softmax_lse = out.data_ptr(), lse.data_ptr()
    if alibi_slopes is not None:
        params.alibi_slopes = alibi_slopes.data_ptr()
    if on_cuda:
        params.stream = _ops._current_stream(q.device)
    else:
        params.num_threads = torch.get_num_threads()
    _ffi.library().forward(params)
    hits += 1
    return out
