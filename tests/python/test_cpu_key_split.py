"""The CPU forward's key split (src/cpu/cpu_forward.cpp, plan_tiles): a query tile of at most 64
rows whose visible keys run past 2048 is computed as runs of 2048 keys, one task each, merged
through their row max and sum.  Against float64 with FlashAttention's rule: out, the LSE (from the
custom op) and the gradients the backward takes from that LSE, for spans of 2049 keys (a run of
one key) and more; masks whose rows see only some runs (a left window: most runs see nothing of a
row) or start inside one; GQA as rows (one query row) and as heads (a few rows); every product
path; tiles of 64 rows (split) and 65 (not); and through flash_attn_with_kvcache on pages."""

import pytest
import torch

import tileattn
from test_cpu_kv_group_rows import PATHS as GROUP_ROW_PATHS
from test_cpu_kv_group_rows import assert_call_holds_the_rule, take_path
from test_kvcache import DEFAULTS, check_against_reference, make_problem
from tileattn import flash_attn_func

PATHS = {name: GROUP_ROW_PATHS[name] for name in ("amx", "simd", "sgemm")}
# (seqlen_q, seqlen_k, nheads, nheads_k, headdim)
SHAPES = [(1, 2049, 7, 1, 64), (3, 4113, 4, 2, 72), (64, 2500, 2, 1, 64), (65, 2500, 2, 1, 32), (1, 9000, 8, 8, 128)]
# name: (causal, window_size, softcap, alibi)
MASKS = {"none": (False, (-1, -1), 0.0, False), "causal": (True, (-1, -1), 0.0, False),
         "left_window": (False, (100, 0), 0.0, False), "wide_window_softcap": (False, (3000, 3000), 4.0, False),
         "causal_alibi": (True, (-1, -1), 0.0, True)}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_split_keys_hold_the_rule(monkeypatch, path, mask, dtype, shape):
    take_path(monkeypatch, path, dtype)
    seqlen_q, seqlen_k, heads, heads_k, dim = shape
    causal, window, softcap, alibi = MASKS[mask]
    q = torch.randn(1, seqlen_q, heads, dim, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(1, seqlen_k, heads_k, dim, dtype=dtype, requires_grad=True) for _ in range(2))
    dout = torch.randn(1, seqlen_q, heads, dim, dtype=dtype)
    slopes = torch.rand(heads) * 0.01 if alibi else None
    scale, right = dim ** -0.5, 0 if causal else window[1]
    out = flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, window_size=window, softcap=softcap,
                          alibi_slopes=slopes)
    out.backward(dout)
    with torch.no_grad():
        again, lse, _, _ = torch.ops.tileattn.fwd(q, k, v, 0.0, scale, window[0], right, softcap, slopes, False,
                                                  False)
    assert torch.equal(again, out)

    options = dict(softmax_scale=scale, window_left=window[0], window_right=right, softcap=softcap,
                   alibi_slopes=slopes)
    assert_call_holds_the_rule(q, k, v, dout, out, lse, options)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("page_size", [0, 16], ids=["contiguous", "page16"])
def test_kvcache_decode_over_split_keys(monkeypatch, path, page_size):
    take_path(monkeypatch, path, torch.bfloat16)
    opts = dict(DEFAULTS, page_size=page_size, heads=8, heads_k=4, leftpad=True, causal=True)
    seqlens = torch.tensor([0, 2047, 4100, 6500], dtype=torch.int32)  # visible keys 0, 1366, 2735, 4334
    args, slot, first = make_problem(opts, torch.bfloat16, "cpu", batch=4, capacity=6656, cache_seqlens=seqlens)
    out, lse = tileattn.flash_attn_with_kvcache(**args)
    check_against_reference(opts, torch.bfloat16, args, slot, first, out, lse)
