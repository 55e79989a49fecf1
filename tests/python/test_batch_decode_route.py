"""flash_attn_func calls shaped like a decode step (no gradient, dropout or attn_probs; at most
ROW_LIMIT query rows a KV group) run as flash_attn_with_kvcache over k and v as a full cache
(python/tileattn/_batch_decode_route.py), on CUDA.  On the CPU the tests let the route serve the
CPU too, so CI runs its logic: which calls take it, and their outputs against float64 with
FlashAttention's rule, for every mask and score option the route passes on (bottom-right causal,
windows, softcap, ALiBi), groups of 1 to 14 rows, key counts from 1, and rows that see no key."""

import pytest
import torch

import attn_reference as ref
import tileattn
from conftest import DEVICES, FLOOR, assert_fa_close, dtypes_for
from tileattn import _batch_decode_route, _fwd_plan, _kvcache_plan, flash_attn_func, interface

# (seqlen_q, seqlen_k, nheads, nheads_k, headdim); seqlen_q x nheads / nheads_k <= 16.
SHAPES = [(1, 1, 1, 1, 64), (1, 1000, 7, 1, 64), (2, 17, 7, 1, 128), (1, 127, 8, 2, 128), (3, 300, 4, 1, 64),
          (4, 2, 4, 4, 128)]
# name: flash_attn_func's mask and score options
OPTIONS = {"none": {}, "causal": dict(causal=True), "window": dict(window_size=(5, 0)),
           "causal_softcap": dict(causal=True, softcap=3.0), "alibi": dict(alibi_slopes="per_head")}


@pytest.fixture
def kvcache_calls(monkeypatch, device, no_plans):
    """The route's calls of flash_attn_with_kvcache, counted; the route also serves the CPU.  No
    plan before or after: a route plan holds the function it was made with, another test's
    counter."""
    monkeypatch.setattr(_batch_decode_route, "DEVICES", ("cuda", "cpu"))
    return count_kvcache_calls(monkeypatch)


def count_kvcache_calls(monkeypatch):
    """flash_attn_with_kvcache's calls through interface (the route's), listed by their keywords."""
    calls = []
    real = interface.flash_attn_with_kvcache

    def counted(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)
    monkeypatch.setattr(interface, "flash_attn_with_kvcache", counted)
    return calls


def inputs(device, dtype, shape, requires_grad=False):
    seqlen_q, seqlen_k, heads, heads_k, dim = shape
    q = torch.randn(2, seqlen_q, heads, dim, device=device, dtype=dtype, requires_grad=requires_grad)
    k, v = (torch.randn(2, seqlen_k, heads_k, dim, device=device, dtype=dtype, requires_grad=requires_grad)
            for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_decode_shaped_calls_take_the_route_and_hold_the_rule(device, kvcache_calls, shape, option):
    for dtype in dtypes_for(device):
        q, k, v = inputs(device, dtype, shape)
        kwargs = dict(OPTIONS[option])
        if kwargs.get("alibi_slopes") == "per_head":
            kwargs["alibi_slopes"] = torch.rand(q.shape[2], device=device, dtype=torch.float32)
        before = len(kvcache_calls)
        with torch.no_grad():
            out = flash_attn_func(q, k, v, **kwargs)
        assert len(kvcache_calls) == before + 1, "the call did not take the route"
        causal = kwargs.get("causal", False)
        window = kwargs.get("window_size", (-1, -1))
        options = dict(window_left=window[0], window_right=0 if causal else window[1],
                       softcap=kwargs.get("softcap", 0.0), alibi_slopes=kwargs.get("alibi_slopes"))
        truth = ref.attention(q, k, v, dtype=torch.float64, **options)
        naive = ref.attention(q, k, v, dtype=dtype, **options)
        assert out.shape == q.shape and out.dtype == dtype
        assert_fa_close("out", out, naive["out"], truth["out"], FLOOR[dtype])


def test_rows_that_see_no_key_are_zero(device, kvcache_calls):
    """4 query rows over 2 keys, causal: the first two rows see none (flash_attn_func's 0)."""
    q, k, v = inputs(device, torch.bfloat16, (4, 2, 2, 2, 64))
    with torch.no_grad():
        out = flash_attn_func(q, k, v, causal=True)
    assert len(kvcache_calls) == 1
    assert torch.all(out[:, :2] == 0) and not out.isnan().any()


@pytest.mark.parametrize("case", ["grad", "dropout", "probs", "rows", "strided_last_dim"])
def test_other_calls_keep_the_forward(device, kvcache_calls, case):
    shape = (17, 40, 4, 1, 64) if case == "rows" else (1, 40, 4, 1, 64)  # 68 rows a KV group
    q, k, v = inputs(device, torch.bfloat16, shape, requires_grad=case == "grad")
    kwargs = {"dropout": dict(dropout_p=0.1), "probs": dict(return_attn_probs=True)}.get(case, {})
    if case == "strided_last_dim":
        k = torch.randn(2, 40, 1, 128, device=device, dtype=torch.bfloat16)[..., ::2]
    flash_attn_func(q, k, v, **kwargs)
    assert kvcache_calls == []


def test_the_cpu_is_left_to_the_library(kvcache_calls, monkeypatch):
    monkeypatch.setattr(_batch_decode_route, "DEVICES", ("cuda",))
    q, k, v = inputs("cpu", torch.float32, (1, 40, 4, 1, 64))
    tileattn.flash_attn_func(q, k, v)
    assert kvcache_calls == []


@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("used", [False, True], ids=["all_keys", "seqused_k"])
def test_varlen_decode_shaped_calls_take_the_route_and_hold_the_rule(device, kvcache_calls, option, used):
    """flash_attn_varlen_func over packed k and v: sequences of 0-3 query rows (7 heads over 1: up
    to 14 rows a group) and 0-1000 keys, each against the float64 reference of its own rows."""
    seqlens_q, seqlens_k = [1, 0, 2, 2, 1], [17, 5, 0, 1000, 128]
    heads, heads_k, dim = 7, 1, 64
    cu_q = torch.tensor([0] + seqlens_q, device=device).cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + seqlens_k, device=device).cumsum(0).to(torch.int32)
    seqused_k = torch.tensor([9, 5, 0, 999, 128], dtype=torch.int32, device=device) if used else None
    kwargs = dict(OPTIONS[option])
    if kwargs.get("alibi_slopes") == "per_head":
        kwargs["alibi_slopes"] = torch.rand(heads, device=device, dtype=torch.float32)
    causal = kwargs.get("causal", False)
    window = kwargs.get("window_size", (-1, -1))
    options = dict(window_left=window[0], window_right=0 if causal else window[1],
                   softcap=kwargs.get("softcap", 0.0), alibi_slopes=kwargs.get("alibi_slopes"))
    for dtype in dtypes_for(device):
        q = torch.randn(int(cu_q[-1]), heads, dim, device=device, dtype=dtype)
        k, v = (torch.randn(int(cu_k[-1]), heads_k, dim, device=device, dtype=dtype) for _ in range(2))
        before = len(kvcache_calls)
        with torch.no_grad():
            out = tileattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(seqlens_q), max(seqlens_k),
                                                  seqused_k=seqused_k, **kwargs)
        assert len(kvcache_calls) == before + 1, "the call did not take the route"
        assert out.shape == q.shape and out.dtype == dtype
        for b, (len_q, len_k) in enumerate(zip(seqlens_q, seqlens_k)):
            rows = slice(int(cu_q[b]), int(cu_q[b]) + len_q)
            first = int(cu_k[b])
            keys = slice(first, first + (int(seqused_k[b]) if used else len_k))
            if len_q == 0:
                continue
            if keys.stop == keys.start:
                assert torch.all(out[rows] == 0), f"sequence {b} sees no key"
                continue
            args = (q[rows][None], k[keys][None], v[keys][None])
            truth = ref.attention(*args, dtype=torch.float64, **options)
            naive = ref.attention(*args, dtype=dtype, **options)
            assert_fa_close(f"out of sequence {b}", out[rows][None], naive["out"], truth["out"], FLOOR[dtype])


@pytest.mark.skipif("cuda" not in DEVICES, reason="CUDA's NaN rule: the CPU backend raises instead")
@pytest.mark.usefixtures("no_plans")
@pytest.mark.parametrize("case", ["seqused_k past the keys", "negative seqused_k", "seqused_k near 2^31",
                                  "keys out of order"])
def test_varlen_route_gives_nan_for_bad_contents(monkeypatch, case):
    """The forward kernels' rule on the route: the bad sequence's rows NaN, the others attend
    (session 73's route read past a sequence's keys into the next one's for seqused_k above them).
    Near 2^31 the route's int32 end, 20 + seqused_k, wraps negative."""
    cu_k = [0, 20, 50, 90] if case != "keys out of order" else [0, 20, 10, 90]
    used = {"seqused_k past the keys": [20, 31, 40], "negative seqused_k": [20, -1, 40],
            "seqused_k near 2^31": [20, 2**31 - 5, 40]}.get(case)
    on = dict(device="cuda", dtype=torch.bfloat16)
    q, k, v = torch.randn(3, 4, 64, **on), torch.randn(90, 1, 64, **on), torch.randn(90, 1, 64, **on)
    cu_q = torch.arange(4, device="cuda", dtype=torch.int32)
    seqused_k = None if used is None else torch.tensor(used, device="cuda", dtype=torch.int32)
    calls = count_kvcache_calls(monkeypatch)
    with torch.no_grad():
        out = tileattn.flash_attn_varlen_func(q, k, v, cu_q, torch.tensor(cu_k, device="cuda", dtype=torch.int32),
                                              1, 80, seqused_k=seqused_k)
    assert calls, "the call did not take the route"
    assert out[1].isnan().all(), "the bad sequence attended"
    assert out[0].isfinite().all() and out[2].isfinite().all()


def _varlen_step(device):
    """A packed decode step: 3 sequences of one query row, 7 heads over 1, 20-40 keys each."""
    cu_q = torch.arange(4, device=device, dtype=torch.int32)
    cu_k = torch.tensor([0, 20, 50, 90], device=device, dtype=torch.int32)
    on = dict(device=device, dtype=torch.bfloat16)
    return (torch.randn(3, 7, 64, **on), torch.randn(90, 1, 64, **on), torch.randn(90, 1, 64, **on), cu_q, cu_k)


@pytest.mark.usefixtures("no_plans")
@pytest.mark.parametrize("form", ["batch", "varlen"])
def test_repeat_calls_take_the_route_from_the_plan(device, kvcache_calls, monkeypatch, form):
    """A decode loop's later calls skip flash_attn_func's checks (_fwd_plan.Rerouted): the same
    route and bits as the full path; the plan sends a call back to the full path once the route no
    longer applies (DEVICES changed)."""
    options = dict(causal=True, softcap=3.0)

    def step(tensors):
        *tensors, slopes = tensors
        if form == "batch":
            return flash_attn_func(*tensors, alibi_slopes=slopes, **options)
        q, k, v, cu_q, cu_k = tensors
        return tileattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 1, 40, alibi_slopes=slopes, **options)

    def fresh():  # every tensor new, the ALiBi slopes too: a plan must take this call's pointers
        tensors = inputs(device, torch.bfloat16, (1, 300, 7, 1, 64)) if form == "batch" else _varlen_step(device)
        return (*tensors, torch.rand(7, device=device, dtype=torch.float32))

    with torch.no_grad():
        step(fresh())  # the full path; it leaves the plan
        step(fresh())  # the route's own kvcache call remembers its plan's key
        tensors = fresh()
        hits, kvcache_hits, calls = _fwd_plan.hits, _kvcache_plan.hits, len(kvcache_calls)
        out = step(tensors)
        # Both plans serve the call, without flash_attn_with_kvcache's own entry (or its signature).
        assert (_fwd_plan.hits, _kvcache_plan.hits) == (hits + 1, kvcache_hits + 1)
        assert len(kvcache_calls) == calls
        _fwd_plan._plans.clear()
        assert torch.equal(out, step(tensors))
        monkeypatch.setattr(_batch_decode_route, "DEVICES", ())
        hits, calls = _fwd_plan.hits, len(kvcache_calls)
        forward = step(tensors)
        assert _fwd_plan.hits == hits and len(kvcache_calls) == calls, "the plan kept the route"
    torch.testing.assert_close(forward, out, rtol=0, atol=2 ** -6)  # other kernels: a bf16 rounding


@pytest.mark.usefixtures("no_plans")
def test_seqused_k_route_calls_build_one_kvcache_signature(device, kvcache_calls, monkeypatch):
    """A varlen route call with seqused_k goes through flash_attn_with_kvcache every time (its key
    counts are a new tensor a call), whose own plan lookup builds the call's signature; the route
    builds no second one for a key it never looks up."""
    signatures = []
    real = _kvcache_plan.signature

    def counted(*args, **kwargs):
        signatures.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(_kvcache_plan, "signature", counted)
    q, k, v, cu_q, cu_k = _varlen_step(device)
    used = torch.tensor([20, 7, 0], device=device, dtype=torch.int32)
    with torch.no_grad():
        for _ in range(3):
            tileattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 1, 40, seqused_k=used)
        signatures.clear()
        calls = len(kvcache_calls)
        tileattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 1, 40, seqused_k=used)
    assert len(kvcache_calls) == calls + 1, "the call did not take the route"
    assert len(signatures) == 1


@pytest.mark.skipif("cuda" not in DEVICES, reason="TILEATTN_CHECK_CONTENTS is read for CUDA calls")
@pytest.mark.usefixtures("no_plans")
def test_a_varlen_plan_leaves_the_route_when_contents_are_checked(monkeypatch):
    """TILEATTN_CHECK_CONTENTS=on, set after a route plan was made, still brings the forward's
    host checks, which name the bad argument."""
    calls = count_kvcache_calls(monkeypatch)
    q, k, v, cu_q, _ = _varlen_step("cuda")
    bad_cu_k = torch.tensor([0, 20, 10, 90], device="cuda", dtype=torch.int32)
    with torch.no_grad():
        tileattn.flash_attn_varlen_func(q, k, v, cu_q, bad_cu_k, 1, 80)  # NaN rows; the plan is stored
        assert calls
        monkeypatch.setenv("TILEATTN_CHECK_CONTENTS", "on")
        with pytest.raises(ValueError) as raised:
            tileattn.flash_attn_varlen_func(q, k, v, cu_q, bad_cu_k, 1, 80)
    assert raised.value.argument == "cu_seqlens_k", str(raised.value)
