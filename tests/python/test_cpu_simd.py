"""The CPU backend's float32 tile products on AVX-512 or AVX2 (src/cpu/simd_*), chosen on every call
by TILEATTN_CPU_SIMD (auto: AVX-512F where the CPU has it, else AVX2; avx2: the AVX2 kernels, which
an AVX-512 host runs too; off: OpenBLAS's sgemm, the path of CPUs with neither).  They take float32
and float16 calls, and bf16 ones where AMX is off or missing.  The rest of the suite runs on the
path the host takes, and scripts/test.sh runs the core numeric files again with AMX and SIMD off.  Here: both paths against float64, forward and backward, with
a partial 6-row block, 16-float vector and 64-column panel in every product (head dims 8, 72 and
256, key spans that start inside a key tile under a window), KV-cache prefill chunks and decode
steps, and the switch's error."""

import pytest
import torch

import tileattn
from conftest import cpu_switch_takes
from test_attention import MASKS, run_and_compare
from test_cpu_amx import DECODE_CASES, PREFILL_CASES
from test_kvcache import DEFAULTS, check_against_reference, make_problem
from tileattn import flash_attn_func

AVX2 = cpu_switch_takes("TILEATTN_CPU_SIMD", "avx2")
PATHS = ["auto", "avx2", "off"]
SHAPES = [(1, 1, 1, 1, 1, 8), (2, 17, 127, 7, 1, 64), (1, 300, 1000, 2, 2, 72), (1, 257, 333, 2, 1, 256)]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mask", ["none", "window", "causal_window"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_float32_product_paths_hold_the_rule(monkeypatch, path, mask, dtype, shape):
    if path == "avx2" and not AVX2:
        pytest.skip("this CPU has no AVX2 with FMA")
    monkeypatch.setenv("TILEATTN_CPU_SIMD", path)
    monkeypatch.setenv("TILEATTN_CPU_AMX", "off")  # bf16 on float32 tiles too
    causal, window = MASKS[mask]
    run_and_compare("cpu", dtype, shape, causal=causal, window_size=window)


# flash_attn_with_kvcache lays K/V out once for 64 query rows a sequence or more (a chunk of
# prefill): contiguous and paged caches, cache_batch_idx, leftpad, rotary, window, softcap, ALiBi.
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("case", PREFILL_CASES)
def test_kvcache_prefill_on_each_path_holds_the_rule(monkeypatch, path, dtype, case):
    if path == "avx2" and not AVX2:
        pytest.skip("this CPU has no AVX2 with FMA")
    monkeypatch.setenv("TILEATTN_CPU_SIMD", path)
    opts = dict(DEFAULTS, **PREFILL_CASES[case])
    args, slot, first = make_problem(opts, dtype, "cpu")
    out, lse = tileattn.flash_attn_with_kvcache(**args)
    check_against_reference(opts, dtype, args, slot, first, out, lse)


# A decode step on any cache, contiguous or paged, takes the few-row kernels,
# reading its fp32, fp16 or bf16 rows in place (cache_seqlens 0, 17 and 506 leave partial key tiles
# and, in pages of 16 and 64, tiles that cross pages; d72 a partial vector, 3 new tokens x 2 heads a
# partial group of 4 rows; one and two KV heads).  bf16 with AMX off, as on CPUs without it.
FEW_ROW_CASES = {**DECODE_CASES,
                 "contiguous_d72_three_tokens": dict(dim=72, heads=8, heads_k=4, seqlen_q=3, seqlen_new=3, causal=True),
                 "paged16_leftpad_four_kv_heads": dict(page_size=16, leftpad=True, heads=8, heads_k=4),
                 "paged64_batch_idx_d72_causal": dict(page_size=64, batch_idx=True, dim=72, heads=12, heads_k=3,
                                                      causal=True)}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", FEW_ROW_CASES)
def test_kvcache_decode_on_each_path_holds_the_rule(monkeypatch, path, dtype, case):
    if path == "avx2" and not AVX2:
        pytest.skip("this CPU has no AVX2 with FMA")
    monkeypatch.setenv("TILEATTN_CPU_SIMD", path)
    monkeypatch.setenv("TILEATTN_CPU_AMX", "off")
    opts = dict(DEFAULTS, **FEW_ROW_CASES[case])
    args, slot, first = make_problem(opts, dtype, "cpu")
    out, lse = tileattn.flash_attn_with_kvcache(**args)
    check_against_reference(opts, dtype, args, slot, first, out, lse)


def test_unknown_value_is_an_error(monkeypatch):
    monkeypatch.setenv("TILEATTN_CPU_SIMD", "avx512")
    x = torch.randn(1, 8, 1, 16)
    with pytest.raises(ValueError) as raised:
        flash_attn_func(x, x, x)
    assert raised.value.argument == "TILEATTN_CPU_SIMD"
