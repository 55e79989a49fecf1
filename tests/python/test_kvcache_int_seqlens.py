"""flash_attn_with_kvcache with an int cache_seqlens (flash-attn's other form): the library takes it
as one length for every sequence, with no (batch,) tensor made per call.  Bit for bit the call with
that tensor, appends included, on every device; its range is checked on the host on every backend
(CUDA too, where a tensor's entries are checked in the kernels); a CUDA graph and torch.compile
take it."""

import pytest
import torch

import tileattn
from conftest import DEVICES
from test_kvcache import CASES, DEFAULTS, check_against_reference, make_problem

# Appends with rotary into pages, an entry map, left padding, several rows with a fixed split,
# GQA 7 over pages of 16, a head dim that is no bucket.
INT_CASES = ["contiguous", "paged16_rotary", "paged64_halves_batch_idx", "paged256_leftpad",
             "no_append_two_rows_causal", "gqa7_rows21_paged16_splits3", "d72_batch_idx_leftpad"]


def fresh_caches(args):
    """args with copies of the caches, so two calls append into caches of their own."""
    return dict(args, k_cache=args["k_cache"].clone(), v_cache=args["v_cache"].clone())


@pytest.mark.parametrize("case", INT_CASES)
def test_int_matches_the_tensor(case, device):
    opts = dict(DEFAULTS, **CASES[case])
    capacity = 512
    length = capacity - opts["seqlen_new"] - 9
    seqlens = torch.full((3,), length, dtype=torch.int32)
    args, slot, first = make_problem(opts, torch.bfloat16, device, capacity=capacity, cache_seqlens=seqlens)
    with_tensor, with_int = fresh_caches(args), fresh_caches(args)
    out, lse = tileattn.flash_attn_with_kvcache(**with_tensor)
    out_int, lse_int = tileattn.flash_attn_with_kvcache(**dict(with_int, cache_seqlens=length))
    assert torch.equal(out_int, out) and torch.equal(lse_int, lse)
    for cache in ("k_cache", "v_cache"):  # unused slots hold NaN, which equal() never matches
        assert torch.equal(with_int[cache].nan_to_num(), with_tensor[cache].nan_to_num()), cache
    check_against_reference(opts, torch.bfloat16, with_int, slot, first, out_int, lse_int)


@pytest.mark.parametrize("length, appended, rotary_positions, argument", [
    (65, 0, 0, "cache_seqlens"),   # past the 64 slots
    (64, 1, 0, "cache_seqlens"),   # the new token has no slot
    (60, 1, 60, "rotary_cos"),     # the new key's rotary position 60 is past a table of 60
])
def test_int_out_of_range_raises_on_every_device(length, appended, rotary_positions, argument, device):
    """A tensor's entries are checked in the CUDA kernels (NaN outputs) unless
    TILEATTN_CHECK_CONTENTS=on; an int is known on the host, so every backend raises, before
    anything is appended."""
    on = dict(dtype=torch.bfloat16, device=device)
    k_cache = torch.randn(2, 64, 2, 32, **on)
    before = k_cache.clone()
    args = dict(q=torch.randn(2, 1, 4, 32, **on), k_cache=k_cache, v_cache=torch.randn_like(k_cache),
                cache_seqlens=length)
    if appended:
        args.update(k=torch.randn(2, appended, 2, 32, **on), v=torch.randn(2, appended, 2, 32, **on))
    if rotary_positions:
        args.update(rotary_cos=torch.ones(rotary_positions, 8, **on), rotary_sin=torch.zeros(rotary_positions, 8, **on))
    with pytest.raises(ValueError) as info:
        tileattn.flash_attn_with_kvcache(**args)
    assert info.value.argument == argument, str(info.value)
    assert torch.equal(k_cache, before)


def test_int_of_each_call_reaches_the_plan(device):
    """Repeated calls reuse the first call's parameters (_kvcache_plan.py); each call's int must
    still be the length used."""
    opts = dict(DEFAULTS, seqlen_new=0)
    args, _, _ = make_problem(opts, torch.bfloat16, device, capacity=128,
                              cache_seqlens=torch.full((3,), 120, dtype=torch.int32))
    for length in (120, 17, 0, 64):
        expect = tileattn.flash_attn_with_kvcache(
            **dict(args, cache_seqlens=torch.full((3,), length, dtype=torch.int32, device=device)))
        got = tileattn.flash_attn_with_kvcache(**dict(args, cache_seqlens=length))
        assert torch.equal(got[0], expect[0]) and torch.equal(got[1], expect[1]), length


def test_int_compiles_fullgraph(device):
    on = dict(dtype=torch.bfloat16, device=device)
    q, k_cache = torch.randn(2, 1, 4, 32, **on), torch.randn(2, 64, 2, 32, **on)
    v_cache, k, v = torch.randn_like(k_cache), torch.randn(2, 1, 2, 32, **on), torch.randn(2, 1, 2, 32, **on)

    def step(q, k_cache, v_cache, k, v, length):
        return tileattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=length, causal=True)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for length in (40, 41):
        eager_cache = (k_cache.clone(), v_cache.clone())
        expect = step(q, *eager_cache, k, v, length)
        assert torch.equal(compiled(q, k_cache, v_cache, k, v, length), expect)
        assert torch.equal(k_cache, eager_cache[0]) and torch.equal(v_cache, eager_cache[1])


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs the CUDA backend")
def test_int_in_a_cuda_graph():
    """The graph holds the call's length as it held the filled tensor's value: replays attend to
    the same length while the inputs' contents change."""
    on = dict(dtype=torch.bfloat16, device="cuda")
    q, k_cache = torch.randn(4, 1, 32, 128, **on), torch.randn(4, 2048, 8, 128, **on)
    v_cache = torch.randn_like(k_cache)
    step = lambda: tileattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=1500)  # noqa: E731
    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for _ in range(2):
        q.copy_(torch.randn_like(q))
        graph.replay()
        expect = tileattn.flash_attn_with_kvcache(
            q, k_cache, v_cache, cache_seqlens=torch.full((4,), 1500, dtype=torch.int32, device="cuda"))
        assert torch.equal(out, expect)
