"""The FA1-style Triton kernel against a float64 reference, by FlashAttention's rule:
max|ours - ref| <= 2 max|naive - ref| + floor, naive being the same attention in the inputs' dtype."""
import math

import pytest
import torch

from bench.fa1_triton import fa1_attention

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Triton's interpreter mis-reads bfloat16 tensors on the CPU (seen with Triton 3.6): fp16 there.
DTYPES = [torch.float16, torch.bfloat16] if DEVICE == "cuda" else [torch.float16]


def attention(q, k, v, causal, dtype):
    """Plain softmax(Q K^T / sqrt(d)) V in `dtype`; (batch, seqlen, heads, d) in and out."""
    q, k, v = (x.to(dtype).transpose(1, 2) for x in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        sq, sk = s.shape[-2:]
        rows = torch.arange(sq, device=s.device)[:, None]
        cols = torch.arange(sk, device=s.device)[None, :]
        s = s.masked_fill(cols > rows + (sk - sq), float("-inf"))
    p = torch.softmax(s.float(), -1).to(dtype)
    p = torch.nan_to_num(p, nan=0.0)  # rows that see no key: O = 0, as the kernel writes
    return (p @ v).transpose(1, 2)


CASES = [  # batch, seqlen_q, seqlen_k, heads, heads_k, d
    (1, 1, 1, 1, 1, 64),
    (2, 17, 17, 2, 1, 64),
    (1, 127, 1000, 7, 1, 128),
    (1, 1000, 127, 2, 2, 72),
    (1, 130, 130, 1, 1, 256),
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("rows_per_program", [None, 32])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matches_float64(case, causal, rows_per_program, dtype):
    batch, sq, sk, heads, heads_k, d = case
    q = torch.randn(batch, sq, heads, d, device=DEVICE, dtype=dtype)
    k = torch.randn(batch, sk, heads_k, d, device=DEVICE, dtype=dtype)
    v = torch.randn(batch, sk, heads_k, d, device=DEVICE, dtype=dtype)
    ours = fa1_attention(q, k, v, causal=causal, q_rows_per_program=rows_per_program)
    ref = attention(q, k, v, causal, torch.float64)
    naive = attention(q, k, v, causal, dtype)
    assert ours.dtype == dtype and ours.shape == q.shape
    assert not torch.isnan(ours).any()
    err = (ours.double() - ref).abs().max().item()
    base = (naive.double() - ref).abs().max().item()
    assert err <= 2 * base + 1e-3, f"max error {err:.3g} vs 2 x naive {base:.3g}"


@pytest.mark.parametrize("bad, message", [
    (lambda q, k, v: (q[0], k, v), "q must be"),
    (lambda q, k, v: (q, k.float(), v), "k has dtype"),
    (lambda q, k, v: (q, k, v[:, :3]), "v "),
    (lambda q, k, v: (q, k[:, :, :1].expand(-1, -1, 1, -1)[..., :32], v), "k "),
])
def test_bad_input_names_the_argument(bad, message):
    q = torch.randn(1, 8, 3, 64, device=DEVICE, dtype=torch.float16)
    k = torch.randn(1, 8, 3, 64, device=DEVICE, dtype=torch.float16)
    with pytest.raises(ValueError, match=message):
        fa1_attention(*bad(q, k, k.clone()))
