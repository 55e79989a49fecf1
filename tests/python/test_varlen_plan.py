"""flash_attn_varlen_func's repeat-call path (tileattn/_fwd_plan.py, _bwd_plan.py): a call whose
signature repeats takes the plan, with autograd recording it or not, and reads this call's index
tensors, not the first call's: new cu_seqlens and seqused_k contents of the same shapes give the
float64-checked answer and gradients, bitwise what the full path gives.  Index tensors the checks
had to copy never get a plan."""

import pytest
import torch

import attn_reference as ref
from conftest import FLOOR, assert_fa_close
from test_varlen import cu
from tileattn import _bwd_plan, _fwd_plan, flash_attn_varlen_func

pytestmark = pytest.mark.usefixtures("no_plans")

HEADS, HEADS_K, DIM = 7, 1, 64


def _packed(total_q, total_k, device, grad):
    def rand(rows, heads):
        x = torch.randn(rows, heads, DIM, dtype=torch.bfloat16, device=device)
        return x.requires_grad_(grad)
    return rand(total_q, HEADS), rand(total_k, HEADS_K), rand(total_k, HEADS_K)


def _call(q, k, v, cu_q, cu_k, used, **options):
    return flash_attn_varlen_func(q, k, v, cu_q, cu_k, 200, 300, seqused_k=used, **options)


def _check(q, k, v, dout, out, cu_q, cu_k, used, grads, options):
    """Each sequence against float64 attention of it alone: out, and dq, dk, dv when given."""
    left, right = options["window_size"][0], 0 if options["causal"] else options["window_size"][1]
    kw = dict(window_left=left, window_right=right, softcap=options["softcap"])
    one = lambda x, r: x[r].unsqueeze(0)  # noqa: E731
    for b in range(cu_q.shape[0] - 1):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        keys = slice(int(cu_k[b]), int(cu_k[b]) + int(used[b]))
        args = (one(q, rows), one(k, keys), one(v, keys)) + ((one(dout, rows),) if grads else ())
        truth = ref.attention(*args, dtype=torch.float64, **kw)
        naive = ref.attention(*args, dtype=torch.bfloat16, **kw)
        floor = FLOOR[torch.bfloat16]
        assert_fa_close(f"sequence {b} out", one(out, rows), naive["out"], truth["out"], floor)
        if grads:
            shift = ref.backward_rounding_shift(args[0], args[1], args[2], args[3], one(out, rows),
                                                truth["out"], **kw)
            for name, grad, where in zip(("dq", "dk", "dv"), grads, (rows, keys, keys)):
                assert_fa_close(f"sequence {b} {name}", one(grad, where), naive[name],
                                truth[name], floor, lse=truth["lse"], shift=shift.get(name))


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "no_grad"])
@pytest.mark.parametrize("mask", ["none", "causal_window"])
def test_repeat_call_reads_this_calls_index_tensors(device, recorded, mask):
    options = dict(causal=mask != "none", window_size=(-1, -1) if mask == "none" else (23, -1),
                   softcap=4.0)
    lengths = ([17, 1, 127, 5], [127, 17, 1, 40])
    first = _packed(150, 185, device, recorded)
    used = torch.tensor([127, 3, 1, 40], dtype=torch.int32, device=device)
    with torch.set_grad_enabled(recorded):
        out = _call(*first, cu(*lengths[:1], device), cu(lengths[1], device), used, **options)
    if recorded:
        out.backward(torch.randn_like(out))
    assert len(_fwd_plan._plans) == 1 and len(_bwd_plan._plans) == int(recorded)
    # Same shapes, other contents: a plan that kept the first call's pointers reads wrong lengths.
    cu_q, cu_k = cu([5, 127, 1, 17], device), cu([40, 1, 17, 127], device)
    used = torch.tensor([33, 1, 17, 100], dtype=torch.int32, device=device)
    q, k, v = _packed(150, 185, device, recorded)
    dout = torch.randn_like(q)
    hits = _fwd_plan.hits, _bwd_plan.hits
    with torch.set_grad_enabled(recorded):
        out = _call(q, k, v, cu_q, cu_k, used, **options)
    grads = None
    if recorded:
        out.backward(dout)
        grads = (q.grad, k.grad, v.grad)
    assert (_fwd_plan.hits, _bwd_plan.hits) == (hits[0] + 1, hits[1] + int(recorded))
    _fwd_plan._plans.clear()
    _bwd_plan._plans.clear()
    again = [x.detach().clone().requires_grad_(recorded) for x in (q, k, v)]
    with torch.set_grad_enabled(recorded):
        full = _call(*again, cu_q, cu_k, used, **options)
    assert torch.equal(out, full)
    if recorded:
        full.backward(dout)
        for ours, theirs in zip(grads, (x.grad for x in again)):
            assert torch.equal(ours, theirs)
    _check(q, k, v, dout, out, cu_q, cu_k, used, grads, options)


def test_copied_index_tensors_get_no_plan(device):
    q, k, v = _packed(20, 30, device, False)
    strided = torch.zeros(6, dtype=torch.int32, device=device)
    strided[::2] = cu([9, 11], device)
    cu_q = strided[::2]  # not contiguous: the checks copy it
    cu_k = cu([10, 20], device)
    expect = flash_attn_varlen_func(q, k, v, cu_q.contiguous(), cu_k, 11, 20)
    _fwd_plan._plans.clear()
    for _ in range(2):
        assert torch.equal(flash_attn_varlen_func(q, k, v, cu_q, cu_k, 11, 20), expect)
    assert not len(_fwd_plan._plans)
