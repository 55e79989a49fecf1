"""Which rows of a rank's shard take part in one ring step, for the batch and the packed forms.

Zigzag sharding (causal balance): the sequence is cut into 2W chunks of equal length and rank r
holds chunks r and 2W-1-r, in that order, so the first half of its rows is chunk r and the
second half chunk 2W-1-r.  Against the K/V shard of rank s (the same two-chunk shape) causal
attention then reduces to three cases, each of equal work (half of the local q x kv product):
    s == r: local causal attention over the whole shard (the rows stay in global order);
    s <  r: every local query sees the first half of s's keys (chunk s) and nothing of the second;
    s >  r: only the second half of the queries (chunk 2W-1-r) sees s's keys, all of them.
Without causal every step is all queries against all keys, and any sharding works.
"""

import torch

from .. import _ops

ALL, FIRST, SECOND = "all", "first", "second"


def step_plan(rank, source, causal):
    """(query part, key part, causal) of the product rank `rank` computes against the K/V shard
    of rank `source`."""
    if not causal:
        return ALL, ALL, False
    if source == rank:
        return ALL, ALL, True
    if source < rank:
        return ALL, FIRST, False
    return SECOND, ALL, False


class BatchRows:
    """q/k/v (batch, seqlen, heads, dim); lse (batch, heads, seqlen)."""

    def __init__(self, seqlen):
        self.seqlen = seqlen
        self._slices = {ALL: slice(None), FIRST: slice(0, seqlen // 2),
                        SECOND: slice(seqlen // 2, seqlen)}

    def select(self, q_part, kv_part):
        """Nothing to prepare: the slices carry their own lengths."""

    def take(self, x, part):
        return x[:, self._slices[part]]

    def put(self, dst, part, value):
        dst[:, self._slices[part]] = value

    def add(self, dst, part, value):
        dst[:, self._slices[part]] += value

    def take_lse(self, lse, part):
        return lse[..., self._slices[part]].contiguous()

    def lse_to_rows(self, lse):
        """(batch, heads, rows) -> (batch, rows, heads): the layout of out without its last dim."""
        return lse.transpose(1, 2)

    def rows_to_lse(self, lse_rows):
        return lse_rows.transpose(1, 2).contiguous()

    def forward(self, q, k, v, causal, scale, softcap):
        out, lse, _, _ = _ops._fwd_impl(q, k, v, 0.0, scale, -1, 0 if causal else -1, softcap,
                                        None, False, False)
        return out, lse

    def backward(self, dout, q, k, v, out, lse, causal, scale, softcap, deterministic):
        return _ops.bwd(dout, q, k, v, out, lse, 0.0, scale, -1, 0 if causal else -1, softcap,
                        None, deterministic, _NO_RNG)


class PackedRows:
    """q/k/v (total, heads, dim) holding every sequence's local shard back to back, as given by
    cu_seqlens (int32, the same on every rank); lse (heads, total)."""

    def __init__(self, cu_seqlens):
        bounds = cu_seqlens.tolist()
        lengths = [b - a for a, b in zip(bounds, bounds[1:])]
        halves = [n // 2 for n in lengths]
        device = cu_seqlens.device
        first = [i for a, h in zip(bounds, halves) for i in range(a, a + h)]
        second = [i for a, b, h in zip(bounds, bounds[1:], halves) for i in range(a + h, b)]
        self._index = {FIRST: torch.tensor(first, dtype=torch.long, device=device),
                       SECOND: torch.tensor(second, dtype=torch.long, device=device)}
        self._cu = {ALL: cu_seqlens,
                    FIRST: _prefix_sums(halves, device),
                    SECOND: _prefix_sums([n - h for n, h in zip(lengths, halves)], device)}
        # The kernels take max_seqlen >= 1 even when every sequence (or half) is empty.
        self._max = {ALL: max(1, *lengths), FIRST: max(1, *halves),
                     SECOND: max(1, *(n - h for n, h in zip(lengths, halves)))}
        self.q_part = self.kv_part = ALL

    def select(self, q_part, kv_part):
        """The parts the next forward/backward call runs on (it needs their cu_seqlens)."""
        self.q_part, self.kv_part = q_part, kv_part

    def take(self, x, part):
        return x if part == ALL else x.index_select(0, self._index[part])

    def put(self, dst, part, value):
        if part == ALL:
            dst.copy_(value)
        else:
            dst.index_copy_(0, self._index[part], value)

    def add(self, dst, part, value):
        if part == ALL:
            dst += value
        else:
            dst.index_add_(0, self._index[part], value)

    def take_lse(self, lse, part):
        return lse if part == ALL else lse.index_select(1, self._index[part])

    def lse_to_rows(self, lse):
        return lse.transpose(0, 1)

    def rows_to_lse(self, lse_rows):
        return lse_rows.transpose(0, 1).contiguous()

    def _varlen_args(self):
        return (self._cu[self.q_part], self._cu[self.kv_part], None, self._max[self.q_part],
                self._max[self.kv_part])

    def forward(self, q, k, v, causal, scale, softcap):
        out, lse, _, _ = _ops._varlen_fwd_impl(q, k, v, *self._varlen_args(), 0.0, scale, -1,
                                               0 if causal else -1, softcap, None, False, False)
        return out, lse

    def backward(self, dout, q, k, v, out, lse, causal, scale, softcap, deterministic):
        return _ops.varlen_bwd(dout, q, k, v, out, lse, *self._varlen_args(), 0.0, scale, -1,
                               0 if causal else -1, softcap, None, deterministic, _NO_RNG)


_NO_RNG = torch.zeros(2, dtype=torch.int64)


def _prefix_sums(lengths, device):
    sums = [0]
    for n in lengths:
        sums.append(sums[-1] + n)
    return torch.tensor(sums, dtype=torch.int32, device=device)
