"""flash_attn_func and flash_attn_varlen_func with few query rows a sequence (a decode step, a few
speculative tokens, passing the whole K/V) run on the CPU as the KV-cache decode does: a KV group's
query heads as rows of their KV head, token-major, each token's heads under its mask, K and V read
in place by the decode's products (src/cpu/kv_group_rows.cpp).  Against float64 with
FlashAttention's rule: out and the LSE (from the custom op, which returns it without the
probabilities; asking for those keeps the general path) and the gradients autograd takes from
them.  Every product path (AMX, AVX512-BF16's dot products, the SIMD few-row kernels on AVX-512 and
AVX2, sgemm), groups of 1
to 16 query heads, 1 to 9 tokens (up to 63 rows a group, and 70: the general path), more tokens
than keys (rows that see none), odd key counts, head dims with partial vectors, causal masks, left
and right windows and softcap; in varlen form, sequences of no query row and of no key, and
seqused_k."""

import pytest
import torch

import attn_reference as ref
from conftest import FLOOR, assert_fa_close, cpu_switch_takes
from tileattn import flash_attn_func

AMX = cpu_switch_takes("TILEATTN_CPU_AMX", "on", torch.bfloat16)
DOT = cpu_switch_takes("TILEATTN_CPU_AMX", "dot", torch.bfloat16)
AVX2 = cpu_switch_takes("TILEATTN_CPU_SIMD", "avx2")
# name: (TILEATTN_CPU_AMX, TILEATTN_CPU_SIMD)
PATHS = {"amx": ("on", "auto"), "dot": ("dot", "auto"), "simd": ("off", "auto"), "avx2": ("off", "avx2"),
         "sgemm": ("off", "off")}
# (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim)
SHAPES = [(1, 1, 1, 1, 1, 32), (2, 1, 17, 7, 1, 64), (3, 1, 127, 12, 3, 72), (2, 1, 1000, 8, 2, 128),
          (1, 2, 300, 16, 4, 256), (2, 4, 17, 8, 2, 64), (1, 3, 127, 12, 3, 72), (2, 9, 5, 7, 1, 64),
          (1, 10, 300, 7, 1, 32)]
# name: (causal, window_size, softcap)
MASKS = {"none": (False, (-1, -1), 0.0), "causal": (True, (-1, -1), 0.0), "right_window_softcap": (False, (-1, 3), 5.0),
         "causal_left_window": (True, (6, -1), 0.0)}


def take_path(monkeypatch, path, dtype):
    amx, simd = PATHS[path]
    if amx == "on" and (dtype != torch.bfloat16 or not AMX):
        pytest.skip("AMX takes bf16 calls, on CPUs that offer it")
    if amx == "dot" and (dtype != torch.bfloat16 or not DOT):
        pytest.skip("AVX512-BF16's dot products take bf16 calls, on CPUs that offer them")
    if simd == "avx2" and not AVX2:
        pytest.skip("this CPU has no AVX2 with FMA")
    monkeypatch.setenv("TILEATTN_CPU_AMX", amx)
    monkeypatch.setenv("TILEATTN_CPU_SIMD", simd)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_few_query_rows_hold_the_rule(monkeypatch, path, mask, dtype, shape):
    take_path(monkeypatch, path, dtype)
    batch, seqlen_q, seqlen_k, heads, heads_k, dim = shape
    causal, window, softcap = MASKS[mask]
    q = torch.randn(batch, seqlen_q, heads, dim, dtype=dtype, requires_grad=True)
    k = torch.randn(batch, seqlen_k, heads_k, dim, dtype=dtype, requires_grad=True)
    v = torch.randn(batch, seqlen_k, heads_k, dim, dtype=dtype, requires_grad=True)
    dout = torch.randn(batch, seqlen_q, heads, dim, dtype=dtype)
    scale = dim ** -0.5
    right = 0 if causal else window[1]
    out = flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, window_size=window, softcap=softcap)
    out.backward(dout)
    with torch.no_grad():
        again, lse, _, _ = torch.ops.tileattn.fwd(q, k, v, 0.0, scale, window[0], right, softcap, None, False, False)
    assert torch.equal(again, out)

    options = dict(softmax_scale=scale, window_left=window[0], window_right=right, softcap=softcap)
    assert_call_holds_the_rule(q, k, v, dout, out, lse, options)


def assert_call_holds_the_rule(q, k, v, dout, out, lse, options):
    """out, lse and q/k/v's gradients (from out.backward(dout)) against float64, FA's rule."""
    truth = ref.attention(q, k, v, dout, dtype=torch.float64, **options)
    naive = ref.attention(q, k, v, dout, dtype=q.dtype, **options)
    floor = FLOOR[q.dtype]
    assert_fa_close("out", out, naive["out"], truth["out"], floor)
    assert_fa_close("lse", lse, naive["lse"], truth["lse"], floor)
    shift = ref.backward_rounding_shift(q, k, v, dout, out, truth["out"], **options)
    for name, ours in (("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
        assert_fa_close(name, ours, naive[name], truth[name], floor, lse=truth["lse"], shift=shift.get(name))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("heads,heads_k", [(7, 1), (8, 4)])
@pytest.mark.parametrize("used", [False, True], ids=["all_keys", "seqused_k"])
def test_varlen_few_query_rows_hold_the_rule(monkeypatch, path, dtype, heads, heads_k, used):
    take_path(monkeypatch, path, dtype)
    seqlens_q, seqlens_k = [1, 0, 3, 2, 4], [17, 5, 0, 1000, 128]
    dim, scale = 72, 72 ** -0.5
    cu_q = torch.tensor([0] + seqlens_q, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    cu_k = torch.tensor([0] + seqlens_k, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    seqused_k = torch.tensor([9, 5, 0, 999, 128], dtype=torch.int32) if used else None
    q = torch.randn(int(cu_q[-1]) + 2, heads, dim, dtype=dtype)  # 2 rows past the last sequence
    k, v = (torch.randn(int(cu_k[-1]), heads_k, dim, dtype=dtype) for _ in range(2))
    out, lse, _, _ = torch.ops.tileattn.varlen_fwd(q, k, v, cu_q, cu_k, seqused_k, max(seqlens_q), max(seqlens_k),
                                                   0.0, scale, -1, 0, 0.0, None, False, False)
    floor = FLOOR[dtype]
    for b, (len_q, len_k) in enumerate(zip(seqlens_q, seqlens_k)):
        if len_q == 0:
            continue
        rows, first = slice(int(cu_q[b]), int(cu_q[b]) + len_q), int(cu_k[b])
        keys = slice(first, first + (int(seqused_k[b]) if used else len_k))
        if keys.stop == keys.start:
            assert torch.all(out[rows] == 0) and torch.all(lse[:, rows] == float("inf")), f"sequence {b}: no keys"
            continue
        causal = dict(softmax_scale=scale, window_right=0)
        args = (q[rows][None], k[keys][None], v[keys][None])
        truth = ref.attention(*args, dtype=torch.float64, **causal)
        naive = ref.attention(*args, dtype=dtype, **causal)
        assert_fa_close(f"out of sequence {b}", out[rows][None], naive["out"], truth["out"], floor)
        assert_fa_close(f"lse of sequence {b}", lse[:, rows][None], naive["lse"], truth["lse"], floor)
