"""flash_attn_func forward and backward against the float64 reference, over odd sizes, GQA, masks
and every score option, with FlashAttention's tolerance rule for out, lse, dq, dk and dv."""

import pytest
import torch

import attn_reference as ref
from conftest import FLOOR, assert_fa_close, dtypes_for, rand
from tileattn import flash_attn_func

# (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim): ugly lengths, Sq != Sk both ways,
# 7 query heads per KV head, head dims that are not powers of two.
SHAPES = [
    (1, 1, 1, 1, 1, 32),
    (2, 17, 127, 4, 2, 64),
    (1, 127, 17, 7, 1, 40),
    (2, 1, 1000, 2, 1, 64),
    (1, 1000, 1000, 2, 2, 64),
    (3, 113, 203, 14, 2, 128),
]
MASKS = {"none": (False, (-1, -1)), "causal": (True, (-1, -1)), "window": (False, (11, 3)),
         "causal_window": (True, (23, -1))}


def run_and_compare(device, dtype, shape, *, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, softmax_scale=None, deterministic=False):
    batch, seqlen_q, seqlen_k, num_heads, num_heads_k, head_dim = shape
    q = rand(batch, seqlen_q, num_heads, head_dim, dtype=dtype, device=device, requires_grad=True)
    k = rand(batch, seqlen_k, num_heads_k, head_dim, dtype=dtype, device=device, requires_grad=True)
    v = rand(batch, seqlen_k, num_heads_k, head_dim, dtype=dtype, device=device, requires_grad=True)
    dout = torch.randn(batch, seqlen_q, num_heads, head_dim, dtype=dtype, device=device)

    out, lse, probs = flash_attn_func(q, k, v, softmax_scale=softmax_scale, causal=causal,
                                      window_size=window_size, softcap=softcap,
                                      alibi_slopes=alibi_slopes, deterministic=deterministic,
                                      return_attn_probs=True)
    out.backward(dout)

    window_left, window_right = window_size[0], 0 if causal else window_size[1]
    options = dict(softmax_scale=softmax_scale, window_left=window_left,
                   window_right=window_right, softcap=softcap, alibi_slopes=alibi_slopes)
    truth = ref.attention(q, k, v, dout, dtype=torch.float64, **options)
    naive = ref.attention(q, k, v, dout, dtype=dtype, **options)

    assert out.shape == q.shape and out.dtype == dtype and out.device == q.device
    assert lse.shape == (batch, num_heads, seqlen_q) and lse.dtype == torch.float32
    assert probs.shape == (batch, num_heads, seqlen_q, seqlen_k) and probs.dtype == torch.float32
    floor = FLOOR[dtype]
    assert_fa_close("out", out, naive["out"], truth["out"], floor)
    assert_fa_close("lse", lse, naive["lse"], truth["lse"], floor)
    assert_fa_close("attn_probs", probs, naive["probs"], truth["probs"], floor)
    shift = ref.backward_rounding_shift(q, k, v, dout, out, truth["out"], **options)
    for name, ours in (("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
        assert ours.shape == truth[name].shape and ours.dtype == dtype
        assert_fa_close(name, ours, naive[name], truth[name], floor, lse=truth["lse"],
                        shift=shift.get(name))
    return out, (q.grad, k.grad, v.grad)


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_masks_and_sizes(device, shape, mask):
    causal, window_size = MASKS[mask]
    for dtype in dtypes_for(device):
        run_and_compare(device, dtype, shape, causal=causal, window_size=window_size)


OPTION_SHAPES = [(2, 17, 127, 4, 2, 64), (1, 127, 17, 7, 1, 96)]


@pytest.mark.parametrize("shape", OPTION_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("option", ["softcap", "alibi_h", "alibi_bh", "scale", "everything"])
def test_score_options(device, shape, option):
    batch, _, _, num_heads, _, _ = shape
    for dtype in dtypes_for(device):
        kwargs = {}
        if option == "softcap":
            kwargs = dict(softcap=1.5, softmax_scale=1.0)  # a scale that makes the cap bite
        elif option == "alibi_h":
            kwargs = dict(alibi_slopes=torch.rand(num_heads, device=device) * 0.3)
        elif option == "alibi_bh":
            kwargs = dict(alibi_slopes=torch.rand(batch, num_heads, device=device) * 0.3)
        elif option == "scale":
            kwargs = dict(softmax_scale=0.37)
        else:
            kwargs = dict(causal=True, window_size=(9, -1), softcap=4.0,
                          alibi_slopes=torch.rand(batch, num_heads, device=device) * 0.2)
        run_and_compare(device, dtype, shape, **kwargs)


def test_rows_that_see_no_key(device):
    """Sq > Sk with causal: the first Sq - Sk rows see nothing: out 0, lse +inf, gradients 0."""
    shape = (2, 40, 9, 4, 2, 32)
    out, (dq, _, _) = run_and_compare(device, torch.bfloat16, shape, causal=True)
    assert torch.all(out[:, :31] == 0)
    assert torch.all(dq[:, :31] == 0)


def test_window_wider_than_sequence(device):
    run_and_compare(device, torch.float16, (1, 33, 65, 2, 1, 64), window_size=(500, 500))
    run_and_compare(device, torch.float16, (1, 33, 65, 2, 1, 64), window_size=(0, 0))


@pytest.mark.parametrize("window_size", [(2**31 - 1, 2**31 - 1), (2**40, 2**33), (2**32, -1)])
@pytest.mark.parametrize("causal", [False, True])
def test_window_past_int32(device, window_size, causal):
    """Windows at and past the library's 32-bit range mean "no limit on that side": they must
    neither wrap around (2**32 read as 0) nor overflow the kernels' row + Sk - Sq + window."""
    run_and_compare(device, torch.bfloat16, (2, 17, 127, 4, 2, 64), causal=causal,
                    window_size=window_size)


def test_deterministic_backward_is_bitwise_stable(device):
    shape = (2, 127, 203, 8, 2, 64)
    batch, seqlen_q, seqlen_k, num_heads, num_heads_k, head_dim = shape
    q = rand(batch, seqlen_q, num_heads, head_dim, dtype=torch.bfloat16, device=device)
    k = rand(batch, seqlen_k, num_heads_k, head_dim, dtype=torch.bfloat16, device=device)
    v = rand(batch, seqlen_k, num_heads_k, head_dim, dtype=torch.bfloat16, device=device)
    dout = torch.randn_like(q)
    grads = []
    for _ in range(3):
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        out = flash_attn_func(*leaves, causal=True, deterministic=True)
        out.backward(dout)
        grads.append([x.grad for x in leaves])
    for later in grads[1:]:
        for a, b in zip(grads[0], later):
            assert torch.equal(a, b)


def test_return_conventions(device):
    q = rand(2, 5, 4, 16, dtype=torch.bfloat16, device=device)
    k = rand(2, 7, 2, 16, dtype=torch.bfloat16, device=device)
    out = flash_attn_func(q, k, k)
    assert isinstance(out, torch.Tensor)
    result = flash_attn_func(q, k, k, return_attn_probs=True)
    assert isinstance(result, tuple) and len(result) == 3
    # The probabilities keep the general forward, while this call's 10 rows a KV group without
    # them run as the group's rows (the CPU's src/cpu/kv_group_rows.cpp; on CUDA the decode
    # kernels, tileattn/_batch_decode_route.py): the same sums in another order, a bf16 rounding
    # apart at most (|out| < 4 here: an ulp of 2^-6).
    torch.testing.assert_close(result[0], out, rtol=0, atol=2 ** -6)
    # No gradient is needed for a call without requires_grad; the output is a plain tensor.
    assert not out.requires_grad


@pytest.mark.parametrize("causal", [False, True])
def test_nan_input_gives_nan_not_zero(device, causal):
    """A NaN score leaves a row's running max alone (max drops NaN), so a row whose scores are
    all NaN looks like a row that saw no key unless l carries the NaN through: such rows must come
    out NaN in O and LSE, never 0 and +inf.  A NaN query row spoils only its row; a NaN key row
    spoils every row that sees it (rows of its KV head group, from its position on when causal)."""
    batch, seqlen_q, seqlen_k, num_heads, num_heads_k, head_dim = 2, 200, 300, 4, 2, 64
    q = rand(batch, seqlen_q, num_heads, head_dim, dtype=torch.bfloat16, device=device)
    k = rand(batch, seqlen_k, num_heads_k, head_dim, dtype=torch.bfloat16, device=device)
    v = rand(batch, seqlen_k, num_heads_k, head_dim, dtype=torch.bfloat16, device=device)
    q[0, 150, 3] = float("nan")
    k[1, 250, 0] = float("nan")
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    nan_out, nan_lse = out.isnan().any(-1), lse.isnan().transpose(1, 2)  # (batch, seqlen_q, heads)
    expect = torch.zeros_like(nan_out)
    expect[0, 150, 3] = True
    first_seeing = 250 - (seqlen_k - seqlen_q) if causal else 0  # bottom-right causal alignment
    expect[1, first_seeing:, :2] = True
    assert torch.equal(nan_out, expect), "O: NaN rows differ from the rows that saw a NaN"
    assert torch.equal(nan_lse, expect), "LSE: NaN rows differ from the rows that saw a NaN"
    assert out[expect].isnan().all(), "a row that saw a NaN has finite entries"
