"""The CPU backend's bfloat16 products on bf16 operands, on AMX's tiles (src/cpu/amx_bf16.*) or
AVX512-BF16's dot products (src/cpu/bf16_dot_product.*), chosen on every call by TILEATTN_CPU_AMX
(auto: the tiles where the CPU and OS offer them, else the dot products where the CPU has them; off:
float32 products on float32 copies; on: the tiles or an error; dot: the dot products or an error).
The rest of the suite runs bf16 CPU calls on the path the host takes, and scripts/test.sh runs the
core numeric files again with it off, so a host with either engine tests both paths.  Here: each
path against float64 with the tiles' padding exercised in every dimension (rows, head dims that are
not multiples of 16 or 32, key spans that start inside a key tile), the engine auto takes giving
the same bits as naming it, and the switch's errors."""

import pytest
import torch

import tileattn
from conftest import cpu_switch_takes
from test_attention import MASKS, run_and_compare
from test_kvcache import DEFAULTS, check_against_reference, make_problem
from tileattn import flash_attn_func


AMX = cpu_switch_takes("TILEATTN_CPU_AMX", "on", torch.bfloat16)
DOT = cpu_switch_takes("TILEATTN_CPU_AMX", "dot", torch.bfloat16)
PRESENT = {"off": True, "on": AMX, "dot": DOT}


def take_path(monkeypatch, path):
    if not PRESENT[path]:
        pytest.skip(f"TILEATTN_CPU_AMX={path}: this CPU or OS lacks its instructions")
    monkeypatch.setenv("TILEATTN_CPU_AMX", path)
SHAPES = [(1, 1, 1, 1, 1, 8), (2, 17, 127, 4, 2, 64), (1, 300, 1000, 7, 1, 72), (1, 1000, 333, 2, 2, 256)]


@pytest.mark.parametrize("path", ["off", "on", "dot"])
@pytest.mark.parametrize("mask", ["none", "window", "causal_window"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_product_path_holds_the_rule(monkeypatch, path, mask, shape):
    take_path(monkeypatch, path)
    causal, window = MASKS[mask]
    run_and_compare("cpu", torch.bfloat16, shape, causal=causal, window_size=window)


# flash_attn_with_kvcache takes AMX's products in two ways (cpu_kvcache.cpp).  With 64 query rows
# a sequence or more (a chunk of prefill), K/V packed once, read in place or gathered:
PREFILL_CASES = {
    "contiguous_causal": dict(seqlen_new=80, causal=True),
    "paged16_rotary": dict(page_size=16, rotary_dim=32, causal=True, seqlen_new=70),
    "paged64_batch_idx_leftpad": dict(page_size=64, batch_idx=True, leftpad=True, seqlen_new=64),
    "window_softcap_alibi": dict(window=(40, 0), softcap=10.0, alibi=True, seqlen_new=100),
    "d72_gqa7_no_append": dict(dim=72, heads=7, heads_k=1, seqlen_new=0, seqlen_q=65, causal=True),
}

# A decode step on a bf16 cache with a head dim that is a multiple of 32 reads K and V in place
# (amx_cache_tiles.h) from 5 rows a KV group on AMX, from 17 on the dot products (32 and 24 below):
# 16-key groups straight from the cache, copied where a group is short (cache lengths 0, 17, 506) or
# crosses a page (leftpad on pages of 16).
DECODE_CASES = {
    "contiguous_d128_gqa4": dict(dim=128, heads=16, heads_k=4),
    "paged16_leftpad_d64": dict(page_size=16, leftpad=True),
    "paged64_batch_idx_d256_causal": dict(page_size=64, batch_idx=True, dim=256, causal=True),
    "contiguous_two_rows_rotary": dict(seqlen_q=2, seqlen_new=2, rotary_dim=32, causal=True, heads=2, heads_k=2),
    "mqa8_softcap_paged256": dict(heads=8, heads_k=1, softcap=5.0, page_size=256, dim=96),
    "mqa32_paged16_leftpad_d128": dict(heads=32, heads_k=1, page_size=16, leftpad=True, dim=128),
    "three_rows_gqa8_causal_d64": dict(seqlen_q=3, seqlen_new=3, heads=16, heads_k=2, causal=True),
}


@pytest.mark.parametrize("path", ["off", "on", "dot"])
@pytest.mark.parametrize("case", [*PREFILL_CASES, *DECODE_CASES])
def test_kvcache_calls_hold_the_rule(monkeypatch, path, case):
    take_path(monkeypatch, path)
    opts = dict(DEFAULTS, **{**PREFILL_CASES, **DECODE_CASES}[case])
    args, slot, first = make_problem(opts, torch.bfloat16, "cpu")
    out, lse = tileattn.flash_attn_with_kvcache(**args)
    check_against_reference(opts, torch.bfloat16, args, slot, first, out, lse)


@pytest.mark.parametrize("path", ["on", "dot"])
def test_an_engine_named_gives_the_bits_of_auto_or_raises(monkeypatch, path):
    q, k, v = (torch.randn(2, 200, 4, 64, dtype=torch.bfloat16) for _ in range(3))
    auto = flash_attn_func(q, k, v, causal=True)
    monkeypatch.setenv("TILEATTN_CPU_AMX", path)
    auto_takes = "on" if AMX else "dot" if DOT else "off"
    if PRESENT[path]:
        out = flash_attn_func(q, k, v, causal=True)
        assert torch.equal(out, auto) == (path == auto_takes)
    else:
        with pytest.raises(tileattn.TileattnError) as raised:
            flash_attn_func(q, k, v, causal=True)
        assert raised.value.argument == "TILEATTN_CPU_AMX"


def test_unknown_value_is_an_error(monkeypatch):
    monkeypatch.setenv("TILEATTN_CPU_AMX", "yes")
    x = torch.randn(1, 8, 1, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError) as raised:
        flash_attn_func(x, x, x)
    assert raised.value.argument == "TILEATTN_CPU_AMX"
