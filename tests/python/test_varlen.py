"""flash_attn_varlen_func: each packed sequence must equal batch-form attention of that sequence
alone (float64 reference, FA's rule), with empty sequences, GQA and every option."""

import pytest
import torch

import attn_reference as ref
from conftest import FLOOR, assert_fa_close, dtypes_for
from tileattn import flash_attn_varlen_func

# (seqlens_q, seqlens_k): ugly lengths, a query-less sequence and a key-less one.
LENGTHS = [
    ([1], [1]),
    ([17, 1, 127, 5], [127, 17, 1, 40]),
    ([0, 33, 64], [9, 0, 200]),
    ([300, 1], [1000, 1]),
]


def cu(lengths, device):
    lengths = torch.tensor([0] + lengths, dtype=torch.int32, device=device)
    return lengths.cumsum(0, dtype=torch.int32)


def run_varlen(device, dtype, seqlens_q, seqlens_k, num_heads=6, num_heads_k=2, head_dim=48, *,
               causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
               seqused_k=None, tail_rows=0):
    """tail_rows: extra packed rows after the last sequence (must not be read or disturbed)."""
    total_q, total_k = sum(seqlens_q) + tail_rows, sum(seqlens_k) + tail_rows
    q = torch.randn(total_q, num_heads, head_dim, dtype=dtype, device=device, requires_grad=True)
    k = torch.randn(total_k, num_heads_k, head_dim, dtype=dtype, device=device, requires_grad=True)
    v = torch.randn(total_k, num_heads_k, head_dim, dtype=dtype, device=device, requires_grad=True)
    dout = torch.randn_like(q)
    cu_q, cu_k = cu(seqlens_q, device), cu(seqlens_k, device)
    max_q, max_k = max(max(seqlens_q), 1), max(max(seqlens_k), 1)
    out, lse, probs = flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max_q, max_k, causal=causal, window_size=window_size,
        softcap=softcap, alibi_slopes=alibi_slopes, return_attn_probs=True, seqused_k=seqused_k)
    out.backward(dout)
    assert out.shape == q.shape and lse.shape == (num_heads, total_q)
    assert probs.shape == (len(seqlens_q), num_heads, max_q, max_k)

    check_sequences(q, k, v, dout, out, lse, probs, q.grad, k.grad, v.grad, cu_q, cu_k, seqlens_q,
                    seqlens_k, seqused_k=seqused_k, causal=causal, window_size=window_size,
                    softcap=softcap, alibi_slopes=alibi_slopes)


def check_sequences(q, k, v, dout, out, lse, probs, dq, dk, dv, cu_q, cu_k, seqlens_q, seqlens_k, *,
                    seqused_k=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None):
    """Each packed sequence of a varlen call's results against batch-form attention of that
    sequence alone (float64 reference, FA's rule); k, v, dk, dv are packed by cu_k."""
    floor = FLOOR[q.dtype]
    for b, (len_q, len_k) in enumerate(zip(seqlens_q, seqlens_k)):
        rows = slice(int(cu_q[b]), int(cu_q[b]) + len_q)
        keys = slice(int(cu_k[b]), int(cu_k[b]) + len_k)
        used_k = len_k if seqused_k is None else int(seqused_k[b])
        used = slice(keys.start, keys.start + used_k)
        slopes = None
        if alibi_slopes is not None:
            slopes = alibi_slopes if alibi_slopes.dim() == 1 else alibi_slopes[b]
        options = dict(window_left=window_size[0], window_right=0 if causal else window_size[1],
                       softcap=softcap, alibi_slopes=slopes)
        one = lambda x, r: x[r].unsqueeze(0)  # noqa: E731
        args = (one(q, rows), one(k, used), one(v, used), one(dout, rows))
        truth = ref.attention(*args, dtype=torch.float64, **options)
        naive = ref.attention(*args, dtype=q.dtype, **options)
        tag = f"sequence {b} ({len_q}x{used_k})"
        assert_fa_close(f"{tag} out", out[rows].unsqueeze(0), naive["out"], truth["out"], floor)
        assert_fa_close(f"{tag} lse", lse[:, rows].unsqueeze(0), naive["lse"], truth["lse"], floor)
        assert_fa_close(f"{tag} probs", probs[b, :, :len_q, :used_k].unsqueeze(0),
                        naive["probs"], truth["probs"], floor)
        assert torch.all(probs[b, :, len_q:] == 0) and torch.all(probs[b, :, :, used_k:] == 0), \
            f"{tag}: attn_probs outside the sequence must be 0"
        seq_q, seq_k, seq_v, seq_dout = args
        shift = ref.backward_rounding_shift(seq_q, seq_k, seq_v, seq_dout, one(out, rows), truth["out"],
                                            **options)
        for name, grad, where in (("dq", dq, rows), ("dk", dk, used), ("dv", dv, used)):
            assert_fa_close(f"{tag} {name}", grad[where].unsqueeze(0), naive[name], truth[name],
                            floor, lse=truth["lse"], shift=shift.get(name))
        unused = slice(used.stop, keys.stop)
        assert torch.all(dk[unused] == 0) and torch.all(dv[unused] == 0), \
            f"{tag}: keys past seqused_k must get zero gradient"


@pytest.mark.parametrize("lengths", LENGTHS, ids=lambda l: "-".join(map(str, l[0])))
@pytest.mark.parametrize("mask", ["none", "causal", "window"])
def test_varlen_masks(device, lengths, mask):
    causal = mask == "causal"
    window_size = (13, 2) if mask == "window" else (-1, -1)
    for dtype in dtypes_for(device):
        run_varlen(device, dtype, *lengths, causal=causal, window_size=window_size)


@pytest.mark.parametrize("option", ["softcap", "alibi_h", "alibi_bh", "gqa7", "seqused_k"])
def test_varlen_options(device, option):
    seqlens_q, seqlens_k = [17, 1, 127, 5], [127, 17, 1, 40]
    kwargs = {}
    if option == "softcap":
        kwargs = dict(softcap=2.0, causal=True)
    elif option == "alibi_h":
        kwargs = dict(alibi_slopes=torch.rand(6, device=device) * 0.3)
    elif option == "alibi_bh":
        kwargs = dict(alibi_slopes=torch.rand(4, 6, device=device) * 0.3, causal=True)
    elif option == "gqa7":
        kwargs = dict(num_heads=7, num_heads_k=1, head_dim=64)
    else:
        kwargs = dict(seqused_k=torch.tensor([100, 3, 0, 40], dtype=torch.int32, device=device))
    for dtype in dtypes_for(device):
        run_varlen(device, dtype, seqlens_q, seqlens_k, **kwargs)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cpu_backward_reads_no_stale_buffer(device, dtype):
    """The CPU backward's large buffers (dQ's partial sums, dK and dV per query head, the packed Q
    and dO) start uninitialized, and malloc hands a call the blocks the previous call of the same
    sizes freed.  A call whose gradients are all NaN leaves NaN in them; the next call, of the same
    totals but with a query-less sequence, keys past seqused_k and a key-less one, must read only
    what it wrote itself."""
    if device != "cpu":
        pytest.skip("the buffer cache is the CPU backend's")
    total_q, total_k = 2000, 2100  # dQ's partial sums: 6 heads x 2000 rows x 48 x 4 bytes = 2.3 MB
    nan = dict(dtype=dtype, device=device)
    q = torch.full((total_q, 6, 48), float("nan"), **nan, requires_grad=True)
    k = torch.full((total_k, 2, 48), float("nan"), **nan, requires_grad=True)
    v = torch.full((total_k, 2, 48), float("nan"), **nan, requires_grad=True)
    out = flash_attn_varlen_func(q, k, v, cu([700, 700, 600], device), cu([700, 700, 700], device), 700, 700)
    out.backward(torch.ones_like(out))
    assert q.grad.isnan().all() and k.grad.isnan().all()
    run_varlen(device, dtype, [0, 17, 1983], [1500, 0, 600],
               seqused_k=torch.tensor([1400, 0, 150], dtype=torch.int32, device=device))


def test_varlen_rows_past_the_last_sequence(device):
    """Packed tensors may hold rows after cu_seqlens[-1]; the call must accept them."""
    run_varlen(device, torch.bfloat16, [5, 9], [7, 3], tail_rows=0)
    total = 20
    q = torch.randn(total, 2, 16, dtype=torch.bfloat16, device=device)
    cu_seqlens = torch.tensor([0, 5, 12], dtype=torch.int32, device=device)
    out = flash_attn_varlen_func(q, q, q, cu_seqlens, cu_seqlens, 7, 7)
    assert not torch.isnan(out[:12]).any()


def test_varlen_probs_past_memory_name_return_attn_probs(device):
    """attn_probs is sized by the bounds the caller gives; one that cannot be allocated raises
    torch's error type with the argument that asked for it."""
    q = torch.randn(10, 2, 16, dtype=torch.bfloat16, device=device)
    cu_seqlens = cu([10], device)
    with pytest.raises(RuntimeError, match="return_attn_probs"):
        flash_attn_varlen_func(q, q, q, cu_seqlens, cu_seqlens, 2**31 - 1, 2**31 - 1, return_attn_probs=True)


@pytest.mark.parametrize("deterministic", [False, True])
def test_varlen_loose_max_seqlen_is_only_a_bound(device, deterministic):
    """max_seqlen_q/k bound the sequences' lengths; a model's largest (2**31 - 1 here) gives the
    same bits as the tight bounds, forward and backward (the library lowers them to the packed
    rows it holds)."""
    seqlens_q, seqlens_k = [17, 0, 40], [33, 5, 64]
    q = torch.randn(sum(seqlens_q), 6, 64, dtype=torch.bfloat16, device=device)
    k = torch.randn(sum(seqlens_k), 2, 64, dtype=torch.bfloat16, device=device)
    v = torch.randn_like(k)
    dout = torch.randn_like(q)
    results = []
    for bounds in ((40, 64), (2**31 - 1, 2**31 - 1)):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out = flash_attn_varlen_func(*leaves, cu(seqlens_q, device), cu(seqlens_k, device), *bounds,
                                     causal=True, deterministic=deterministic)
        out.backward(dout)
        results.append([out] + [x.grad for x in leaves])
    for tight, loose in zip(*results):
        assert not tight.isnan().any() and torch.equal(tight, loose)


def test_varlen_deterministic_backward_is_bitwise_stable(device):
    seqlens = [33, 200, 1]
    q = torch.randn(sum(seqlens), 8, 64, dtype=torch.float16, device=device)
    k = torch.randn(sum(seqlens), 2, 64, dtype=torch.float16, device=device)
    v = torch.randn_like(k)
    dout = torch.randn_like(q)
    cu_seqlens = cu(seqlens, device)
    grads = []
    for _ in range(2):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out = flash_attn_varlen_func(*leaves, cu_seqlens, cu_seqlens, 200, 200, causal=True,
                                     deterministic=True)
        out.backward(dout)
        grads.append([x.grad for x in leaves])
    for a, b in zip(*grads):
        assert torch.equal(a, b)


# Index arrays that break validate_sequence_lengths' rules, over 12 packed rows of two sequences
# of 5 and 7 (max_seqlen 7): (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, seqused_k).
BAD_INDICES = {
    "rows past the packed tensor": ([0, 5, 13], [0, 5, 12], 8, None),
    "not monotone": ([0, 8, 5], [0, 5, 12], 8, None),
    "negative start": ([-2, 5, 12], [0, 5, 12], 7, None),
    "longer than max_seqlen": ([0, 5, 12], [0, 5, 12], 6, None),
    "seqused_k past its keys": ([0, 5, 12], [0, 5, 12], 7, [6, 7]),
}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("case", list(BAD_INDICES))
def test_cuda_out_of_bounds_indices_give_nan(case):
    """The CUDA backend reads no index array on the host (a sync).  A call whose cu_seqlens or
    seqused_k break a rule the CPU backend raises for gets NaN in every output, forward and
    backward, and nothing read or written out of bounds (a later call still runs)."""
    cu_q, cu_k, max_q, used = BAD_INDICES[case]
    device, dtype = "cuda", torch.bfloat16
    q = torch.randn(12, 4, 64, dtype=dtype, device=device, requires_grad=True)
    k = torch.randn(12, 2, 64, dtype=dtype, device=device, requires_grad=True)
    v = torch.randn(12, 2, 64, dtype=dtype, device=device, requires_grad=True)
    index = lambda values: torch.tensor(values, dtype=torch.int32, device=device)  # noqa: E731
    out, lse, _ = flash_attn_varlen_func(q, k, v, index(cu_q), index(cu_k), max_q, 7,
                                         seqused_k=None if used is None else index(used),
                                         return_attn_probs=True)
    out.backward(torch.randn_like(out))
    for name, x in (("out", out), ("lse", lse), ("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
        assert torch.isnan(x).all(), f"{case}: {name} has non-NaN entries"
    good = flash_attn_varlen_func(q, k, v, index([0, 5, 12]), index([0, 5, 12]), 7, 7)
    torch.cuda.synchronize()
    assert not torch.isnan(good).any()
