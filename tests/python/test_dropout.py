"""Dropout: the mask is the documented Philox mapping of torch's generator state, torch.manual_seed
reproduces a run, the backward reuses the forward's mask, and the output is unbiased on average."""

import pytest
import torch

import attn_reference as ref
from conftest import FLOOR, assert_fa_close, dtypes_for, rand
from tileattn import flash_attn_func, flash_attn_varlen_func


def keep_from_probs(probs):
    """attn_probs stores dropped entries negated (zeros carry no information)."""
    return ~torch.signbit(probs)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_mask_is_the_philox_mapping_and_gradients_match(device, causal, head_dim):
    batch, seqlen_q, seqlen_k, heads, heads_k, p = 2, 37, 130, 6, 3, 0.17
    for dtype in dtypes_for(device):
        q = rand(batch, seqlen_q, heads, head_dim, dtype=dtype, device=device, requires_grad=True)
        k = rand(batch, seqlen_k, heads_k, head_dim, dtype=dtype, device=device, requires_grad=True)
        v = rand(batch, seqlen_k, heads_k, head_dim, dtype=dtype, device=device, requires_grad=True)
        dout = torch.randn_like(q)
        # The op itself returns the (seed, offset) it drew; the Python API hides it.
        out, lse, probs, rng_state = torch.ops.tileattn.fwd(
            q, k, v, p, head_dim ** -0.5, -1, 0 if causal else -1, 0.0, None, True, False)
        seed, offset = (int(x) % (1 << 64) for x in rng_state.tolist())
        keep = ref.dropout_keep(seed, offset, batch, heads, seqlen_q, seqlen_k, p).to(device)
        visible = probs != 0
        assert torch.equal(keep_from_probs(probs)[visible], keep[visible]), \
            "attn_probs' dropped entries differ from the Philox mapping"
        # Draw unrelated random numbers between forward and backward: the backward must reuse
        # the forward's (seed, offset), not the generator's current state.
        torch.rand(1000, device=device)
        out.backward(dout)

        window = dict(window_left=-1, window_right=0 if causal else -1)
        truth = ref.attention(q, k, v, dout, keep=keep, dropout_p=p, **window)
        naive = ref.attention(q, k, v, dout, dtype=dtype, keep=keep, dropout_p=p, **window)
        floor = FLOOR[dtype]
        assert_fa_close("out", out, naive["out"], truth["out"], floor)
        assert_fa_close("lse", lse, naive["lse"], truth["lse"], floor)
        assert_fa_close("attn_probs", probs.abs(), naive["probs"], truth["probs"], floor)
        for name, grad in (("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
            assert_fa_close(name, grad, naive[name], truth[name], floor)


def test_manual_seed_reproduces(device):
    q = rand(2, 50, 4, 32, dtype=torch.bfloat16, device=device)
    k = rand(2, 70, 2, 32, dtype=torch.bfloat16, device=device)
    runs = []
    for seed in (1234, 1234, 99):
        torch.manual_seed(seed)
        leaves = [x.clone().requires_grad_() for x in (q, k, k)]
        out, _, probs = flash_attn_func(*leaves, dropout_p=0.3, return_attn_probs=True)
        out.sum().backward()
        runs.append((out, probs, [x.grad for x in leaves]))
    (out_a, probs_a, grads_a), (out_b, probs_b, grads_b), (out_c, probs_c, _) = runs
    assert torch.equal(out_a, out_b) and torch.equal(probs_a, probs_b)
    assert all(torch.equal(a, b) for a, b in zip(grads_a, grads_b))
    assert not torch.equal(probs_a, probs_c)
    # Two calls in a row draw different masks.
    torch.manual_seed(5)
    first = flash_attn_func(q, k, k, dropout_p=0.3)
    second = flash_attn_func(q, k, k, dropout_p=0.3)
    assert not torch.equal(first, second)


def test_dropout_keeps_the_right_fraction_and_is_unbiased(device):
    p, runs = 0.25, 300
    q = rand(1, 24, 2, 16, dtype=torch.float32 if device == "cpu" else torch.float16, device=device)
    k = torch.randn(1, 40, 2, 16, dtype=q.dtype, device=device)
    v = torch.randn_like(k)
    expected = flash_attn_func(q, k, v)
    outs, kept = [], 0.0
    for _ in range(runs):
        out, _, probs = flash_attn_func(q, k, v, dropout_p=p, return_attn_probs=True)
        outs.append(out.double())
        kept += keep_from_probs(probs).double().mean().item()
    kept /= runs
    draws = runs * probs.numel()
    sigma = (p * (1 - p) / draws) ** 0.5
    assert abs(kept - (1 - p)) < 6 * sigma, f"kept fraction {kept:.4f}, expected {1 - p}"
    samples = torch.stack(outs)
    mean, stderr = samples.mean(0), samples.std(0) / runs ** 0.5
    z = (mean - expected.double()).abs() / stderr.clamp_min(1e-6)
    # Unbiased: the mean of many dropout runs converges to the no-dropout output.
    assert z.max() < 6, f"dropout mean is {z.max():.1f} standard errors from the expectation"
    assert z.mean() < 1.2


def test_varlen_dropout_uses_per_sequence_coordinates(device):
    lengths_q, lengths_k, p = [5, 40], [30, 7], 0.3
    cu_q = torch.tensor([0, 5, 45], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 30, 37], dtype=torch.int32, device=device)
    q = rand(45, 4, 32, dtype=torch.bfloat16, device=device)
    k = rand(37, 2, 32, dtype=torch.bfloat16, device=device)
    out, lse, probs, rng_state = torch.ops.tileattn.varlen_fwd(
        q, k, k, cu_q, cu_k, None, 40, 30, p, 32 ** -0.5, -1, -1, 0.0, None, True, False)
    seed, offset = (int(x) % (1 << 64) for x in rng_state.tolist())
    keep = ref.dropout_keep(seed, offset, 2, 4, 40, 30, p).to(device)
    for b, (len_q, len_k) in enumerate(zip(lengths_q, lengths_k)):
        block = probs[b, :, :len_q, :len_k]
        assert torch.equal(keep_from_probs(block), keep[b, :, :len_q, :len_k])


def test_consecutive_calls_reserve_distinct_streams(device):
    """Each call must advance the generator by batch * heads streams (rounded up to 4)."""
    q = rand(3, 8, 5, 16, dtype=torch.float16, device=device)
    torch.manual_seed(0)
    states = [torch.ops.tileattn.fwd(q, q[:, :, :1], q[:, :, :1], 0.5, 0.25, -1, -1, 0.0, None,
                                     False, False)[3].tolist() for _ in range(3)]
    if device == "cuda":
        offsets = [offset for _, offset in states]
        assert offsets[1] - offsets[0] == 16 and offsets[2] - offsets[1] == 16
        assert len({seed for seed, _ in states}) == 1
    else:  # the CPU generator has no offset: a fresh seed per call, offset 0
        assert len({seed for seed, _ in states}) == 3 and all(o == 0 for _, o in states)
