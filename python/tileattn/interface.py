"""flash-attn 2.x's Python API: the same names, argument order, defaults, layouts and returns.

    out = flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False)

q is (batch, seqlen_q, nheads, headdim), k and v (batch, seqlen_k, nheads_k, headdim) with nheads
a multiple of nheads_k (GQA/MQA: query head h reads KV head h // (nheads // nheads_k)).  The
varlen functions take packed (total, nheads, headdim) tensors and int32 cu_seqlens prefix sums.
Masks are bottom-right aligned as in flash-attn >= 2.1: query i sees key j when
    i + seqlen_k - seqlen_q - window_size[0] <= j <= i + seqlen_k - seqlen_q + window_size[1]
(causal=True sets window_size[1] = 0); a row that sees no key gives output 0 and lse +inf.

With return_attn_probs=True the functions return (out, softmax_lse, attn_probs): softmax_lse is
float32 (batch, nheads, seqlen_q), or (nheads, total_q) for varlen; attn_probs is float32
(batch, nheads, seqlen_q, seqlen_k) probabilities (for testing), with entries dropped by dropout
stored negated.  Unlike flash-attn, attn_probs is returned with or without dropout.

CPU tensors run on the CPU backend (float16, bfloat16 and float32), CUDA tensors on the CUDA
backend (float16, bfloat16) when the library was built with it.  Every function is differentiable
through torch.library custom ops, and traces under torch.compile(fullgraph=True).
"""

import functools

import torch

from . import (_batch_decode_route, _fwd_plan, _kvcache_ops, _kvcache_plan, _ops, _paged_varlen,
               _paged_varlen_kvcache)
from ._checks import Checker
from ._ffi import InvalidArgumentError

__all__ = [
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_with_kvcache",
]

_BATCH_LAYOUT = "(batch, seqlen, nheads, headdim)"
_PACKED_LAYOUT = "(total, nheads, headdim)"


def _options(check, q, dropout_p, softmax_scale, causal, window_size, softcap):
    dropout_p, scale, left, right, softcap = check.options(
        dropout_p, softmax_scale, window_size, softcap, q.shape[-1])
    if causal:
        right = 0
    return dropout_p, scale, left, right, softcap


def _batch_attention(check, q, k, v, names, dropout_p, softmax_scale, causal, window_size,
                     softcap, alibi_slopes, deterministic, return_attn_probs, plan=None):
    for name, x in zip(names, (q, k, v)):
        check.dims(x, name, 4, _BATCH_LAYOUT)
    check.dtype_and_device(list(zip(names, (q, k, v))))
    check.heads(q, k, v, names, seq_dim=1)
    dropout_p, scale, left, right, softcap = _options(
        check, q, dropout_p, softmax_scale, causal, window_size, softcap)
    alibi_slopes = check.alibi(alibi_slopes, q.shape[0], q.shape[2], q.device,
                               sdpa_heads=q.shape[1])
    if _batch_decode_route.applies(q, k, v, dropout_p, return_attn_probs):
        route = _batch_decode_route.batch_call(scale, left, right, softcap, flash_attn_with_kvcache)
        if plan is not None:
            _fwd_plan.store_rerouted(plan, route)
        return route(q, k, v, alibi_slopes)
    out, lse, probs, _ = _ops.call_fwd(
        q, k, v, dropout_p, scale, left, right, softcap, alibi_slopes, bool(return_attn_probs),
        bool(deterministic),
        on_success=None if plan is None else functools.partial(_fwd_plan.store, plan))
    return (out, lse, probs) if return_attn_probs else out


def _varlen_attention(check, q, k, v, names, cu_seqlens_q, cu_seqlens_k, cu_names,
                      max_seqlen_q, max_seqlen_k, max_names, dropout_p, softmax_scale, causal,
                      window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
                      seqused_k=None, plan=None):
    given = (cu_seqlens_q, cu_seqlens_k, seqused_k)
    for name, x in zip(names, (q, k, v)):
        check.dims(x, name, 3, _PACKED_LAYOUT)
    check.dtype_and_device(list(zip(names, (q, k, v))))
    check.heads(q, k, v, names, seq_dim=0)
    cu_seqlens_q = check.cu_seqlens(cu_seqlens_q, cu_names[0], q.device)
    batch = cu_seqlens_q.shape[0] - 1
    cu_seqlens_k = check.cu_seqlens(cu_seqlens_k, cu_names[1], q.device, batch, cu_names[0])
    max_seqlen_q = check.seqlen(max_seqlen_q, max_names[0])
    max_seqlen_k = check.seqlen(max_seqlen_k, max_names[1])
    seqused_k = check.seqused_k(seqused_k, batch, q.device)
    dropout_p, scale, left, right, softcap = _options(
        check, q, dropout_p, softmax_scale, causal, window_size, softcap)
    alibi_slopes = check.alibi(alibi_slopes, batch, q.shape[1], q.device)
    # A plan points at the caller's index tensors: none for a call whose checks had to copy one.
    copied = any(a is not b for a, b in zip(given, (cu_seqlens_q, cu_seqlens_k, seqused_k)))
    if _batch_decode_route.varlen_applies(q, k, v, dropout_p, return_attn_probs, max_seqlen_q):
        route = _batch_decode_route.varlen_call(max_seqlen_q, scale, left, right, softcap,
                                                flash_attn_with_kvcache)
        if plan is not None and not copied:
            _fwd_plan.store_rerouted(plan, route)
        return route(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes)
    out, lse, probs, _ = _ops.call_varlen_fwd(
        q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, dropout_p,
        scale, left, right, softcap, alibi_slopes, bool(return_attn_probs), bool(deterministic),
        on_success=None if plan is None or copied else functools.partial(_fwd_plan.store, plan))
    return (out, lse, probs) if return_attn_probs else out


def _unpack(check, packed, name, count, ndim, layout):
    """Split a packed (..., count, nheads, headdim) tensor into `count` strided views."""
    check.dims(packed, name, ndim, layout)
    if packed.shape[-3] != count:
        check.fail(InvalidArgumentError, name,
                   f"dim {ndim - 3} must be {count} in {layout}, got shape {tuple(packed.shape)}")
    return packed.unbind(-3)


def flash_attn_qkvpacked_func(
    qkv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),  # -1 means infinite context window
    softcap=0.0,  # 0.0 means deactivated
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """qkv: (batch, seqlen, 3, nheads, headdim).  Returns out (batch, seqlen, nheads, headdim),
    or (out, softmax_lse, attn_probs) with return_attn_probs=True."""
    check = Checker("flash_attn_qkvpacked_func")
    q, k, v = _unpack(check, qkv, "qkv", 3, 5, "(batch, seqlen, 3, nheads, headdim)")
    return _batch_attention(check, q, k, v, ("qkv",) * 3, dropout_p, softmax_scale, causal,
                            window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_kvpacked_func(
    q,
    kv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),  # -1 means infinite context window
    softcap=0.0,  # 0.0 means deactivated
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """q: (batch, seqlen_q, nheads, headdim); kv: (batch, seqlen_k, 2, nheads_k, headdim)."""
    check = Checker("flash_attn_kvpacked_func")
    k, v = _unpack(check, kv, "kv", 2, 5, "(batch, seqlen_k, 2, nheads_k, headdim)")
    return _batch_attention(check, q, k, v, ("q", "kv", "kv"), dropout_p, softmax_scale, causal,
                            window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),  # -1 means infinite context window
    softcap=0.0,  # 0.0 means deactivated
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim).

    dropout_p: dropout probability (set 0.0 for evaluation); softmax_scale: defaults to
    1 / sqrt(headdim); causal: bottom-right aligned causal mask; window_size: (left, right)
    sliding window, -1 = unbounded; softcap: > 0 applies softcap * tanh(s / softcap);
    alibi_slopes: float32 (nheads,) or (batch, nheads), adds -slope * |i + seqlen_k - seqlen_q - j|;
    deterministic: bitwise-reproducible backward; return_attn_probs: also return
    (softmax_lse, attn_probs), for testing.
    """
    plan = _fwd_plan.signature(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                               alibi_slopes, deterministic, return_attn_probs)
    if plan is not None:
        out = _fwd_plan.run(plan, q, k, v, alibi_slopes)
        if out is not None:
            return out
    check = Checker("flash_attn_func")
    return _batch_attention(check, q, k, v, ("q", "k", "v"), dropout_p, softmax_scale, causal,
                            window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
                            plan=plan)


def flash_attn_varlen_qkvpacked_func(
    qkv,
    cu_seqlens,
    max_seqlen,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),  # -1 means infinite context window
    softcap=0.0,  # 0.0 means deactivated
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """qkv: (total, 3, nheads, headdim); cu_seqlens: int32 (batch_size + 1,); max_seqlen: int."""
    check = Checker("flash_attn_varlen_qkvpacked_func")
    q, k, v = _unpack(check, qkv, "qkv", 3, 4, "(total, 3, nheads, headdim)")
    return _varlen_attention(
        check, q, k, v, ("qkv",) * 3, cu_seqlens, cu_seqlens, ("cu_seqlens",) * 2, max_seqlen,
        max_seqlen, ("max_seqlen",) * 2, dropout_p, softmax_scale, causal, window_size, softcap,
        alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(
    q,
    kv,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),  # -1 means infinite context window
    softcap=0.0,  # 0.0 means deactivated
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """q: (total_q, nheads, headdim); kv: (total_k, 2, nheads_k, headdim)."""
    check = Checker("flash_attn_varlen_kvpacked_func")
    k, v = _unpack(check, kv, "kv", 2, 4, "(total_k, 2, nheads_k, headdim)")
    return _varlen_attention(
        check, q, k, v, ("q", "kv", "kv"), cu_seqlens_q, cu_seqlens_k,
        ("cu_seqlens_q", "cu_seqlens_k"), max_seqlen_q, max_seqlen_k,
        ("max_seqlen_q", "max_seqlen_k"), dropout_p, softmax_scale, causal, window_size, softcap,
        alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),  # -1 means infinite context window
    softcap=0.0,  # 0.0 means deactivated
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
    *,
    seqused_k=None,
):
    """q: (total_q, nheads, headdim); k, v: (total_k, nheads_k, headdim); cu_seqlens_q/k: int32
    (batch_size + 1,) prefix sums of the sequence lengths; max_seqlen_q/k: ints.

    Extra (keyword only): seqused_k, int32 (batch_size,): keys actually used by each sequence.
    Paged keys: k and v (num_blocks, page_size, nheads_k, headdim), page_size a multiple of 16,
    and block_table (batch_size, max_blocks) int32; sequence b's key j is in page
    block_table[b, j // page_size].  A call that wants no gradient, dropout or attn_probs and has
    few query rows a KV group (a decode step) runs on the KV-cache kernels, which read the pages in
    place (_paged_varlen_kvcache.py); any other is gathered into a padded copy first
    (_paged_varlen.py says what that costs).
    """
    if block_table is None:
        plan = _fwd_plan.varlen_signature(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
            softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
            return_attn_probs, seqused_k)
        out = None if plan is None else _fwd_plan.run_varlen(
            plan, q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes)
    else:
        plan = _paged_varlen_kvcache.signature(
            q, k, v, block_table, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
            softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
            return_attn_probs, seqused_k)
        out = None if plan is None else _paged_varlen_kvcache.run(
            plan, q, k, v, block_table, cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes)
    if out is not None:
        return out
    check = Checker("flash_attn_varlen_func")
    if block_table is not None:
        given = (cu_seqlens_q, cu_seqlens_k, seqused_k)
        cu_seqlens_q, cu_seqlens_k, max_seqlen_k, seqused_k = _paged_varlen.check_paged_call(
            check, q, k, v, block_table, cu_seqlens_q, cu_seqlens_k, max_seqlen_k, seqused_k)
        if any(a is not b for a, b in zip(given, (cu_seqlens_q, cu_seqlens_k, seqused_k))):
            plan = None  # the parameters would point at this call's contiguous copies
        max_seqlen_q = check.seqlen(max_seqlen_q, "max_seqlen_q")
        dropout_p, scale, left, right, capped = _options(
            check, q, dropout_p, softmax_scale, causal, window_size, softcap)
        alibi_slopes = check.alibi(alibi_slopes, block_table.shape[0], q.shape[1], q.device)
        if _paged_varlen_kvcache.applies(q, k, v, dropout_p, return_attn_probs, max_seqlen_q):
            return _paged_varlen_kvcache.attention(
                q, k, v, block_table, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k,
                scale, left, right, capped, alibi_slopes, plan)
        plan = None  # the gather path's call has a signature of its own
        k, v, cu_seqlens_k, seqused_k = _paged_varlen.gather_paged_keys(
            check, k, v, block_table, cu_seqlens_k, seqused_k, max_seqlen_k, bool(deterministic))
    return _varlen_attention(
        check, q, k, v, ("q", "k", "v"), cu_seqlens_q, cu_seqlens_k,
        ("cu_seqlens_q", "cu_seqlens_k"), max_seqlen_q, max_seqlen_k,
        ("max_seqlen_q", "max_seqlen_k"), dropout_p, softmax_scale, causal, window_size, softcap,
        alibi_slopes, deterministic, return_attn_probs, seqused_k=seqused_k, plan=plan)


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),  # -1 means infinite context window
    softcap=0.0,  # 0.0 means deactivated
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
    *,
    cu_seqlens_q=None,
    max_seqlen_q=None,
):
    """Attention over a KV cache, with the new tokens appended in place (flash-attn 2.x).

    q (batch, seqlen_q, nheads, headdim); k_cache/v_cache (batch_cache, seqlen_cache, nheads_k,
    headdim), or paged (num_blocks, page_size, nheads_k, headdim) with block_table (batch,
    max_blocks) int32 and page_size a multiple of 16; k/v (batch, seqlen_new, nheads_k, headdim)
    are written into the cache at cache_seqlens (int or (batch,) int32) before attending.
    rotary_cos/rotary_sin (seqlen_ro, rotary_dim / 2) rotate k at positions cache_seqlens + i, and
    q there too when causal or windowed (else all of q at cache_seqlens); rotary_interleaved
    picks pairs (0,1),(2,3).. over halves.  cache_batch_idx maps sequences to cache entries (rows
    of block_table when paged); cache_leftpad marks where each sequence's keys start.  Returns out,
    or (out, softmax_lse) with return_softmax_lse.  num_splits: 0 picks a split count from the
    shapes alone, a fixed value gives batch-invariant results.  On CUDA nothing is read back to the
    host (a decode step can be captured in a CUDA graph); the index tensors' contents are checked
    in the kernel instead: a sequence whose cache_seqlens / cache_leftpad / cache_batch_idx is out
    of range gets NaN and no append, and an out-of-range block_table entry reads as NaN
    (TILEATTN_CHECK_CONTENTS=on reads them on the host and raises as the CPU backend does).

    Extra (keyword only, flash-attn 3's names): packed query rows, q (total_q, nheads, headdim)
    with cu_seqlens_q int32 (batch + 1,) and max_seqlen_q, as a serving engine batches decode
    steps of 0 to a few rows a sequence; each sequence's rows attend as a call with seqlen_q =
    their count would (masks bottom-right aligned to it).  out is (total_q, nheads, headdim) and
    softmax_lse (nheads, total_q).  Not with k/v to append or rotary.  Bad cu_seqlens_q contents
    raise on the CPU and make every output NaN on CUDA (unless TILEATTN_CHECK_CONTENTS=on).
    """
    plan = _kvcache_plan.signature(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
        cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
        rotary_interleaved, alibi_slopes, num_splits, cu_seqlens_q, max_seqlen_q)
    if plan is not None:
        outputs = _kvcache_plan.run(plan, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
                                    cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                                    alibi_slopes, cu_seqlens_q)
        if outputs is not None:
            return outputs if return_softmax_lse else outputs[0]
    check = Checker("flash_attn_with_kvcache")
    packed = cu_seqlens_q is not None
    if packed:
        check.dims(q, "q", 3, "(total_q, nheads, headdim) with cu_seqlens_q")
        given_cu = cu_seqlens_q
        cu_seqlens_q = check.cu_seqlens(cu_seqlens_q, "cu_seqlens_q", q.device)
        if cu_seqlens_q is not given_cu:
            plan = None  # the parameters would point at this call's contiguous copy
        if max_seqlen_q is None:
            check.fail(InvalidArgumentError, "max_seqlen_q", "is required with cu_seqlens_q")
        max_seqlen_q = check.seqlen(max_seqlen_q, "max_seqlen_q")  # the library lowers it to q's rows
        for name, x in (("k", k), ("rotary_cos", rotary_cos)):
            if x is not None:
                check.fail(InvalidArgumentError, name,
                           "cannot be given with packed query rows (cu_seqlens_q) yet")
    else:
        if max_seqlen_q is not None:
            check.fail(InvalidArgumentError, "max_seqlen_q", "is for packed query rows; give cu_seqlens_q too")
        check.dims(q, "q", 4, _BATCH_LAYOUT)
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        check.dims(x, name, 4, "(batch_cache, seqlen_cache, nheads_k, headdim) or (num_blocks, "
                   "page_size, nheads_k, headdim)")
        if x.stride(-1) != 1:
            check.fail(InvalidArgumentError, name, "must have a contiguous last dim (it is "
                       "written in place, so tileattn cannot copy it)")
    tensors = [("q", q), ("k_cache", k_cache), ("v_cache", v_cache)]
    if (k is None) != (v is None):
        check.fail(InvalidArgumentError, "k" if k is None else "v", "k and v must be given together")
    if k is not None:
        for name, x in (("k", k), ("v", v)):
            check.dims(x, name, 4, _BATCH_LAYOUT)
        tensors += [("k", k), ("v", v)]
        if k.shape[0] != q.shape[0] or k.shape[2:] != k_cache.shape[2:] or v.shape != k.shape:
            check.fail(InvalidArgumentError, "k", f"shape {tuple(k.shape)} must be (batch, "
                       f"seqlen_new, {k_cache.shape[2]}, {k_cache.shape[3]}) with q's batch "
                       f"{q.shape[0]}, and v's shape must match")
    if (rotary_cos is None) != (rotary_sin is None):
        check.fail(InvalidArgumentError, "rotary_sin" if rotary_sin is None else "rotary_cos",
                   "rotary_cos and rotary_sin must be given together")
    if rotary_cos is not None:
        check.tensor(rotary_cos, "rotary_cos")
        check.tensor(rotary_sin, "rotary_sin")
        tensors += [("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)]
        if rotary_cos.dim() != 2 or rotary_sin.shape != rotary_cos.shape:
            check.fail(InvalidArgumentError, "rotary_cos", "rotary_cos and rotary_sin must both "
                       f"be (seqlen_ro, rotary_dim / 2); got {tuple(rotary_cos.shape)} and "
                       f"{tuple(rotary_sin.shape)}")
        # The library takes a NULL table as "no rotary", and an empty tensor's data pointer is
        # NULL: an empty table would silently turn rotary off.
        if rotary_cos.numel() == 0:
            check.fail(InvalidArgumentError, "rotary_cos",
                       f"is empty (shape {tuple(rotary_cos.shape)}); give (seqlen_ro, rotary_dim / 2) "
                       "tables, or None for no rotary")
    check.dtype_and_device(tensors)
    check.heads(q, k_cache, v_cache, ("q", "k_cache", "v_cache"), seq_dim=0)
    batch = cu_seqlens_q.shape[0] - 1 if packed else q.shape[0]
    if cache_seqlens is None:
        check.fail(InvalidArgumentError, "cache_seqlens", "is required (int or (batch,) int32)")
    # An int goes to the library as one length for every sequence (no (batch,) tensor to fill:
    # on CUDA that was one more kernel a call, 14% of a 1 x 2k decode step in a CUDA graph).
    uniform_seqlen = -1
    if isinstance(cache_seqlens, int):
        check.int32(cache_seqlens, "cache_seqlens", 0)
        uniform_seqlen, cache_seqlens = cache_seqlens, None
    index_tensors = (("cache_seqlens", cache_seqlens, (batch,)),
                     ("cache_batch_idx", cache_batch_idx, (batch,)),
                     ("cache_leftpad", cache_leftpad, (batch,)),
                     ("block_table", block_table, None))
    for name, x, shape in index_tensors:
        if x is not None:
            check.int32_tensor(x, name, q.device, shape)
    if block_table is not None and (block_table.dim() != 2
                                    or (block_table.shape[1] > 1 and block_table.stride(1) != 1)):
        check.fail(InvalidArgumentError, "block_table",
                   f"must be a row-contiguous (batch, max_blocks) matrix, got {tuple(block_table.shape)}")
    # As for rotary tables: an empty block table's NULL data pointer would read as "not paged".
    if block_table is not None and block_table.numel() == 0 and batch > 0:
        check.fail(InvalidArgumentError, "block_table",
                   f"is empty (shape {tuple(block_table.shape)}) for {batch} sequences; a paged "
                   "cache needs a (batch, max_blocks) table with max_blocks >= 1")
    given = (cache_seqlens, cache_batch_idx, cache_leftpad)
    cache_seqlens, cache_batch_idx, cache_leftpad = (
        None if x is None else x.contiguous() for x in given)
    if any(a is not b for a, b in zip(given, (cache_seqlens, cache_batch_idx, cache_leftpad))):
        plan = None  # the parameters would point at this call's copies
    _, scale, left, right, softcap = _options(check, q, 0.0, softmax_scale, causal, window_size, softcap)
    alibi_slopes = check.alibi(alibi_slopes, batch, q.shape[-2], q.device)
    check.int32(num_splits, "num_splits", 0)
    out, lse = _kvcache_ops.call_kvcache_fwd(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
        cache_leftpad, block_table, scale, left, right, softcap, bool(rotary_interleaved),
        alibi_slopes, num_splits, cu_seqlens_q, max_seqlen_q or 0, None, None, 0, uniform_seqlen,
        on_success=None if plan is None else lambda params, lse: _kvcache_plan.store(plan, params, lse))
    return (out, lse) if return_softmax_lse else out
