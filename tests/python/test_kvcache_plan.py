"""flash_attn_with_kvcache's repeat-call path (tileattn/_kvcache_plan.py): a call whose signature
matches an earlier accepted call reuses its parameters and fills in only the pointers.  Checked
here: that path really runs and gives the float64-checked answer for every option set, a changed
signature or bad input still meets the full checks, inputs that need a copy never get a plan, and
the number of plans stays bounded."""

import re

import pytest
import torch

import tileattn
from conftest import DEVICES
from tileattn import _ffi, _kvcache_ops, _kvcache_plan, _ops
from test_kvcache import CASES, DEFAULTS, check_against_reference, make_problem


pytestmark = pytest.mark.usefixtures("no_plans")


@pytest.mark.parametrize("case", list(CASES))
def test_repeat_call_takes_the_plan_and_is_right(case, device):
    opts = dict(DEFAULTS, **CASES[case])
    dtype = torch.bfloat16
    args, _, _ = make_problem(opts, dtype, device)
    tileattn.flash_attn_with_kvcache(**args)  # the full path; its parameters become the plan
    assert len(_kvcache_plan._plans) == 1
    # Fresh inputs with the same signature: new caches, block table, q and new tokens, so a pointer
    # the plan failed to replace would read the first problem's data (or its freed memory).
    args, slot, first = make_problem(opts, dtype, device)
    hits = _kvcache_plan.hits
    out, lse = tileattn.flash_attn_with_kvcache(**args)
    assert _kvcache_plan.hits == hits + 1
    check_against_reference(opts, dtype, args, slot, first, out, lse)


def _small_args(device):
    return dict(q=torch.randn(2, 1, 4, 32, dtype=torch.bfloat16, device=device),
                k_cache=torch.randn(2, 64, 2, 32, dtype=torch.bfloat16, device=device),
                v_cache=torch.randn(2, 64, 2, 32, dtype=torch.bfloat16, device=device),
                cache_seqlens=torch.tensor([3, 40], dtype=torch.int32, device=device),
                window_size=(8, -1), softmax_scale=0.5, num_splits=1)


@pytest.mark.parametrize("change, argument", [
    (dict(k_cache=torch.randn(2, 64, 2, 32, dtype=torch.float16)), "k_cache"),
    (dict(q=torch.randn(2, 1, 5, 32, dtype=torch.bfloat16)), "k_cache"),
    (dict(cache_seqlens=torch.tensor([3, 40], dtype=torch.int64)), "cache_seqlens"),
    (dict(window_size=(8.0, -1)), "window_size"),  # equal to (8, -1) as a dict key
    (dict(num_splits=1.0), "num_splits"),
    (dict(softmax_scale=float("nan")), "softmax_scale"),
    (dict(cache_seqlens=torch.tensor([3, 70], dtype=torch.int32)), "cache_seqlens"),  # same signature
])
def test_plan_does_not_skip_a_check(change, argument):
    """After a plan exists, a call that breaks one rule is still refused, naming the argument --
    including one with the plan's very signature, whose cache_seqlens the CPU library checks."""
    tileattn.flash_attn_with_kvcache(**_small_args("cpu"))
    assert len(_kvcache_plan._plans) == 1
    args = dict(_small_args("cpu"), **change)
    with pytest.raises((ValueError, TypeError, RuntimeError)) as info:
        tileattn.flash_attn_with_kvcache(**args)
    assert argument in str(info.value)


def test_copied_inputs_get_no_plan(device):
    """q with a strided last dim is copied on every call; a plan would point at the copy."""
    args = _small_args(device)
    strided_q = torch.randn(2, 1, 4, 64, dtype=torch.bfloat16, device=device)[..., ::2]
    expect = tileattn.flash_attn_with_kvcache(**dict(args, q=strided_q.contiguous()))
    _kvcache_plan._plans.clear()
    hits = _kvcache_plan.hits
    for _ in range(2):
        got = tileattn.flash_attn_with_kvcache(**dict(args, q=strided_q))
        assert torch.equal(got, expect)
    assert _kvcache_plan.hits == hits and not _kvcache_plan._plans


def test_an_int_cache_seqlens_is_served_by_the_plan(device):
    args = dict(_small_args(device), cache_seqlens=40)
    expect = tileattn.flash_attn_with_kvcache(
        **dict(args, cache_seqlens=torch.full((2,), 40, dtype=torch.int32, device=device)))
    hits = _kvcache_plan.hits
    for _ in range(2):
        assert torch.equal(tileattn.flash_attn_with_kvcache(**args), expect)
    assert _kvcache_plan.hits == hits + 1


def test_plans_stay_bounded():
    for splits in range(1, _kvcache_plan._plans.limit + 10):
        tileattn.flash_attn_with_kvcache(**dict(_small_args("cpu"), num_splits=splits))
    assert 0 < len(_kvcache_plan._plans) <= _kvcache_plan._plans.limit


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs the CUDA backend")
def test_cuda_workspace_is_sized_and_checked_before_anything_runs(monkeypatch):
    """A batch-1 call over 2k keys splits, so it needs scratch; the package takes it from torch.
    Too small a workspace is refused naming it, before the new token is appended.  The size query
    gives the most over the kernels the call could take (the pointers' alignment picks at launch),
    so what the call asks for is at most that.  The decode kernels' partials: the forward route
    (test_kvcache_many_rows.py), which a one-row call takes only when forced, needs less."""
    monkeypatch.setenv("TILEATTN_KVCACHE_FORWARD", "off")
    q = torch.randn(1, 1, 32, 128, dtype=torch.bfloat16, device="cuda")
    k_cache = torch.randn(1, 2048, 8, 128, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.randn_like(k_cache)
    k, v = torch.randn(2, 1, 1, 8, 128, dtype=torch.bfloat16, device="cuda")
    seqlens = torch.tensor([1000], dtype=torch.int32, device="cuda")
    # out and lse held: freed, their memory could come back as `small` below, which the library
    # then refuses as a workspace sharing memory with out.
    params, out, lse, copies = _kvcache_ops.kvcache_params(
        q, k_cache, v_cache, k, v, None, None, seqlens, None, None, None, 128 ** -0.5, -1, -1, 0.0,
        True, None, 0)
    assert not copies
    needed = _ffi.library().kvcache_workspace_size(params)
    assert needed > 0 and needed % 256 == 0
    small = torch.empty(256, dtype=torch.uint8, device="cuda")
    params.workspace, params.workspace_bytes = small.data_ptr(), 256
    before = k_cache[0, 1000].clone()
    with pytest.raises(_ffi.InvalidArgumentError) as info:
        _ffi.library().forward_kvcache(params)
    assert info.value.argument == "workspace"
    asked = re.search(r"needs (\d+) bytes of workspace, got 256", str(info.value))
    assert asked and 256 < int(asked.group(1)) <= needed, str(info.value)
    torch.cuda.synchronize()
    assert torch.equal(k_cache[0, 1000], before)
    assert _kvcache_ops.forward_kvcache(params) == needed  # sized by the library this time
