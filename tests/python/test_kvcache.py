"""flash_attn_with_kvcache: append (rotary) into contiguous and paged caches, attention over the
cache against float64 with FA's rule.  Unused cache slots hold NaN, so a read of one shows.
The CUDA decode kernel does not exist yet: on CUDA the call must raise, not misbehave."""

import math

import pytest
import torch

import tileattn
from attn_reference import attention
from conftest import FLOOR, assert_fa_close


def rotary_tables(positions, rotary_dim, dtype):
    inv = 10000.0 ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angles = torch.arange(positions, dtype=torch.float64)[:, None] * inv[None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x, cos, sin, positions, interleaved):
    """x (S, H, D) float64 rotated at positions (S,)."""
    half = cos.shape[1]
    c, s = cos[positions].double()[:, None, :], sin[positions].double()[:, None, :]
    x = x.clone()
    if interleaved:
        x0, x1 = x[..., 0:2 * half:2].clone(), x[..., 1:2 * half:2].clone()
        x[..., 0:2 * half:2], x[..., 1:2 * half:2] = x0 * c - x1 * s, x0 * s + x1 * c
    else:
        x0, x1 = x[..., :half].clone(), x[..., half:2 * half].clone()
        x[..., :half], x[..., half:2 * half] = x0 * c - x1 * s, x0 * s + x1 * c
    return x


CASES = {
    "contiguous": dict(),
    "paged16_rotary": dict(page_size=16, rotary_dim=32, causal=True, seqlen_new=3),
    "paged64_halves_batch_idx": dict(page_size=64, rotary_dim=64, interleaved=False,
                                     batch_idx=True, seqlen_new=2),
    "paged256_leftpad": dict(page_size=256, leftpad=True),
    "window_softcap_alibi": dict(window=(40, 0), softcap=10.0, alibi=True, seqlen_new=4),
    "no_append": dict(seqlen_new=0),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kvcache(case, dtype):
    opts = dict(page_size=0, rotary_dim=0, interleaved=True, batch_idx=False, leftpad=False,
                causal=False, seqlen_new=1, window=(-1, -1), softcap=0.0, alibi=False)
    opts.update(CASES[case])
    batch, heads, heads_k, dim, capacity = 3, 8, 2, 64, 512
    seqlen_new = opts["seqlen_new"]
    seqlen_q = max(seqlen_new, 1)
    cache_seqlens = torch.tensor([0, 17, capacity - seqlen_new - 5], dtype=torch.int32)
    page = opts["page_size"]
    entries = batch + 2 if opts["batch_idx"] else batch
    if page:
        max_blocks = capacity // page
        num_blocks = entries * max_blocks + 3
        k_cache = torch.full((num_blocks, page, heads_k, dim), math.nan, dtype=dtype)
        block_table = torch.randperm(num_blocks, dtype=torch.int32)[:entries * max_blocks]
        block_table = block_table.view(entries, max_blocks)
    else:
        k_cache = torch.full((entries, capacity, heads_k, dim), math.nan, dtype=dtype)
        block_table = None
    v_cache = k_cache.clone()
    batch_idx = torch.randperm(entries, dtype=torch.int32)[:batch] if opts["batch_idx"] else None
    leftpad = (cache_seqlens // 3).to(torch.int32) if opts["leftpad"] else None

    def slot(b, pos):
        row = int(batch_idx[b]) if batch_idx is not None else b
        if block_table is None:
            return (row, pos)
        return (int(block_table[row, pos // page]), pos % page)

    first = [int(leftpad[b]) if leftpad is not None else 0 for b in range(batch)]
    for b in range(batch):
        for pos in range(first[b], int(cache_seqlens[b])):
            k_cache[slot(b, pos)] = torch.randn(heads_k, dim).to(dtype)
            v_cache[slot(b, pos)] = torch.randn(heads_k, dim).to(dtype)
    q = torch.randn(batch, seqlen_q, heads, dim).to(dtype)
    k = torch.randn(batch, seqlen_new, heads_k, dim).to(dtype) if seqlen_new else None
    v = torch.randn(batch, seqlen_new, heads_k, dim).to(dtype) if seqlen_new else None
    cos = sin = None
    if opts["rotary_dim"]:
        cos, sin = rotary_tables(capacity + seqlen_q, opts["rotary_dim"], dtype)
    slopes = torch.rand(heads, dtype=torch.float32) if opts["alibi"] else None
    left, right = opts["window"]
    out, lse = tileattn.flash_attn_with_kvcache(
        q, k_cache, v_cache, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=cache_seqlens,
        cache_batch_idx=batch_idx, cache_leftpad=leftpad, block_table=block_table,
        causal=opts["causal"], window_size=opts["window"], softcap=opts["softcap"],
        rotary_interleaved=opts["interleaved"], alibi_slopes=slopes, return_softmax_lse=True)

    right = 0 if opts["causal"] else right
    per_row = opts["causal"] or left >= 0 or right >= 0
    for b in range(batch):
        start = int(cache_seqlens[b])
        for i in range(seqlen_new):  # the appended entries
            expect = k[b, i:i + 1].double()
            if cos is not None:
                expect = rotate(expect, cos, sin, torch.tensor([start + i]), opts["interleaved"])
            got_k, got_v = k_cache[slot(b, start + i)].double(), v_cache[slot(b, start + i)]
            tol = 2e-2 if dtype == torch.bfloat16 else 2e-3
            assert torch.allclose(got_k, expect[0], atol=tol, rtol=tol), f"k_cache b{b} i{i}"
            assert torch.equal(got_v, v[b, i]), f"v_cache b{b} i{i}"
        end = start + seqlen_new
        keys = torch.stack([k_cache[slot(b, pos)] for pos in range(first[b], end)]) \
            if end > first[b] else k_cache.new_zeros(0, heads_k, dim)
        values = torch.stack([v_cache[slot(b, pos)] for pos in range(first[b], end)]) \
            if end > first[b] else v_cache.new_zeros(0, heads_k, dim)
        qb = q[b].double()
        if cos is not None:
            positions = start + (torch.arange(seqlen_q) if per_row else torch.zeros(seqlen_q, dtype=torch.long))
            qb = rotate(qb, cos, sin, positions, opts["interleaved"])
        kw = dict(window_left=left, window_right=right, softcap=opts["softcap"],
                  alibi_slopes=slopes)
        truth = attention(qb[None], keys[None], values[None], dtype=torch.float64, **kw)
        naive = attention(qb.to(dtype)[None], keys[None], values[None], dtype=dtype, **kw)
        assert_fa_close(f"b{b} out", out[b:b + 1], naive["out"], truth["out"], FLOOR[dtype])
        assert_fa_close(f"b{b} lse", lse[b:b + 1], naive["lse"], truth["lse"], FLOOR[dtype])


def test_kvcache_compiles_fullgraph():
    q = torch.randn(2, 1, 4, 32, dtype=torch.bfloat16)
    k_cache = torch.randn(2, 64, 2, 32, dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    k, v = torch.randn(2, 1, 2, 32, dtype=torch.bfloat16), torch.randn(2, 1, 2, 32, dtype=torch.bfloat16)
    seqlens = torch.tensor([3, 40], dtype=torch.int32)

    def step(q, k_cache, v_cache, k, v, seqlens):
        return tileattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=seqlens,
                                                causal=True)

    eager_cache = (k_cache.clone(), v_cache.clone())
    expect = step(q, *eager_cache, k, v, seqlens)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    got = compiled(q, k_cache, v_cache, k, v, seqlens)
    assert torch.equal(got, expect)
    assert torch.equal(k_cache, eager_cache[0]) and torch.equal(v_cache, eager_cache[1])


@pytest.mark.parametrize("breaks, argument", [
    (lambda a: a.update(cache_seqlens=torch.tensor([1, 2], dtype=torch.int64)), "cache_seqlens"),
    (lambda a: a.update(cache_seqlens=torch.tensor([1, 70], dtype=torch.int32)), "cache_seqlens"),
    (lambda a: a.update(k=None), "v"),
    (lambda a: a.update(block_table=torch.full((2, 4), 7, dtype=torch.int32)), "block_table"),
    (lambda a: a.update(rotary_cos=torch.zeros(80, 8, dtype=torch.bfloat16)), "rotary_sin"),
    (lambda a: a.update(cache_batch_idx=torch.tensor([0, 5], dtype=torch.int32)), "cache_batch_idx"),
])
def test_kvcache_bad_input(breaks, argument):
    args = dict(q=torch.randn(2, 1, 4, 32, dtype=torch.bfloat16),
                k_cache=torch.randn(2, 64, 2, 32, dtype=torch.bfloat16),
                v_cache=torch.randn(2, 64, 2, 32, dtype=torch.bfloat16),
                k=torch.randn(2, 1, 2, 32, dtype=torch.bfloat16),
                v=torch.randn(2, 1, 2, 32, dtype=torch.bfloat16),
                cache_seqlens=torch.tensor([3, 40], dtype=torch.int32))
    breaks(args)
    with pytest.raises((ValueError, TypeError, RuntimeError)) as info:
        tileattn.flash_attn_with_kvcache(**args)
    assert argument in str(info.value)


@pytest.mark.skipif(not (torch.cuda.is_available() and tileattn.has_cuda()), reason="needs CUDA")
def test_kvcache_cuda_raises_until_the_decode_kernel_lands():
    q = torch.randn(1, 1, 4, 32, dtype=torch.bfloat16, device="cuda")
    cache = torch.randn(1, 16, 2, 32, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(RuntimeError, match="CPU backend only"):
        tileattn.flash_attn_with_kvcache(q, cache, cache.clone(), cache_seqlens=3)
