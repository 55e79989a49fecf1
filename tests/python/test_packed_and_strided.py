"""Packed QKV/KV variants equal the unpacked functions, and non-contiguous inputs (views of a packed
qkv, transposed storage, a non-unit head-dim stride) give the same result as contiguous copies."""

import pytest
import torch

from conftest import rand
from tileattn import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                      flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                      flash_attn_varlen_qkvpacked_func)

OPTIONS = dict(causal=True, window_size=(20, -1), softcap=3.0, return_attn_probs=True)


def grads_of(fn, inputs, dout):
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    out, lse, probs = fn(*leaves)
    out.backward(dout)
    return (out, lse, probs), [x.grad for x in leaves]


def assert_same(a, b):
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_qkvpacked_equals_unpacked(device):
    qkv = rand(2, 77, 3, 4, 64, dtype=torch.bfloat16, device=device)
    dout = torch.randn(2, 77, 4, 64, dtype=torch.bfloat16, device=device)
    alibi = torch.rand(4, device=device) * 0.2
    packed, (dqkv,) = grads_of(
        lambda x: flash_attn_qkvpacked_func(x, alibi_slopes=alibi, **OPTIONS), [qkv], dout)
    plain, dqkv_split = grads_of(
        lambda q, k, v: flash_attn_func(q, k, v, alibi_slopes=alibi, **OPTIONS),
        [qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]], dout)
    assert_same(packed, plain)
    assert torch.equal(dqkv, torch.stack(dqkv_split, dim=2))


def test_kvpacked_equals_unpacked(device):
    q = rand(3, 19, 14, 32, dtype=torch.float16, device=device)
    kv = rand(3, 130, 2, 2, 32, dtype=torch.float16, device=device)
    dout = torch.randn_like(q)
    packed, (dq, dkv) = grads_of(lambda a, b: flash_attn_kvpacked_func(a, b, **OPTIONS),
                                 [q, kv], dout)
    plain, (dq2, dk, dv) = grads_of(lambda a, b, c: flash_attn_func(a, b, c, **OPTIONS),
                                    [q, kv[:, :, 0], kv[:, :, 1]], dout)
    assert_same(packed, plain)
    assert torch.equal(dq, dq2) and torch.equal(dkv, torch.stack([dk, dv], dim=2))


def test_varlen_packed_equal_unpacked(device):
    cu_seqlens = torch.tensor([0, 17, 18, 145], dtype=torch.int32, device=device)
    qkv = rand(145, 3, 6, 40, dtype=torch.bfloat16, device=device)
    dout = torch.randn(145, 6, 40, dtype=torch.bfloat16, device=device)
    packed, (dqkv,) = grads_of(
        lambda x: flash_attn_varlen_qkvpacked_func(x, cu_seqlens, 127, **OPTIONS), [qkv], dout)
    plain, split = grads_of(
        lambda q, k, v: flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, 127, 127,
                                               **OPTIONS),
        qkv.unbind(1), dout)
    assert_same(packed, plain)
    assert torch.equal(dqkv, torch.stack(split, dim=1))

    q = rand(145, 6, 40, dtype=torch.bfloat16, device=device)
    kv = rand(145, 2, 3, 40, dtype=torch.bfloat16, device=device)
    packed, (dq, dkv) = grads_of(
        lambda a, b: flash_attn_varlen_kvpacked_func(a, b, cu_seqlens, cu_seqlens, 127, 127,
                                                     **OPTIONS), [q, kv], dout)
    plain, (dq2, dk, dv) = grads_of(
        lambda a, b, c: flash_attn_varlen_func(a, b, c, cu_seqlens, cu_seqlens, 127, 127,
                                               **OPTIONS),
        [q, kv[:, 0], kv[:, 1]], dout)
    assert_same(packed, plain)
    assert torch.equal(dq, dq2) and torch.equal(dkv, torch.stack([dk, dv], dim=1))


# float32: the CPU reads Q and K/V tiles of float32 calls in place, at the views' strides.
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_non_contiguous_inputs_match_contiguous(device, dtype):
    if device == "cuda" and dtype == torch.float32:
        pytest.skip("the CUDA kernels take fp16 and bf16")
    batch, seqlen, heads, head_dim = 2, 61, 4, 32
    # Views of one packed qkv (row stride 3*H*D), a (B, H, S, D) tensor transposed to (B, S, H, D),
    # and a head dim with stride 2 (copied by the package, as flash-attn does).
    qkv = rand(batch, seqlen, 3, heads, head_dim, dtype=dtype, device=device)
    q = qkv[:, :, 0]
    k = rand(batch, heads, seqlen, head_dim, dtype=dtype, device=device).transpose(1, 2)
    v = rand(batch, seqlen, heads, 2 * head_dim, dtype=dtype, device=device)[..., ::2]
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    dout = torch.randn(batch, seqlen, heads, head_dim, dtype=dtype, device=device)
    # A non-contiguous gradient too: the transposed view of a (B, H, S, D) tensor.
    dout_strided = dout.transpose(1, 2).contiguous().transpose(1, 2)

    def run(inputs, grad):
        leaves = [x.detach().requires_grad_() for x in inputs]
        out = flash_attn_func(*leaves, causal=True)
        out.backward(grad)
        return out, [x.grad for x in leaves]

    out_strided, grads_strided = run([q, k, v], dout_strided)
    out_plain, grads_plain = run([x.contiguous() for x in (q, k, v)], dout)
    assert torch.equal(out_strided, out_plain)
    for a, b in zip(grads_strided, grads_plain):
        assert torch.equal(a, b)


def test_broadcast_batch_stride_zero(device):
    """An expanded K/V (batch stride 0) reads like a materialized copy."""
    q = rand(3, 9, 2, 16, dtype=torch.float16, device=device)
    k1 = rand(1, 21, 2, 16, dtype=torch.float16, device=device)
    out = flash_attn_func(q, k1.expand(3, -1, -1, -1), k1.expand(3, -1, -1, -1))
    expected = flash_attn_func(q, k1.repeat(3, 1, 1, 1), k1.repeat(3, 1, 1, 1))
    assert torch.equal(out, expected)


def test_broadcast_gradient_and_heads_in_backward(device):
    """A dO broadcast from one weight per head-dim column (strides 0, 0, 0, 1, as `(out * w).sum()`
    gives) and K/V expanded over heads (head stride 0), at a size where the Hopper backward would
    pick its TMA-based kernel, which cannot describe stride 0: the same gradients as materialized
    copies, to bf16 rounding."""
    if device != "cuda":
        pytest.skip("the stride-0 rule is the CUDA backend's; 4096 rows are slow on the CPU")
    seqlen, head_dim = 4096, 128
    q = rand(1, seqlen, 2, head_dim, dtype=torch.bfloat16, device=device)
    kv1 = rand(1, seqlen, 1, head_dim, dtype=torch.bfloat16, device=device)
    weight = torch.randn(head_dim, dtype=torch.bfloat16, device=device)

    def run(expanded):
        leaves = [q.detach().requires_grad_(), kv1.detach().requires_grad_()]
        k = leaves[1].expand(-1, -1, 2, -1) if expanded else leaves[1].repeat(1, 1, 2, 1)
        dout = weight.expand(1, seqlen, 2, head_dim)
        flash_attn_func(leaves[0], k, k).backward(dout if expanded else dout.contiguous())
        return [x.grad for x in leaves]

    for a, b in zip(run(True), run(False)):
        assert torch.isfinite(a).all()
        assert (a.float() - b.float()).abs().max() <= 0.02 * b.float().abs().max() + 1e-3


@pytest.mark.parametrize("warp_specialized", ["0", "1"])
def test_backward_without_keys(device, monkeypatch, warp_specialized):
    """No keys at all: dQ is zero and nothing is read (a TMA descriptor cannot have a 0 dimension)."""
    monkeypatch.setenv("TILEATTN_BACKWARD_WS", warp_specialized)
    q = rand(1, 64, 2, 128, dtype=torch.bfloat16, device=device).requires_grad_()
    kv = torch.zeros(1, 0, 2, 128, dtype=torch.bfloat16, device=device)
    flash_attn_func(q, kv, kv).backward(torch.ones(1, 64, 2, 128, dtype=torch.bfloat16, device=device))
    assert torch.equal(q.grad, torch.zeros_like(q))
