"""TILEATTN_BACKWARD_WS=auto runs the warp-specialized Hopper backward where its rule
(src/cuda/sm90/bwd_ws_launch.cuh, bwd_ws_serves) says, at the thresholds whose two sides can be
told apart from outside.

Deterministic gradients are reproducible bits, so where the two kernels order their dQ sums
differently, auto's bits name the kernel that ran: they must equal those of the kernel forced on
(WS=1) where the rule takes it and forced off (WS=0) elsewhere.  That holds at d64 without a mask.
At d128 and d256, and at d64 under a causal mask or a window, the two kernels gave the same
deterministic dQ bits in session 80's runs (H100), so those thresholds cannot be checked this
way; a case whose kernels agree fails here rather than passing without having looked."""

import pytest
import torch

import tileattn
from tileattn import flash_attn_func

# (head_dim, seqlen_q, dropout_p, auto takes the warp-specialized kernel): at d <= 64 without a
# mask from 512 query rows, and never with dropout.
CASES = [
    (64, 511, 0.0, False),
    (64, 512, 0.0, True),
    (64, 1024, 0.1, False),
]


def _gradients(monkeypatch, choice, leaves, dropout_p):
    monkeypatch.setenv("TILEATTN_BACKWARD_WS", choice)
    for x in leaves:
        x.grad = None
    torch.manual_seed(7)  # the same dropout mask for every choice
    out = flash_attn_func(*leaves, dropout_p=dropout_p, deterministic=True)
    out.backward(torch.ones_like(out))
    return [x.grad.clone() for x in leaves]


@pytest.mark.parametrize("head_dim, seqlen_q, dropout_p, takes_it", CASES)
def test_auto_runs_the_kernel_its_rule_names(monkeypatch, head_dim, seqlen_q, dropout_p, takes_it):
    if not (torch.cuda.is_available() and tileattn.has_cuda() and torch.cuda.get_device_capability() == (9, 0)):
        pytest.skip("TILEATTN_BACKWARD_WS picks among the Hopper backward's kernels")
    # The suite also runs with the sm80 backward family forced, which has no warp-specialized kernel.
    monkeypatch.setenv("TILEATTN_BACKWARD_FAMILY", "auto")
    on = dict(device="cuda", dtype=torch.bfloat16)
    # 2 query heads over 1 KV head: a dK/dV reduction over the group on both kernels.
    leaves = [torch.randn(1, seqlen_q, 2, head_dim, **on).requires_grad_()]
    leaves += [torch.randn(1, seqlen_q, 1, head_dim, **on).requires_grad_() for _ in range(2)]
    grads = {choice: _gradients(monkeypatch, choice, leaves, dropout_p)
             for choice in ("0", "1", "auto")}
    assert not torch.equal(grads["0"][0], grads["1"][0]), "dQ cannot tell the two kernels apart"
    expected = grads["1" if takes_it else "0"]
    for name, got, want in zip(("dq", "dk", "dv"), grads["auto"], expected):
        assert torch.equal(got, want), f"auto's {name} is not the {'warp-specialized' if takes_it else 'FA2'} kernel's"
