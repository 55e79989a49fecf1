"""torch.compile(fullgraph=True) traces forward and backward without a graph break and matches
eager; torch.library.opcheck validates each custom op's schema, fake and autograd registration;
dispatch by device."""

import pytest
import torch

import tileattn
from conftest import rand
from tileattn import _ops, flash_attn_func, flash_attn_qkvpacked_func, flash_attn_varlen_func


def eager_and_compiled(fn, inputs, backend):
    results = []
    for f in (fn, torch.compile(fn, fullgraph=True, backend=backend)):
        torch.manual_seed(7)  # the same dropout draws in both runs
        leaves = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
        out = f(*leaves)
        out.backward(torch.ones_like(out))
        results.append((out, [x.grad for x in leaves if x.is_floating_point()]))
    return results


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph_forward_backward(device, backend):
    torch._dynamo.reset()
    q = rand(2, 33, 4, 32, dtype=torch.bfloat16, device=device)
    k = rand(2, 47, 2, 32, dtype=torch.bfloat16, device=device)
    v = rand(2, 47, 2, 32, dtype=torch.bfloat16, device=device)
    slopes = torch.rand(4, device=device) * 0.1

    def fn(q, k, v):
        out = flash_attn_func(q * 1.5, k, v, dropout_p=0.1, causal=True, window_size=(8, -1),
                              softcap=5.0, alibi_slopes=slopes)
        return out.float().square()

    (eager_out, eager_grads), (out, grads) = eager_and_compiled(fn, [q, k, v], backend)
    torch.testing.assert_close(out, eager_out)
    for a, b in zip(grads, eager_grads):
        torch.testing.assert_close(a, b)


def test_compile_varlen_and_packed(device):
    torch._dynamo.reset()
    qkv = rand(77, 3, 2, 16, dtype=torch.float16, device=device)
    cu_seqlens = torch.tensor([0, 30, 77], dtype=torch.int32, device=device)

    def varlen(qkv, cu_seqlens):
        q, k, v = qkv.unbind(1)
        out, lse, _ = flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, 47, 47,
                                             causal=True, return_attn_probs=True)
        return out * lse.t().unsqueeze(-1).exp()

    (eager_out, eager_grads), (out, grads) = eager_and_compiled(
        varlen, [qkv, cu_seqlens], "aot_eager")
    torch.testing.assert_close(out, eager_out)
    torch.testing.assert_close(grads[0], eager_grads[0])

    batch_qkv = rand(2, 21, 3, 2, 16, dtype=torch.float16, device=device)
    (eager_out, eager_grads), (out, grads) = eager_and_compiled(
        lambda x: flash_attn_qkvpacked_func(x, deterministic=True), [batch_qkv], "aot_eager")
    torch.testing.assert_close(out, eager_out)
    torch.testing.assert_close(grads[0], eager_grads[0])


def _fwd_args(device, dtype=torch.bfloat16, alibi=False):
    q = rand(2, 9, 4, 16, dtype=dtype, device=device, requires_grad=True)
    k = rand(2, 13, 2, 16, dtype=dtype, device=device, requires_grad=True)
    v = rand(2, 13, 2, 16, dtype=dtype, device=device, requires_grad=True)
    slopes = torch.rand(2, 4, device=device) if alibi else None
    return (q, k, v, 0.0, 0.25, 4, 0, 2.0, slopes, True, False)


@pytest.mark.parametrize("alibi", [False, True])
def test_opcheck_batch_ops(device, alibi):
    fwd_args = _fwd_args(device, alibi=alibi)
    torch.library.opcheck(torch.ops.tileattn.fwd.default, fwd_args)
    q, k, v = fwd_args[:3]
    out, lse, _, rng_state = torch.ops.tileattn.fwd(*fwd_args)
    dout = torch.randn_like(out)
    torch.library.opcheck(
        torch.ops.tileattn.bwd.default,
        (dout, q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), 0.0, 0.25, 4, 0,
         2.0, fwd_args[8], True, rng_state))


def test_opcheck_varlen_ops(device):
    cu_seqlens_q = torch.tensor([0, 4, 11], dtype=torch.int32, device=device)
    cu_seqlens_k = torch.tensor([0, 9, 10], dtype=torch.int32, device=device)
    seqused_k = torch.tensor([9, 0], dtype=torch.int32, device=device)
    q = rand(11, 4, 16, dtype=torch.float16, device=device, requires_grad=True)
    k = rand(10, 1, 16, dtype=torch.float16, device=device, requires_grad=True)
    v = rand(10, 1, 16, dtype=torch.float16, device=device, requires_grad=True)
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, 7, 9, 0.0, 0.25, -1, 0, 0.0, None,
            True, False)
    torch.library.opcheck(torch.ops.tileattn.varlen_fwd.default, args)
    out, lse, _, rng_state = torch.ops.tileattn.varlen_fwd(*args)
    torch.library.opcheck(
        torch.ops.tileattn.varlen_bwd.default,
        (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(),
         cu_seqlens_q, cu_seqlens_k, seqused_k, 7, 9, 0.0, 0.25, -1, 0, 0.0, None, False,
         rng_state))


def test_autograd_saves_only_inputs_outputs_and_rng(device):
    """The graph keeps q, k, v, out, lse and the rng state: no probabilities, no copies."""
    q, k, v = (rand(1, 64, 2, 16, dtype=torch.bfloat16, device=device, requires_grad=True)
               for _ in range(3))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = flash_attn_func(q, k, v, dropout_p=0.1)
    shapes = sorted(tuple(t.shape) for t in saved if t is not None)
    assert shapes == sorted([tuple(q.shape)] * 4 + [(1, 2, 64), (2,)]), shapes
    out.sum().backward()


def test_backend_dispatch_errors():
    if not tileattn.has_cuda():
        with pytest.raises(RuntimeError, match="without the CUDA backend"):
            _ops._backend(torch.device("cuda", 0))
    q = torch.empty(1, 4, 2, 16, dtype=torch.float16, device="meta")
    with pytest.raises(RuntimeError, match="no tileattn backend") as error:
        flash_attn_func(q, q, q)
    assert error.value.argument == "q"


def test_double_backward_is_refused(device):
    q = rand(1, 5, 1, 8, dtype=torch.float32 if device == "cpu" else torch.float16,
             device=device, requires_grad=True)
    out = flash_attn_func(q, q, q)
    (grad,) = torch.autograd.grad(out.sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        grad.sum().backward()


def test_eager_fast_path_matches_the_op(device):
    """Without autograd recording, flash_attn_func calls the op's implementation directly; the
    result must be bitwise the op's."""
    q, k, v = (torch.randn(2, 33, 4, 64, device=device, dtype=torch.bfloat16) for _ in range(3))
    with torch.no_grad():
        fast = tileattn.flash_attn_func(q, k, v, causal=True)
    through_op = torch.ops.tileattn.fwd(q, k, v, 0.0, 64 ** -0.5, -1, 0, 0.0, None, False, False)[0]
    assert torch.equal(fast, through_op)
    assert not tileattn._ops._dispatch_needed(q, k, v)
    assert tileattn._ops._dispatch_needed(q.clone().requires_grad_(), k, v)


def test_eager_autograd_path_matches_the_op(device):
    """With autograd recording, eager flash_attn_func runs a torch.autograd.Function over the op's
    implementations; its output and gradients must be bitwise the op's."""
    dtype = torch.bfloat16
    q, k, v = (torch.randn(2, 33, 4, 64, device=device, dtype=dtype, requires_grad=True)
               for _ in range(3))
    dout = torch.randn_like(q)
    fast = tileattn.flash_attn_func(q, k, v, causal=True, deterministic=True)
    fast_grads = torch.autograd.grad(fast, (q, k, v), dout)
    through_op = torch.ops.tileattn.fwd(q, k, v, 0.0, 64 ** -0.5, -1, 0, 0.0, None, False, True)[0]
    op_grads = torch.autograd.grad(through_op, (q, k, v), dout)
    assert torch.equal(fast, through_op)
    for name, a, b in zip("qkv", fast_grads, op_grads):
        assert torch.equal(a, b), f"d{name} differs"


class _NoGradient(torch.autograd.Function):
    """Identity whose backward sends no gradient (None) on."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return None


def test_backward_without_a_gradient_for_out(device):
    """The eager path does not build zero gradients for unused outputs, so its backward can be
    reached with no gradient for out at all: q, k, v then get none from attention."""
    q, k, v = (rand(1, 17, 2, 16, dtype=torch.bfloat16, device=device, requires_grad=True)
               for _ in range(3))
    out = flash_attn_func(q, k, v)
    (_NoGradient.apply(out).float().sum() + q.float().sum()).backward()
    assert torch.equal(q.grad, torch.ones_like(q))
    assert k.grad is None or not k.grad.any()
