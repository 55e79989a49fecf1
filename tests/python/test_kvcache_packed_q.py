"""flash_attn_with_kvcache with packed query rows (cu_seqlens_q, max_seqlen_q): each sequence's rows
and LSE against a float64 reference over its cache keys (FA's rule), on contiguous and paged caches
whose unused slots are NaN, with cache_batch_idx, cache_leftpad, masks, softcap and ALiBi; the bad
inputs; CUDA's NaN for bad cu_seqlens_q contents; the repeat-call plan and torch.compile."""

import pytest
import torch

import attn_reference as ref
from conftest import FLOOR, assert_fa_close, dtypes_for
from test_varlen import cu
from tileattn import _kvcache_plan, flash_attn_with_kvcache

CAPACITY = 256  # cache slots a sequence may use


def make_caches(device, dtype, seqlens, heads_k, dim, *, page=None, batch_idx=False):
    """NaN-filled caches holding sequence b's `seqlens[b]` keys, contiguous (entries, CAPACITY, Hk,
    D) or in shuffled pages with a block table; returns (k_cache, v_cache, keys, extra kwargs),
    keys[b] = (k, v) of its positions 0 .. seqlens[b] - 1."""
    batch = len(seqlens)
    entries = batch + 2 if batch_idx else batch
    rows = torch.randperm(entries)[:batch] if batch_idx else torch.arange(batch)
    contiguous = [torch.full((entries, CAPACITY, heads_k, dim), float("nan"), dtype=dtype) for _ in range(2)]
    keys = []
    for b, n in enumerate(seqlens):
        values = [torch.randn(n, heads_k, dim, dtype=dtype) for _ in range(2)]
        for cache, x in zip(contiguous, values):
            cache[rows[b], :n] = x
        keys.append(tuple(x.to(device) for x in values))
    extra = dict(cache_batch_idx=rows.to(torch.int32).to(device)) if batch_idx else {}
    if page is None:
        return contiguous[0].to(device), contiguous[1].to(device), keys, extra
    blocks = entries * CAPACITY // page
    order = torch.randperm(blocks)  # page order[j] holds the contiguous cache's j-th page
    pages = [torch.empty((blocks, page, heads_k, dim), dtype=dtype) for _ in range(2)]
    for cache, paged in zip(contiguous, pages):
        paged[order] = cache.view(blocks, page, heads_k, dim)
    extra["block_table"] = order.view(entries, -1).to(torch.int32).to(device)
    return pages[0].to(device), pages[1].to(device), keys, extra


def run_packed(device, dtype, rows, seqlens, *, heads=8, heads_k=2, dim=64, page=None, batch_idx=False,
               leftpad=None, max_seqlen_q=None, causal=False, window_size=(-1, -1), softcap=0.0,
               alibi_slopes=None):
    k_cache, v_cache, keys, extra = make_caches(device, dtype, seqlens, heads_k, dim, page=page,
                                                batch_idx=batch_idx)
    q = torch.randn(sum(rows), heads, dim, dtype=dtype, device=device)
    cu_q = cu(rows, device)
    if leftpad is not None:
        extra["cache_leftpad"] = torch.tensor(leftpad, dtype=torch.int32, device=device)
    out, lse = flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=torch.tensor(seqlens, dtype=torch.int32, device=device),
        causal=causal, window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes,
        return_softmax_lse=True, cu_seqlens_q=cu_q, max_seqlen_q=max_seqlen_q or max(max(rows), 1), **extra)
    assert out.shape == q.shape and lse.shape == (heads, q.shape[0])
    options = dict(window_left=window_size[0], window_right=0 if causal else window_size[1], softcap=softcap)
    for b, n in enumerate(rows):
        where = slice(int(cu_q[b]), int(cu_q[b]) + n)
        first = 0 if leftpad is None else leftpad[b]
        k, v = (x[first:].unsqueeze(0) for x in keys[b])
        slopes = None
        if alibi_slopes is not None:
            slopes = alibi_slopes if alibi_slopes.dim() == 1 else alibi_slopes[b]
        args = (q[where].unsqueeze(0), k, v)
        truth = ref.attention(*args, dtype=torch.float64, alibi_slopes=slopes, **options)
        naive = ref.attention(*args, dtype=dtype, alibi_slopes=slopes, **options)
        tag = f"sequence {b} ({n} rows x {k.shape[1]} keys)"
        assert_fa_close(f"{tag} out", out[where].unsqueeze(0), naive["out"], truth["out"], FLOOR[dtype])
        assert_fa_close(f"{tag} lse", lse[:, where].unsqueeze(0), naive["lse"], truth["lse"], FLOOR[dtype])


@pytest.mark.parametrize("cache", ["contiguous", "page16", "page64"])
@pytest.mark.parametrize("mask", ["none", "causal", "window"])
def test_packed_rows_against_float64(device, cache, mask):
    page = None if cache == "contiguous" else int(cache.removeprefix("page"))
    options = dict(causal=mask == "causal", window_size=(20, 3) if mask == "window" else (-1, -1))
    for dtype in dtypes_for(device):
        run_packed(device, dtype, [1, 3, 0, 5], [200, 17, 40, 0], page=page, **options)
        run_packed(device, dtype, [1, 1, 1], [1, 256, 100], page=page, **options)


@pytest.mark.parametrize("cache", ["contiguous", "page16", "page256"])
def test_packed_prefill_chunks(device, cache):
    """Packed chunks of up to 100 rows a sequence: on compute capability 9.0 the library runs them on
    its forward kernels under auto (kvcache_forward_route.h), reading the pages in place."""
    page = None if cache == "contiguous" else int(cache.removeprefix("page"))
    for dtype in dtypes_for(device):
        run_packed(device, dtype, [64, 100, 0, 37], [200, 100, 50, 256], dim=128, page=page, causal=True)
        run_packed(device, dtype, [40, 33], [256, 90], heads=14, heads_k=2, dim=128, page=page)


@pytest.mark.parametrize("option", ["batch_idx", "leftpad", "softcap_alibi", "alibi_per_sequence", "mqa",
                                    "loose_max_seqlen_q", "int32_max_seqlen_q"])
def test_packed_rows_options(device, option):
    rows, seqlens = [2, 4, 1], [120, 33, 256]
    kwargs = {}
    if option == "batch_idx":
        kwargs = dict(batch_idx=True, causal=True)
    elif option == "leftpad":
        kwargs = dict(leftpad=[7, 0, 250], causal=True, page=16)
    elif option == "softcap_alibi":
        kwargs = dict(softcap=3.0, alibi_slopes=torch.rand(8, device=device) * 0.3, causal=True)
    elif option == "alibi_per_sequence":
        kwargs = dict(alibi_slopes=torch.rand(3, 8, device=device) * 0.3, window_size=(30, 0))
    elif option == "mqa":
        kwargs = dict(heads=7, heads_k=1, dim=40, causal=True)
    elif option == "loose_max_seqlen_q":
        kwargs = dict(max_seqlen_q=9, causal=True)
    else:  # a bound no sequence can reach: the work is sized by q's rows, not by it
        kwargs = dict(max_seqlen_q=2**31 - 1, causal=True)
    for dtype in dtypes_for(device):
        run_packed(device, dtype, rows, seqlens, **kwargs)


def dtype_on(device):
    """float32 on the CPU, bfloat16 on CUDA (which has no float32 kernels)."""
    return torch.float32 if device == "cpu" else torch.bfloat16


def call(device="cpu", **changes):
    """A valid packed call (3 sequences of 1, 2, 1 rows), with `changes`."""
    dtype = dtype_on(device)
    cache = torch.randn(3, 32, 2, 16, dtype=dtype, device=device)
    args = dict(q=torch.randn(4, 4, 16, dtype=dtype, device=device), k_cache=cache, v_cache=cache,
                cache_seqlens=torch.tensor([5, 32, 0], dtype=torch.int32, device=device),
                cu_seqlens_q=cu([1, 2, 1], device), max_seqlen_q=2, causal=True)
    args.update(changes)
    return flash_attn_with_kvcache(**args)


BAD = {
    "batch-form q": (dict(q=torch.randn(2, 2, 4, 16)), ValueError, "q"),
    "no max_seqlen_q": (dict(max_seqlen_q=None), ValueError, "max_seqlen_q"),
    "max_seqlen_q alone": (dict(cu_seqlens_q=None, q=torch.randn(3, 2, 4, 16)), ValueError, "max_seqlen_q"),
    "cu_seqlens_q int64": (dict(cu_seqlens_q=cu([1, 2, 1], "cpu").long()), TypeError, "cu_seqlens_q"),
    "append": (dict(k=torch.randn(3, 1, 2, 16), v=torch.randn(3, 1, 2, 16)), ValueError, "k"),
    "rotary": (dict(rotary_cos=torch.randn(64, 4), rotary_sin=torch.randn(64, 4)), ValueError, "rotary_cos"),
    "rows past q": (dict(cu_seqlens_q=torch.tensor([0, 1, 3, 5], dtype=torch.int32)), ValueError, "cu_seqlens_q"),
    "rows out of order": (dict(cu_seqlens_q=torch.tensor([0, 2, 1, 4], dtype=torch.int32)), ValueError,
                          "cu_seqlens_q"),
    "sequence past max_seqlen_q": (dict(max_seqlen_q=1), ValueError, "max_seqlen_q"),
    "alibi for another batch": (dict(alibi_slopes=torch.rand(4, 4)), ValueError, "alibi_slopes"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_packed_call_names_the_argument(case):
    changes, error, argument = BAD[case]
    with pytest.raises(error) as raised:
        call(**changes)
    assert raised.value.argument == argument, str(raised.value)


def test_good_packed_call_of_the_bad_cases_runs():
    assert call().shape == (4, 4, 16)


def test_packed_call_repeats_from_its_plan():
    """The second call with the same signature runs from the first one's parameters (CPU: the
    library's packed form), with the same result."""
    same = dict(q=torch.randn(4, 4, 16), k_cache=torch.randn(3, 32, 2, 16), v_cache=torch.randn(3, 32, 2, 16))
    first = call(**same)
    hits = _kvcache_plan.hits
    second = call(**same)
    assert _kvcache_plan.hits == hits + 1
    assert torch.equal(first, second)


def test_packed_call_compiles_fullgraph(device):
    cache = torch.randn(3, 32, 2, 16, dtype=dtype_on(device), device=device)
    seqlens = torch.tensor([5, 32, 0], dtype=torch.int32, device=device)
    cu_q = cu([1, 2, 1], device)

    def step(q):
        return flash_attn_with_kvcache(q, cache, cache, cache_seqlens=seqlens, cu_seqlens_q=cu_q, max_seqlen_q=2,
                                       causal=True, return_softmax_lse=True)

    q = torch.randn(4, 4, 16, dtype=dtype_on(device), device=device)
    eager = step(q)
    compiled = torch.compile(step, fullgraph=True, backend="eager")(q)
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


CONTENT_CASES = ["rows past q", "rows out of order", "sequence past max_seqlen_q"]


def on_device(changes, device):
    return {name: x.to(device) if isinstance(x, torch.Tensor) else x for name, x in changes.items()}


@pytest.mark.parametrize("case", CONTENT_CASES)
def test_bad_packed_rows_raise_where_contents_are_read(device, case, monkeypatch):
    """The CPU, and CUDA with TILEATTN_CHECK_CONTENTS=on, raise for bad cu_seqlens_q contents
    naming the argument."""
    monkeypatch.setenv("TILEATTN_CHECK_CONTENTS", "on")
    changes, error, argument = BAD[case]
    with pytest.raises(error) as raised:
        call(device, **on_device(changes, device))
    assert raised.value.argument == argument, str(raised.value)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("case", CONTENT_CASES)
def test_cuda_bad_packed_rows_give_nan(case):
    """On CUDA nothing is read on the host: bad cu_seqlens_q contents make every output NaN, with
    nothing read out of bounds (a later call still runs)."""
    out, lse = call("cuda", return_softmax_lse=True, **on_device(BAD[case][0], "cuda"))
    assert torch.isnan(out).all() and torch.isnan(lse).all()
    assert not torch.isnan(call("cuda")).any()


def test_packed_rows_from_strided_views(device):
    """q a view with gaps between its heads and rows (every other head of a wider tensor): the
    same output as its contiguous copy."""
    wide = torch.randn(4, 8, 16, dtype=dtype_on(device), device=device)
    q = wide[:, ::2]
    cache = torch.randn(3, 32, 2, 16, dtype=dtype_on(device), device=device)
    args = dict(k_cache=cache, v_cache=cache, cache_seqlens=torch.tensor([5, 32, 0], dtype=torch.int32, device=device),
                cu_seqlens_q=cu([1, 2, 1], device), max_seqlen_q=2, causal=True, return_softmax_lse=True)
    strided, contiguous = flash_attn_with_kvcache(q, **args), flash_attn_with_kvcache(q.contiguous(), **args)
    for a, b in zip(strided, contiguous):
        assert torch.equal(a, b)
