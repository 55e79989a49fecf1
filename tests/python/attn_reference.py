"""Ground truth for the Python suite: naive attention written straight from the definition, and the
Philox dropout mapping of docs/dropout-rng.md written again in Python.

attention() runs in any dtype: float64 is the reference; the tensors' own dtype gives the "naive
same precision" baseline of FlashAttention's test rule (error of ours vs float64 <= 2 x error of
the naive computation vs float64, plus a small floor).
"""

import math

import numpy as np
import torch


def visible_mask(seqlen_q, seqlen_k, window_left, window_right, device="cpu"):
    """(Sq, Sk) bool: row i sees column j when i + Sk - Sq - left <= j <= i + Sk - Sq + right."""
    row = torch.arange(seqlen_q, device=device)[:, None]
    col = torch.arange(seqlen_k, device=device)[None, :]
    diagonal = row + seqlen_k - seqlen_q
    mask = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if window_left >= 0:
        mask &= col >= diagonal - window_left
    if window_right >= 0:
        mask &= col <= diagonal + window_right
    return mask


def attention(q, k, v, dout=None, *, dtype=torch.float64, softmax_scale=None, window_left=-1,
              window_right=-1, softcap=0.0, alibi_slopes=None, keep=None, dropout_p=0.0):
    """Batch-form attention computed in `dtype`.

    q (B, Sq, H, D), k/v (B, Sk, Hk, D); alibi_slopes (H,) or (B, H); keep: bool (B, H, Sq, Sk)
    dropout keep-mask.  Returns dict(out, lse, probs) and, when dout is given, dq, dk, dv (from
    autograd through the same computation).  Empty rows: out 0, lse +inf, probs 0.
    """
    seqlen_q, seqlen_k = q.shape[1], k.shape[1]
    q_, k_, v_ = (x.detach().to(dtype).requires_grad_(dout is not None) for x in (q, k, v))
    vv = v_.repeat_interleave(q.shape[2] // k.shape[2], dim=2)
    scores, visible = _scores(q_, k_, softmax_scale, window_left, window_right, softcap, alibi_slopes)
    probs = _probs(scores, visible)
    lse = torch.logsumexp(scores.float() if dtype != torch.float64 else scores, dim=-1)
    lse = torch.where(visible.any(dim=-1), lse, torch.full_like(lse, math.inf))
    dropped = probs
    if keep is not None:
        dropped = probs * keep / (1.0 - dropout_p)
    out = torch.einsum("bhqk,bkhd->bqhd", dropped.to(dtype), vv)
    result = {"out": out.detach(), "lse": lse.detach(), "probs": probs.detach()}
    if dout is not None:
        out.backward(dout.to(dtype))
        result.update(dq=q_.grad, dk=k_.grad, dv=v_.grad)
    return result


def _scores(q, k, softmax_scale, window_left, window_right, softcap, alibi_slopes):
    """(B, H, Sq, Sk) scores in q's dtype, invisible ones -inf, and the (Sq, Sk) visibility."""
    seqlen_q, num_heads, head_dim = q.shape[1], q.shape[2], q.shape[3]
    seqlen_k = k.shape[1]
    scale = head_dim ** -0.5 if softmax_scale is None else softmax_scale
    kk = k.repeat_interleave(num_heads // k.shape[2], dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q * scale, kk)
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(q.dtype)
        slopes = slopes.view(1, num_heads) if slopes.dim() == 1 else slopes
        row = torch.arange(seqlen_q, device=q.device)[:, None]
        col = torch.arange(seqlen_k, device=q.device)[None, :]
        distance = (row + seqlen_k - seqlen_q - col).abs().to(q.dtype)
        scores = scores - slopes[:, :, None, None] * distance
    visible = visible_mask(seqlen_q, seqlen_k, window_left, window_right, q.device)
    return scores.masked_fill(~visible, float("-inf")), visible


def _probs(scores, visible):
    # Rows with no visible key: softmax over zeros, then zeroed, so autograd stays finite.
    row_any = visible.any(dim=-1)[:, None].expand_as(visible)
    safe = torch.where(row_any, scores, torch.zeros((), dtype=scores.dtype, device=scores.device))
    return torch.softmax(safe, dim=-1) * row_any


def saved_output_shift(q, k, dout, out, exact_out, *, softmax_scale=None, window_left=-1,
                       window_right=-1, softcap=0.0, alibi_slopes=None):
    """How far dq and dk move, in float64, when the backward's D = rowsum(dO o O) reads `out` as
    the forward returned it (rounded to its dtype) instead of `exact_out` (the float64 reference's).

    FlashAttention's backward reads the saved output (flash-attn's contract, and ours), so this
    shift is part of the result, not an error of the kernel; the naive baseline (autograd through
    softmax) never reads O and does not pay it.  D moves by dD = rowsum(dO o (out - O)), which
    changes dS by -P dD per row: with one query over three keys at float16 that alone was 2.6x the
    naive error (a CI failure, TILEATTN_TEST_SEED=1857422709).  Returns dict(dq, dk); dv does not
    depend on D."""
    q64, k64 = (x.detach().double().requires_grad_() for x in (q, k))
    scores, visible = _scores(q64, k64, softmax_scale, window_left, window_right, softcap,
                              alibi_slopes)
    probs = _probs(scores, visible)
    d_delta = ((out.detach().double() - exact_out.double()) * dout.detach().double()).sum(-1)
    d_scores = -probs.detach() * d_delta.permute(0, 2, 1)[..., None]  # d_delta: (B, Sq, H)
    dq, dk = torch.autograd.grad(scores, (q64, k64), d_scores)
    return {"dq": dq, "dk": dk}


def delta_rounding_shift(q, k, v, dout, out, *, softmax_scale=None, window_left=-1, window_right=-1,
                         softcap=0.0, alibi_slopes=None):
    """A float64 replay of how far dq and dk move when dS = P (dP - D) takes dP = dO V^T and
    D = rowsum(dO o O) as two float32 dot products (FlashAttention's backward) instead of exact
    ones.  Where a row sees one key (P = 1, O = V) the two are equal in exact arithmetic, so dS is
    0 and autograd's softmax backward returns exactly 0, while the kernel's dS is the difference of
    two roundings, summed by dk over every query row of a KV head: at 1000 rows x 4 query heads of
    d160, 2.1e-4 against a 1e-4 floor (session 34's random configurations, TILEATTN_TEST_SEED=15,
    sm80 forward family).  The kernel sums in its own order, so this replay (torch's float32 sums)
    gives the size of the effect, not its value.  Returns dict(dq, dk)."""
    q64, k64 = (x.detach().double().requires_grad_() for x in (q, k))
    scores, visible = _scores(q64, k64, softmax_scale, window_left, window_right, softcap,
                              alibi_slopes)
    probs = _probs(scores, visible)
    group = q.shape[2] // k.shape[2]

    def dp_minus_d(dtype):
        do, o, vv = (x.detach().to(dtype) for x in (dout, out, v.repeat_interleave(group, dim=2)))
        dp = torch.einsum("bqhd,bkhd->bhqk", do, vv)
        d = (do * o).sum(-1).permute(0, 2, 1)  # (B, H, Sq)
        return (dp - d[..., None]).double()

    d_scores = probs.detach() * (dp_minus_d(torch.float32) - dp_minus_d(torch.float64))
    dq, dk = torch.autograd.grad(scores, (q64, k64), d_scores)
    return {"dq": dq, "dk": dk}


def backward_rounding_shift(q, k, v, dout, out, exact_out, **options):
    """The parts of dq and dk that follow from the FlashAttention backward's own roundings, which
    the naive baseline does not have, as magnitudes for assert_fa_close's `shift`: the rounded
    output it reads (saved_output_shift) and its float32 dP - D (delta_rounding_shift, four times
    over: the kernel sums in another order than the replay).  Returns dict(dq, dk)."""
    saved = saved_output_shift(q, k, dout, out, exact_out, **options)
    delta = delta_rounding_shift(q, k, v, dout, out, **options)
    return {name: saved[name].abs() + 4 * delta[name].abs() for name in saved}


# ---- Philox-4x32-7 and the dropout mapping (src/common/philox.h), vectorized with numpy -------

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_MASK32 = np.uint64(0xFFFFFFFF)


def philox4x32_7(c0, c1, c2, c3, key0, key1):
    """Counters as uint64 arrays holding 32-bit values; keys as Python ints.  Seven rounds, as
    dropout runs them (kDropoutPhiloxRounds)."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) for c in (c0, c1, c2, c3))
    for _ in range(7):
        p0 = _M0 * c0
        p1 = _M1 * c2
        hi0, lo0 = p0 >> np.uint64(32), p0 & _MASK32
        hi1, lo1 = p1 >> np.uint64(32), p1 & _MASK32
        c0, c1, c2, c3 = (hi1 ^ c1 ^ np.uint64(key0), lo1, hi0 ^ c3 ^ np.uint64(key1), lo0)
        key0 = (key0 + _W0) & 0xFFFFFFFF
        key1 = (key1 + _W1) & 0xFFFFFFFF
    return c0, c1, c2, c3


def dropout_keep(seed, offset, batch, num_heads, seqlen_q, seqlen_k, dropout_p):
    """bool (batch, num_heads, seqlen_q, seqlen_k): the keep mask every backend must draw."""
    scaled = float(np.float32(dropout_p)) * 65536.0
    threshold = 65536 if scaled >= 65536.0 else int(scaled)
    b, h, row, col = np.meshgrid(np.arange(batch), np.arange(num_heads), np.arange(seqlen_q),
                                 np.arange(seqlen_k), indexing="ij")
    stream = (np.uint64(offset) + (b * num_heads + h).astype(np.uint64))
    group_col = (col >> 4) * 4 + ((col & 7) >> 1)
    group_row = (row >> 4) * 8 + (row & 7)
    draws = philox4x32_7(group_col.astype(np.uint64), group_row.astype(np.uint64),
                          stream & _MASK32, stream >> np.uint64(32), seed & 0xFFFFFFFF, seed >> 32)
    slot = ((row >> 3) & 1) * 4 + ((col >> 3) & 1) * 2 + (col & 1)
    word = np.select([slot >> 1 == 0, slot >> 1 == 1, slot >> 1 == 2], draws[:3], draws[3])
    value = np.where(slot & 1, word >> np.uint64(16), word & np.uint64(0xFFFF))
    return torch.from_numpy(value >= threshold)
