"""flash_attn_with_kvcache with packed query rows (cu_seqlens_q) on CUDA, until the decode kernels
read packed rows themselves (the CPU backend takes them natively: src/cpu/kvcache_packed_q.cpp,
which lays them out the same way).

The rows are laid into a (batch, max_seqlen_q, nheads, headdim) block with each sequence's L rows
at the END of its max_seqlen_q slots, and the batch-form call runs on the block.  The batch form
aligns masks and ALiBi distances to the bottom right of a max_seqlen_q x keys block, so the row in
slot max_seqlen_q - L + i sees exactly the keys row i of a sequence of L rows sees (j <= i + keys
- L, and the window's left edge likewise); the leading slots read a clamped row of q and their
outputs are dropped.  Then out and softmax_lse go back to their packed places.

All of it is torch ops on the device, no host read (CUDA-graph capturable, traced by
torch.compile): ~15 small index kernels around the decode kernels.  Bad cu_seqlens_q contents
(rows outside q, a sequence longer than max_seqlen_q, entries out of order) make every
sequence's cache length -1, which the kernels turn into NaN, and every output NaN; with
TILEATTN_CHECK_CONTENTS=on (_host_contents.py) they raise as on the CPU.
"""

import torch

from . import _host_contents
from ._checks import Checker
from ._ffi import InvalidArgumentError


def lays_out_rows(device):
    """Whether packed rows are laid out here rather than in the library: on CUDA, whose decode
    kernels take batch-form q only.  (The tests also run this path on the CPU.)"""
    return device.type == "cuda"


def _faults(first, end, rows, total_q, max_seqlen_q):
    """(batch,) mask of the sequences whose rows [first, end), `rows` of them, break the CPU
    backend's cu_seqlens_q rules."""
    return (first < 0) | (rows < 0) | (rows > max_seqlen_q) | (end > total_q)


def _raise_for_rows(faults, first, end, rows, total_q, max_seqlen_q):
    """Raises as the library's packed form does, for the first sequence at fault."""
    fail = Checker("flash_attn_with_kvcache").fail
    b = int(faults.nonzero()[0, 0])
    if first[b] < 0:
        fail(InvalidArgumentError, "cu_seqlens_q", f"cu_seqlens_q[{b}] is {int(first[b])}; it must be >= 0")
    if rows[b] < 0:
        fail(InvalidArgumentError, "cu_seqlens_q",
             f"not monotone: entry {b + 1} ({int(end[b])}) is below entry {b} ({int(first[b])})")
    if rows[b] > max_seqlen_q:
        fail(InvalidArgumentError, "max_seqlen_q",
             f"sequence {b} has length {int(rows[b])} (from cu_seqlens_q), more than max_seqlen_q = {max_seqlen_q}")
    fail(InvalidArgumentError, "cu_seqlens_q", f"cu_seqlens_q[{b + 1}] is {int(end[b])}, past the {total_q} packed rows")


def attention(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
              cu_seqlens_q, max_seqlen_q, softmax_scale, causal, window_size, softcap, alibi_slopes,
              num_splits, return_softmax_lse):
    """The packed call's (out, softmax_lse) or out, for arguments flash_attn_with_kvcache checked."""
    from .interface import flash_attn_with_kvcache  # the batch-form call, with its plans

    batch, total_q, num_heads = cu_seqlens_q.shape[0] - 1, q.shape[0], q.shape[1]
    device = q.device
    first, end = cu_seqlens_q[:-1], cu_seqlens_q[1:]
    rows = end - first
    faults = _faults(first, end, rows, total_q, max_seqlen_q)
    any_fault = faults.any()
    if _host_contents.read_on_host(device) and bool(any_fault):
        _raise_for_rows(faults, first, end, rows, total_q, max_seqlen_q)
    if total_q == 0:
        out, lse = q.new_empty(q.shape), q.new_empty((num_heads, 0), dtype=torch.float32)
        return (out, lse) if return_softmax_lse else out

    # Sequence b's row i in slot max_seqlen_q - L + i of its block; every slot's source clamped
    # into q, so a faulty call reads nothing out of bounds.
    first_slot = max_seqlen_q - rows
    slot = torch.arange(max_seqlen_q, device=device)
    source = (first - first_slot)[:, None] + slot  # (batch, max_seqlen_q) rows of q
    q_block = q.index_select(0, source.clamp(0, total_q - 1).flatten()).view(batch, max_seqlen_q, num_heads, -1)
    out_block, lse_block = flash_attn_with_kvcache(
        q_block, k_cache, v_cache, cache_seqlens=torch.where(any_fault, -1, cache_seqlens),
        cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad, block_table=block_table,
        softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
        alibi_slopes=alibi_slopes, num_splits=num_splits, return_softmax_lse=True)

    # Each used slot back to its packed row; the leading slots all go to a spare row past the end.
    # Rows no sequence owns are not written, as in the CPU backend's packed call.
    destination = torch.where(slot >= first_slot[:, None], source, total_q).clamp(0, total_q).flatten()
    out = q.new_empty((total_q + 1,) + tuple(q.shape[1:]))
    out.index_copy_(0, destination, out_block.flatten(0, 1))
    out = out[:total_q].masked_fill_(any_fault, float("nan"))
    if not return_softmax_lse:
        return out
    lse = lse_block.new_empty((num_heads, total_q + 1))
    lse.index_copy_(1, destination, lse_block.transpose(0, 1).flatten(1, 2))
    return out, lse[:, :total_q].masked_fill(any_fault, float("nan"))
