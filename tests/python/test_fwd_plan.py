"""flash_attn_func's repeat-call path (tileattn/_fwd_plan.py), with autograd recording the call
and without: it really runs and gives the float64-checked answer (and gradients), bitwise what the
full path gives; a changed signature or bad input still meets the full checks; calls with
dropout, attention probabilities or copied inputs never get a plan."""

import pytest
import torch

import attn_reference as ref
from conftest import FLOOR, assert_fa_close
from test_attention import MASKS, SHAPES
from tileattn import _fwd_plan, flash_attn_func


pytestmark = pytest.mark.usefixtures("no_plans", "no_decode_route")


def _inputs(shape, device, dtype=torch.bfloat16):
    batch, seqlen_q, seqlen_k, heads, heads_k, dim = shape
    return (torch.randn(batch, seqlen_q, heads, dim, dtype=dtype, device=device),
            torch.randn(batch, seqlen_k, heads_k, dim, dtype=dtype, device=device),
            torch.randn(batch, seqlen_k, heads_k, dim, dtype=dtype, device=device))


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("shape", SHAPES[1:4], ids=str)
def test_repeat_call_takes_the_plan_and_is_right(device, shape, mask):
    causal, window = MASKS[mask]
    heads = shape[3]
    slopes = torch.rand(heads, dtype=torch.float32, device=device)
    options = dict(causal=causal, window_size=window, softcap=5.0, alibi_slopes=slopes)
    with torch.no_grad():
        flash_attn_func(*_inputs(shape, device), **options)  # the full path; its parameters become the plan
        assert len(_fwd_plan._plans) == 1
        q, k, v = _inputs(shape, device)  # fresh tensors: a pointer left unreplaced reads the old ones
        hits = _fwd_plan.hits
        out = flash_attn_func(q, k, v, **options)
        assert _fwd_plan.hits == hits + 1
        _fwd_plan._plans.clear()
        assert torch.equal(out, flash_attn_func(q, k, v, **options))
    left, right = window[0], 0 if causal else window[1]
    kw = dict(window_left=left, window_right=right, softcap=5.0, alibi_slopes=slopes)
    truth = ref.attention(q, k, v, dtype=torch.float64, **kw)
    naive = ref.attention(q, k, v, dtype=torch.bfloat16, **kw)
    assert_fa_close("out", out, naive["out"], truth["out"], FLOOR[torch.bfloat16])


@pytest.mark.parametrize("mask", ["none", "causal_window"])
def test_recorded_repeat_call_takes_the_plan_and_its_gradients_are_right(device, mask):
    causal, window = MASKS[mask]
    shape = (2, 17, 127, 7, 1, 64)
    options = dict(causal=causal, window_size=window, softcap=3.0)
    first = [x.requires_grad_() for x in _inputs(shape, device)]
    flash_attn_func(*first, **options).sum().backward()  # the full path; it leaves the plan
    assert len(_fwd_plan._plans) == 1
    q, k, v = (x.requires_grad_() for x in _inputs(shape, device))
    dout = torch.randn_like(q)
    hits = _fwd_plan.hits
    out = flash_attn_func(q, k, v, **options)
    assert _fwd_plan.hits == hits + 1 and out.requires_grad
    out.backward(dout)
    _fwd_plan._plans.clear()
    again = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    full = flash_attn_func(*again, **options)
    full.backward(dout)
    assert torch.equal(out, full)
    for ours, theirs in zip((q.grad, k.grad, v.grad), (x.grad for x in again)):
        assert torch.equal(ours, theirs)
    left, right = window[0], 0 if causal else window[1]
    kw = dict(window_left=left, window_right=right, softcap=3.0)
    truth = ref.attention(q, k, v, dout, dtype=torch.float64, **kw)
    naive = ref.attention(q, k, v, dout, dtype=torch.bfloat16, **kw)
    assert_fa_close("out", out, naive["out"], truth["out"], FLOOR[torch.bfloat16])
    shift = ref.backward_rounding_shift(q, k, v, dout, out, truth["out"], **kw)
    for name, ours in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad)):
        assert_fa_close(name, ours, naive[name], truth[name], FLOOR[torch.bfloat16],
                        lse=truth["lse"], shift=shift.get(name))


def test_recorded_and_unrecorded_calls_have_separate_plans(device):
    q, k, v = _inputs((2, 17, 33, 4, 2, 64), device)
    q.requires_grad_()
    flash_attn_func(q, k, v)
    with torch.no_grad():
        flash_attn_func(q, k, v)
        assert len(_fwd_plan._plans) == 2
        assert not flash_attn_func(q, k, v).requires_grad
    assert flash_attn_func(q, k, v).requires_grad


def test_dropout_and_probs_calls_get_no_plan(device):
    q, k, v = _inputs((2, 17, 33, 4, 2, 64), device)
    q.requires_grad_()
    flash_attn_func(q, k, v, dropout_p=0.1).sum().backward()
    out, _, _ = flash_attn_func(q, k, v, return_attn_probs=True)
    out.sum().backward()
    with torch.no_grad():
        flash_attn_func(q, k, v, dropout_p=0.1)
        flash_attn_func(q, k, v, return_attn_probs=True)
    assert not len(_fwd_plan._plans)


def test_copied_inputs_get_no_plan(device):
    q, k, v = _inputs((1, 9, 9, 2, 2, 64), device)
    strided_q = torch.randn(1, 9, 2, 128, dtype=torch.bfloat16, device=device)[..., ::2]
    expect = flash_attn_func(strided_q.contiguous(), k, v)
    _fwd_plan._plans.clear()
    hits = _fwd_plan.hits
    for _ in range(2):
        assert torch.equal(flash_attn_func(strided_q, k, v), expect)
    assert _fwd_plan.hits == hits and not len(_fwd_plan._plans)


@pytest.mark.parametrize("change, argument", [
    (dict(k=torch.randn(2, 33, 2, 64, dtype=torch.float16)), "k"),
    (dict(q=torch.randn(2, 17, 5, 64, dtype=torch.bfloat16)), "k"),
    (dict(window_size=(8.0, -1)), "window_size"),  # equal to (8, -1) as a dict key
    (dict(softmax_scale=float("nan")), "softmax_scale"),
    (dict(alibi_slopes=torch.rand(3, dtype=torch.float32)), "alibi_slopes"),
    (dict(softcap=-1.0), "softcap"),
])
def test_plan_does_not_skip_a_check(change, argument):
    q, k, v = _inputs((2, 17, 33, 4, 2, 64), "cpu")
    args = dict(q=q, k=k, v=v, window_size=(8, -1), softmax_scale=0.5,
                alibi_slopes=torch.rand(4, dtype=torch.float32), softcap=1.0)
    flash_attn_func(**args)
    assert len(_fwd_plan._plans) == 1
    with pytest.raises((ValueError, TypeError, RuntimeError)) as info:
        flash_attn_func(**dict(args, **change))
    assert argument in str(info.value)
