"""Scores that rise from key block to key block, far past what random inputs give.

The sm90 forward walks a tile's key blocks from the last one down and takes each block's exps
against a reference that moves only when a probability reaches 2^8 (src/cuda/sm90/softmax_sm90.h):
by a power of two while the exps stayed finite, and through the block's scores recomputed from
global memory when one overflowed (a score at least 128 / (scale * log2 e) above the reference).
Random inputs reach neither: a row's first block sets a reference within a few units of its running
max.  These inputs do, in every block: q[..., 0] = +-16 and a ramp in k[..., 0] raise the scores of
half the rows by ~60 log2 units from the last key to the first (a jump of ~8 every block or two),
and q[..., 1] = 16 against k[..., 1] = 128 on the first 100 keys lifts a random half of the rows
by 2048 (185-369 log2 units, d256 to d64) on the block visited last.

Forward only: the backward recomputes P from the saved LSE and never sees the reference.  The
naive computation the rule compares with takes the scores and the softmax in float32 and rounds P
and O to the inputs' precision, as the kernels do: one in bf16 throughout would round scores of
2048 to steps of 8 and excuse any error."""

import pytest
import torch

import attn_reference as ref
from conftest import FLOOR, assert_fa_close, dtypes_for, rand
from tileattn import flash_attn_func, flash_attn_with_kvcache


def rising_scores(batch, seqlen_q, seqlen_k, num_heads, num_heads_k, head_dim, dtype, device):
    q = rand(batch, seqlen_q, num_heads, head_dim, dtype=dtype, device=device)
    k = rand(batch, seqlen_k, num_heads_k, head_dim, dtype=dtype, device=device)
    v = rand(batch, seqlen_k, num_heads_k, head_dim, dtype=dtype, device=device)
    # Ramp: 60 log2 units of scaled score over the keys for rows with q[..., 0] = +16.
    ramp_top = 60.0 * head_dim ** 0.5 / 1.4426950408889634 / 16.0
    ramp = ramp_top * (1.0 - torch.arange(seqlen_k, device=device, dtype=torch.float32) / seqlen_k)
    k[:, :, :, 0] = ramp.to(dtype)[None, :, None]
    signs = torch.randint(0, 2, (batch, seqlen_q, num_heads), device=device) * 2 - 1
    q[..., 0] = (16.0 * signs).to(dtype)
    # Jump: +2048 raw on keys 0-99 for a random half of the rows.
    k[:, :, :, 1] = 0
    k[:, :100, :, 1] = 128.0
    q[..., 1] = (16.0 * torch.randint(0, 2, (batch, seqlen_q, num_heads), device=device)).to(dtype)
    return q, k, v


def naive_with_rounded_probs(q, k, v, **options):
    """(out, lse): float32 scores and softmax, P rounded to q's dtype before P V, O rounded."""
    exact32 = ref.attention(q, k, v, dtype=torch.float32, **options)
    vv = v.float().repeat_interleave(q.shape[2] // k.shape[2], dim=2)
    out = torch.einsum("bhqk,bkhd->bqhd", exact32["probs"].to(q.dtype).float(), vv)
    return out.to(q.dtype), exact32["lse"]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_scores_rising_toward_the_first_keys(device, head_dim, causal):
    check_rising_scores(device, (2, 300, 1000, 4, 2, head_dim), causal=causal)


def test_rising_scores_through_a_softcap(device):
    """The transformed-scores kernels: a cap of 200 bends the jump's 181 scaled units to 120-160
    and still overflows the exps of about half of the rows (so their recomputed scores go through
    tanh again); the ramp still moves the reference along the way."""
    check_rising_scores(device, (2, 300, 1000, 4, 2, 128), causal=True, softcap=200.0)


def check_rising_scores(device, shape, *, causal, softcap=0.0):
    for dtype in dtypes_for(device):
        q, k, v = rising_scores(*shape, dtype, device)
        out, lse, _ = flash_attn_func(q, k, v, causal=causal, softcap=softcap, return_attn_probs=True)
        assert_rising_scores_close(q, k, v, out, lse, causal=causal, softcap=softcap)


def assert_rising_scores_close(q, k, v, out, lse, *, causal, softcap=0.0):
    options = dict(window_left=-1, window_right=0 if causal else -1, softcap=softcap)
    truth = ref.attention(q, k, v, dtype=torch.float64, **options)
    naive_out, naive_lse = naive_with_rounded_probs(q, k, v, **options)
    floor = FLOOR[q.dtype]
    assert_fa_close("out", out, naive_out, truth["out"], floor)
    # The LSE reaches ~300 here: float32 steps of 3e-5 there, a few of them for any order of the sums.
    lse_floor = floor + 8 * 2.0 ** -24 * truth["lse"].abs().max().item()
    assert_fa_close("lse", lse, naive_lse, truth["lse"], lse_floor)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="cache entries and pages on the KV-cache route: the sm90 forward family")
@pytest.mark.parametrize("pack", ["off", "on"])
@pytest.mark.parametrize("layout", ["batch_idx", "page16", "page256"])
def test_rising_scores_on_the_kvcache_route(layout, pack, monkeypatch):
    """flash_attn_with_kvcache's many-row calls on the forward kernels, whose keys lie in cache
    entries (cache_batch_idx) or pages: a block whose exps overflowed recomputes its scores from
    the keys where they lie, the entry or the page, not from the sequence's own batch row.  64
    rows over 1000 cached keys, causal, with each KV group's heads packed into the rows or not;
    the slots past the keys hold NaN."""
    monkeypatch.setenv("TILEATTN_KVCACHE_FORWARD", "on")
    monkeypatch.setenv("TILEATTN_KVCACHE_PACK_GQA", pack)
    batch, rows, keys, capacity, heads, heads_k, dim = 2, 64, 1000, 1024, 8, 2, 128
    q, k, v = rising_scores(batch, rows, keys, heads, heads_k, dim, torch.bfloat16, "cuda")
    padded = [torch.full((batch, capacity, heads_k, dim), float("nan"), dtype=q.dtype, device="cuda")
              for _ in range(2)]
    padded[0][:, :keys], padded[1][:, :keys] = k, v
    if layout == "batch_idx":
        entries = torch.tensor([2, 0], dtype=torch.int32, device="cuda")
        caches = [torch.full((3,) + x.shape[1:], float("nan"), dtype=q.dtype, device="cuda") for x in padded]
        for cache, x in zip(caches, padded):
            cache[entries.long()] = x
        index = dict(cache_batch_idx=entries)
    else:
        page = int(layout[4:])
        pages = capacity // page
        table = torch.randperm(batch * pages + 3, device="cuda")[:batch * pages].view(batch, pages)
        caches = [torch.full((batch * pages + 3, page, heads_k, dim), float("nan"), dtype=q.dtype, device="cuda")
                  for _ in padded]
        for cache, x in zip(caches, padded):
            cache[table] = x.view(batch, pages, page, heads_k, dim)
        index = dict(block_table=table.to(torch.int32))
    seqlens = torch.full((batch,), keys, dtype=torch.int32, device="cuda")
    out, lse = flash_attn_with_kvcache(q, caches[0], caches[1], cache_seqlens=seqlens, causal=True,
                                       return_softmax_lse=True, **index)
    assert_rising_scores_close(q, k, v, out, lse, causal=True)
