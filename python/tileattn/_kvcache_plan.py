"""Repeated flash_attn_with_kvcache calls without repeating the checks their signature passed.

A decode loop calls flash_attn_with_kvcache once per layer per token, with tensors whose shapes,
strides, dtypes and devices repeat; only the data pointers change.  Checking the arguments and
filling the parameter struct from tensor attributes cost ~29 us a call on the 2-core CI host and
~45 us on the H200's host (session 22): more than the kernels of a 1 x 32k step (37 us), and
more than SDPA's whole cuDNN call on that host (20 us).

The scheme is _plans.py's.  The signature holds every tensor argument (the index tensors and
rotary tables too) and every option with its type; a plan also keeps the size of the split-KV
workspace, which only the shapes and the device decide.  Calls that copy an input (a last dim
that is not contiguous, a non-contiguous index tensor) or that a tracer must see take the full
path.
"""

import torch

from . import _ffi, _ops
from ._checks import INT32_MAX
from ._plans import (Plans, call_with_workspace, empty_like_shape, fill_call, on_other_device,
                     tensor_key, traced)

_plans = Plans()
hits = 0  # calls served from a plan since import (tests check the fast path really ran)


def signature(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
              cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
              rotary_interleaved, alibi_slopes, num_splits, cu_seqlens_q=None, max_seqlen_q=None):
    """The call's signature, or None when it cannot have one (an argument without tensor
    attributes): such calls take the full path, which says what is wrong.  The signature may be
    unhashable (a list option); run() and store() then ignore it."""
    # Under dynamo the call is traced into a graph, never replayed from here (is_compiling()
    # is a constant True to dynamo, so none of the lookups below get traced).
    if torch.compiler.is_compiling() or type(window_size) is not tuple or len(window_size) != 2:
        return None
    left, right = window_size
    seqlens = (tensor_key(cache_seqlens) if isinstance(cache_seqlens, torch.Tensor)
               else (type(cache_seqlens),))
    try:
        return (tensor_key(q), tensor_key(k_cache), tensor_key(v_cache), tensor_key(k), tensor_key(v),
                tensor_key(rotary_cos), tensor_key(rotary_sin), seqlens, tensor_key(cache_batch_idx),
                tensor_key(cache_leftpad), tensor_key(block_table), tensor_key(alibi_slopes),
                torch.is_grad_enabled(), type(softmax_scale), softmax_scale, type(causal), causal,
                type(left), left, type(right), right, type(softcap), softcap,
                type(rotary_interleaved), rotary_interleaved, type(num_splits), num_splits,
                tensor_key(cu_seqlens_q), type(max_seqlen_q), max_seqlen_q)
    except AttributeError:
        return None


def store(key, params, lse):
    """Keep an accepted call's parameters for the next call with its signature."""
    _plans.store(key, (params, empty_like_shape(lse), params.fwd.device == _ffi.DEVICE_CUDA,
                       params.workspace_bytes))


def run(key, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
        cache_leftpad, block_table, alibi_slopes, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None):
    """(out, lse) from the plan of `key`, or None when the full path must run: no plan, a tracer
    active, or q on a device other than the current one (the full path switches to it).
    cache_seqlens is None where a paged varlen decode step gives its key lengths through
    cu_seqlens_k and seqused_k (_paged_varlen_kvcache.py, which keeps its plans here too)."""
    global hits
    plan = _plans.get(key)
    if plan is None or traced():
        return None
    template, lse_like, on_cuda, workspace_bytes = plan
    if on_cuda and on_other_device(q):
        return None
    if isinstance(cache_seqlens, int) and not 0 <= cache_seqlens <= INT32_MAX:
        return None  # the full path names cache_seqlens
    out = _ops._new_output(q)
    lse = _ops._new_output(lse_like)
    params = _ffi.KvCacheParams.from_buffer_copy(template)
    fill_call(params.fwd, on_cuda, q, k_cache, v_cache, out, lse, alibi_slopes)
    # Optional tensors: the signature fixes which are present; absent ones stay 0 from the plan.
    # An int cache_seqlens is the plan's uniform length (the signature keeps its type).
    if isinstance(cache_seqlens, int):
        params.cache_seqlen = cache_seqlens
    elif cache_seqlens is not None:
        params.cache_seqlens = cache_seqlens.data_ptr()
    if cache_batch_idx is not None:
        params.cache_batch_idx = cache_batch_idx.data_ptr()
    if cache_leftpad is not None:
        params.cache_leftpad = cache_leftpad.data_ptr()
    if block_table is not None:
        params.block_table = block_table.data_ptr()
    if k is not None:
        params.k_new, params.v_new = k.data_ptr(), v.data_ptr()
    if rotary_cos is not None:
        params.rotary_cos, params.rotary_sin = rotary_cos.data_ptr(), rotary_sin.data_ptr()
    if cu_seqlens_q is not None:
        params.fwd.cu_seqlens_q = cu_seqlens_q.data_ptr()
    if cu_seqlens_k is not None:
        params.fwd.cu_seqlens_k = cu_seqlens_k.data_ptr()
    if seqused_k is not None:
        params.fwd.seqused_k = seqused_k.data_ptr()
    if not call_with_workspace(_plans, key, _ffi.library().forward_kvcache, params, on_cuda,
                               workspace_bytes, q):
        return None
    hits += 1
    return out, lse
