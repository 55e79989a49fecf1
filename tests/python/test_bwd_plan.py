"""The eager backward's repeat-call path (tileattn/_bwd_plan.py): a training step after the
first takes the plan and its gradients meet FA's rule against float64, bitwise what the full path
gives; a changed signature gets its own plan; dropout and copied inputs never get one."""

import pytest
import torch

import attn_reference as ref
from conftest import FLOOR, assert_fa_close
from test_attention import MASKS, SHAPES
from test_fwd_plan import _inputs
from tileattn import _bwd_plan, flash_attn_func


pytestmark = pytest.mark.usefixtures("no_plans")


def _leaves(shape, device):
    return [x.requires_grad_() for x in _inputs(shape, device)]


def _step(q, k, v, dout, **options):
    """One forward and backward; the gradients of q, k, v."""
    flash_attn_func(q, k, v, **options).backward(dout)
    return q.grad, k.grad, v.grad


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("shape", SHAPES[1:4], ids=str)
def test_second_step_takes_the_plan_and_is_right(device, shape, mask):
    causal, window = MASKS[mask]
    heads = shape[3]
    slopes = torch.rand(heads, dtype=torch.float32, device=device)
    options = dict(causal=causal, window_size=window, softcap=5.0, alibi_slopes=slopes)
    q, k, v = _leaves(shape, device)
    _step(q, k, v, torch.randn_like(q), **options)  # the full path; its parameters become the plan
    assert len(_bwd_plan._plans) == 1
    q, k, v = _leaves(shape, device)  # fresh tensors: a pointer left unreplaced reads the old ones
    dout = torch.randn_like(q)
    hits = _bwd_plan.hits
    grads = _step(q, k, v, dout, **options)
    assert _bwd_plan.hits == hits + 1
    _bwd_plan._plans.clear()
    again = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    for ours, full in zip(grads, _step(*again, dout, **options)):
        assert torch.equal(ours, full)
    left, right = window[0], 0 if causal else window[1]
    kw = dict(window_left=left, window_right=right, softcap=5.0, alibi_slopes=slopes)
    truth = ref.attention(q, k, v, dout, dtype=torch.float64, **kw)
    naive = ref.attention(q, k, v, dout, dtype=torch.bfloat16, **kw)
    out = flash_attn_func(q, k, v, **options)
    shift = ref.backward_rounding_shift(q, k, v, dout, out, truth["out"], **kw)
    for name, ours in zip(("dq", "dk", "dv"), grads):
        assert_fa_close(name, ours, naive[name], truth[name], FLOOR[torch.bfloat16],
                        lse=truth["lse"], shift=shift.get(name))


def test_changed_signature_gets_its_own_plan(device):
    q, k, v = _leaves((2, 17, 33, 4, 2, 64), device)
    dout = torch.randn_like(q)
    _step(q, k, v, dout)
    _step(q, k, v, dout, causal=True)
    _step(q, k, v, dout, deterministic=True)
    assert len(_bwd_plan._plans) == 3
    hits = _bwd_plan.hits
    q.grad = k.grad = v.grad = None
    causal_grads = _step(q, k, v, dout, causal=True)
    assert _bwd_plan.hits == hits + 1
    _bwd_plan._plans.clear()
    for ours, full in zip(causal_grads,
                          _step(*[x.detach().clone().requires_grad_() for x in (q, k, v)], dout,
                                causal=True)):
        assert torch.equal(ours, full)


def test_dropout_and_copied_dout_get_no_plan(device):
    q, k, v = _leaves((1, 9, 9, 2, 2, 64), device)
    _step(q, k, v, torch.randn_like(q), dropout_p=0.2)
    assert not len(_bwd_plan._plans)
    strided = torch.randn(1, 9, 2, 128, dtype=torch.bfloat16, device=device)[..., ::2]
    q.grad = k.grad = v.grad = None
    expect = _step(q, k, v, strided.contiguous())
    _bwd_plan._plans.clear()
    hits = _bwd_plan.hits
    for _ in range(2):
        q.grad = k.grad = v.grad = None
        for ours, full in zip(_step(q, k, v, strided), expect):
            assert torch.equal(ours, full)
    assert _bwd_plan.hits == hits and not len(_bwd_plan._plans)
