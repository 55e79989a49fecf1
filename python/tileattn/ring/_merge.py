"""Merging attention over disjoint key sets through their log-sum-exps.

For one query row with partial results (o_a, L_a) over keys A and (o_b, L_b) over keys B
(o = softmax-weighted mean of V over its keys, L = log-sum-exp of its scores):
    L = log(e^L_a + e^L_b),    o = e^(L_a - L) o_a + e^(L_b - L) o_b.
A row that sees no key contributes weight 0: its L is -inf here (the kernels report +inf for
such rows, flash-attn's convention, which `as_log_weight` converts).
"""

import math

import torch


def as_log_weight(lse):
    """Kernel LSE (float32, +inf for rows without keys) -> -inf for those rows."""
    return torch.where(torch.isposinf(lse), torch.full_like(lse, -math.inf), lse)


def merge(out_acc, lse_acc, out_part, lse_part):
    """out_* (rows..., heads, dim) float32 and lse_* (rows..., heads) float32 in the same row
    layout; returns the merged (out, lse)."""
    lse = torch.logaddexp(lse_acc, lse_part)
    empty = torch.isneginf(lse)
    weight_acc = torch.where(empty, 0.0, torch.exp(lse_acc - lse))
    weight_part = torch.where(empty, 0.0, torch.exp(lse_part - lse))
    out = out_acc * weight_acc.unsqueeze(-1) + out_part.float() * weight_part.unsqueeze(-1)
    return out, lse


def as_kernel_lse(lse):
    """-inf (no key seen on any rank) -> +inf, the convention of every tileattn function."""
    return torch.where(torch.isneginf(lse), torch.full_like(lse, math.inf), lse)
