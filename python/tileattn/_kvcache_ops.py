"""The torch.library custom op behind flash_attn_with_kvcache: tileattn::kvcache_fwd appends k/v
into k_cache/v_cache in place (hence mutates_args), then attends.  No autograd: flash-attn's
kvcache path is inference only.  It shares the attention ops' helpers (_ops.py): the parameter
fill, the outputs, the device switch and the CUDA workspace.
"""

from typing import Optional, Tuple

import torch

from . import _ffi
from ._ops import (_dispatch_needed, _fill_forward, _last_dim_contiguous, _new_output, _on_device,
                   _rows, _with_workspace)

Tensor = torch.Tensor


def _opt_ptr(x):
    return 0 if x is None else x.data_ptr()


def _kvcache_fwd_impl(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor],
                v: Optional[Tensor], rotary_cos: Optional[Tensor], rotary_sin: Optional[Tensor],
                cache_seqlens: Optional[Tensor], cache_batch_idx: Optional[Tensor],
                cache_leftpad: Optional[Tensor], block_table: Optional[Tensor],
                softmax_scale: float, window_left: int, window_right: int, softcap: float,
                rotary_interleaved: bool, alibi_slopes: Optional[Tensor],
                num_splits: int, cu_seqlens_q: Optional[Tensor], max_seqlen_q: int,
                cu_seqlens_k: Optional[Tensor], seqused_k: Optional[Tensor],
                max_seqlen_k: int, cache_seqlen: int = -1) -> Tuple[Tensor, Tensor]:
    """Returns (out, softmax_lse (B, H, Sq), or (H, total_q) with cu_seqlens_q); k_cache and
    v_cache receive k and v.  cache_seqlen >= 0: every sequence's cache length, with
    cache_seqlens None (flash-attn's int form)."""
    params, out, lse, copies = kvcache_params(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
        cache_leftpad, block_table, softmax_scale, window_left, window_right, softcap,
        rotary_interleaved, alibi_slopes, num_splits, cu_seqlens_q, max_seqlen_q, cu_seqlens_k,
        seqused_k, max_seqlen_k, cache_seqlen)
    _on_device(q.device, forward_kvcache, params)
    del copies  # alive until the library has read them
    return out, lse


def forward_kvcache(params, workspace_bytes=None):
    lib = _ffi.library()
    return _with_workspace(params, params.fwd.device == _ffi.DEVICE_CUDA,
                           lib.kvcache_workspace_size, lib.forward_kvcache, workspace_bytes)


def kvcache_params(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                   cache_batch_idx, cache_leftpad, block_table, softmax_scale, window_left,
                   window_right, softcap, rotary_interleaved, alibi_slopes, num_splits,
                   cu_seqlens_q=None, max_seqlen_q=0, cu_seqlens_k=None, seqused_k=None, max_seqlen_k=0,
                   cache_seqlen=-1):
    """(params, out, lse, copies) for one kvcache call (q packed (total_q, H, D) when
    cu_seqlens_q is given; the cache lengths from cu_seqlens_k and seqused_k when cache_seqlens
    is None, as a paged varlen call gives them, or cache_seqlen for every sequence when it is
    >= 0: an int cache_seqlens, which the library takes without a device array).  `copies`
    holds the inputs copied to make a last dim contiguous, which params point at: the caller
    keeps it until the library call returns (on the CPU backend a freed copy's memory is reused
    at once)."""
    given = (q, k, v, rotary_cos, rotary_sin, alibi_slopes)
    q, k, v, rotary_cos, rotary_sin, alibi_slopes = (_last_dim_contiguous(x) for x in given)
    if rotary_cos is not None:
        rotary_cos, rotary_sin = rotary_cos.contiguous(), rotary_sin.contiguous()
    used = (q, k, v, rotary_cos, rotary_sin, alibi_slopes)
    copies = tuple(b for a, b in zip(given, used) if a is not b)
    packed = cu_seqlens_q is not None
    batch, seqlen_q = (cu_seqlens_q.shape[0] - 1, max_seqlen_q) if packed else q.shape[:2]
    paged = block_table is not None
    seqlen_k = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
    out = _new_output(q)
    lse = _new_output(q, lse_shape(q, cu_seqlens_q), torch.float32)
    params = _ffi.KvCacheParams()
    _fill_forward(params.fwd, q, k_cache, v_cache, out, lse, None, batch=batch, seqlen_q=seqlen_q,
                  seqlen_k=seqlen_k, varlen=False, cu_seqlens_q=None, cu_seqlens_k=None,
                  seqused_k=None, dropout_p=0.0, softmax_scale=softmax_scale,
                  window_left=window_left, window_right=window_right, softcap=softcap,
                  alibi_slopes=alibi_slopes, seed=0, offset=0)
    if packed:  # lse (H, total_q)
        params.fwd.cu_seqlens_q, params.fwd.total_q = cu_seqlens_q.data_ptr(), q.shape[0]
        params.fwd.lse_batch_stride, params.fwd.lse_head_stride = 0, lse.stride(0)
    params.cache_seqlens = _opt_ptr(cache_seqlens)
    if cache_seqlen >= 0:
        params.uniform_cache_seqlen, params.cache_seqlen = 1, cache_seqlen
    if cu_seqlens_k is not None:
        params.fwd.cu_seqlens_k, params.fwd.seqused_k = cu_seqlens_k.data_ptr(), _opt_ptr(seqused_k)
        params.max_seqlen_k = max_seqlen_k
    params.cache_batch_idx = _opt_ptr(cache_batch_idx)
    params.cache_leftpad = _opt_ptr(cache_leftpad)
    if paged:
        params.block_table = block_table.data_ptr()
        params.block_table_batch_stride = block_table.stride(0)
        params.num_cache_entries = block_table.shape[0]
        params.num_blocks, params.page_size = k_cache.shape[0], k_cache.shape[1]
        params.max_blocks = block_table.shape[1]
    else:
        params.num_cache_entries = k_cache.shape[0]
    if k is not None:
        params.k_new, params.v_new = k.data_ptr(), v.data_ptr()
        params.k_new_batch_stride, params.k_new_row_stride, params.k_new_head_stride = _rows(k)
        params.v_new_batch_stride, params.v_new_row_stride, params.v_new_head_stride = _rows(v)
        params.seqlen_new = k.shape[1]
    if rotary_cos is not None:
        params.rotary_cos, params.rotary_sin = rotary_cos.data_ptr(), rotary_sin.data_ptr()
        params.rotary_seqlen, params.rotary_dim = rotary_cos.shape[0], 2 * rotary_cos.shape[1]
        params.rotary_interleaved = 1 if rotary_interleaved else 0
    params.num_splits = num_splits
    return params, out, lse, copies


def lse_shape(q, cu_seqlens_q):
    """softmax_lse's shape: (B, H, Sq), or (H, total_q) for packed query rows."""
    if cu_seqlens_q is not None:
        return (q.shape[1], q.shape[0])
    return (q.shape[0], q.shape[2], q.shape[1])


kvcache_fwd = torch.library.custom_op(
    "tileattn::kvcache_fwd", mutates_args=("k_cache", "v_cache"))(_kvcache_fwd_impl)


@kvcache_fwd.register_fake
def _(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
      cache_leftpad, block_table, softmax_scale, window_left, window_right, softcap,
      rotary_interleaved, alibi_slopes, num_splits, cu_seqlens_q, max_seqlen_q, cu_seqlens_k, seqused_k,
      max_seqlen_k, cache_seqlen=-1):
    return q.new_empty(q.shape), q.new_empty(lse_shape(q, cu_seqlens_q), dtype=torch.float32)


def call_kvcache_fwd(q, k_cache, v_cache, k, v, *options, on_success=None):
    """`on_success(params, lse)`, when given, sees an eager call's parameters after the library
    accepted them (_kvcache_plan keeps them for the next call with the same signature)."""
    if _dispatch_needed(q, k_cache, v_cache, k, v):
        return torch.ops.tileattn.kvcache_fwd(q, k_cache, v_cache, k, v, *options)
    if on_success is None:
        return _kvcache_fwd_impl(q, k_cache, v_cache, k, v, *options)
    params, out, lse, copies = kvcache_params(q, k_cache, v_cache, k, v, *options)
    _on_device(q.device, forward_kvcache, params)
    if not copies:
        on_success(params, lse)
    return out, lse
