"""flash_attn_varlen_func with block_table and few query rows, run on the KV-cache kernels.

A serving engine batches decode steps (one query row a sequence, or a few speculative ones) as a
paged varlen call.  That is the call flash_attn_with_kvcache's kernels are built for: they read K
and V where they lie in the pages, once per KV group (the group's query rows share one 16-row
tensor-core tile), and split long caches over the SMs; on the H200 they stream pages of 16 at
0.91-0.96 of cuDNN's rate (docs/cuda-decode.md).  The gather (_paged_varlen.py) instead copies
every visible key and value and then runs a forward kernel built for 128-row query tiles.  So a
paged call that wants no gradient, no dropout and no attn_probs, and whose KV groups have at most
ROW_LIMIT query rows (max_seqlen_q x nheads / nheads_k), runs as a kvcache call without an append:

  - q's rows are laid into a (batch, max_seqlen_q, nheads, headdim) block with each sequence's
    L_q rows at the END of its max_seqlen_q slots.  The kvcache call aligns masks and ALiBi
    distances to the bottom right of a max_seqlen_q x L_k block, so the row in slot
    max_seqlen_q - L_q + i sees the keys j <= i + L_k - L_q (and >= i + L_k - L_q - window_left):
    exactly those row i of the varlen call sees.  The leading slots are dropped;
  - each sequence's key count (seqused_k, else its cu_seqlens_k length) is its cache_seqlens;
  - the output rows are copied back to their packed places.

Nothing is read on the host (CUDA-graph capturable, traced by torch.compile).  Bad contents follow
the gather's rules: the CPU raises naming cu_seqlens_q, max_seqlen_q, cu_seqlens_k, seqused_k or
block_table; on CUDA every sequence's cache length becomes -1, which the kernels turn into NaN, and
every output row is NaN.
"""

import torch

from . import _paged_varlen
from ._ffi import InvalidArgumentError

# Query rows of one KV group (max_seqlen_q x nheads / nheads_k) up to which the kvcache kernels
# take the call.  Up to 16 they are one tensor-core tile and K/V are read once: always ahead of
# the gather, which reads and writes every visible key before the forward reads them again.  Up
# to 64 (four tiles, each reading K/V, the later ones mostly from L2) they are predicted to stay
# ahead; the crossover is not measured yet (docs/perf-log.md, session 52).
ROW_LIMIT = 64


def applies(q, k, v, dropout_p, return_attn_probs, max_seqlen_q):
    """Whether a checked paged varlen call runs on the kvcache kernels."""
    wants_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    return (not wants_grad and dropout_p == 0 and not return_attn_probs
            and isinstance(max_seqlen_q, int)
            and max_seqlen_q * (q.shape[1] // k.shape[2]) <= ROW_LIMIT
            and k.stride(-1) == 1 and v.stride(-1) == 1)


def _query_faults(cu_seqlens_q, total_q, max_seqlen_q):
    """(batch,) mask of the sequences whose query rows break validate_sequence_lengths' rules."""
    first, end = cu_seqlens_q[:-1], cu_seqlens_q[1:]
    rows = end - first
    return (first < 0) | (rows < 0) | (rows > max_seqlen_q) | (end > total_q)


def _raise_for_query_rows(check, cu_seqlens_q, total_q, max_seqlen_q):
    """CPU tensors: the C++ varlen validation's messages for cu_seqlens_q."""
    cu = cu_seqlens_q.tolist()
    if cu[0] < 0:
        check.fail(InvalidArgumentError, "cu_seqlens_q", f"cu_seqlens_q[0] is {cu[0]}; it must be >= 0")
    for b in range(len(cu) - 1):
        if cu[b + 1] < cu[b]:
            check.fail(InvalidArgumentError, "cu_seqlens_q",
                       f"cu_seqlens_q is not monotone: entry {b + 1} ({cu[b + 1]}) is below entry {b} ({cu[b]})")
        if cu[b + 1] - cu[b] > max_seqlen_q:
            check.fail(InvalidArgumentError, "max_seqlen_q",
                       f"sequence {b} has length {cu[b + 1] - cu[b]} (from cu_seqlens_q), more than "
                       f"max_seqlen_q = {max_seqlen_q}")
    check.fail(InvalidArgumentError, "cu_seqlens_q",
               f"cu_seqlens_q[{len(cu) - 1}] is {cu[-1]}, past the {total_q} packed rows")


def attention(check, q, k, v, block_table, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
              seqused_k, softmax_scale, causal, window_size, softcap, alibi_slopes):
    """The paged varlen call's output, for arguments that passed
    _paged_varlen.check_paged_call and applies()."""
    from .interface import flash_attn_with_kvcache  # the public call: its plans keep host time low

    batch, total_q, num_heads = block_table.shape[0], q.shape[0], q.shape[1]
    device = q.device
    keys = cu_seqlens_k[1:] - cu_seqlens_k[:-1]
    lengths = keys if seqused_k is None else seqused_k
    key_faults, bad_entry = _paged_varlen.sequence_faults(keys, lengths, block_table, max_seqlen_k, k.shape[0],
                                                          k.shape[1])
    query_faults = _query_faults(cu_seqlens_q, total_q, max_seqlen_q)
    faults = key_faults[0] | key_faults[1] | key_faults[2] | query_faults
    if device.type == "cpu" and not torch.compiler.is_compiling() and bool(faults.any()):
        if bool(query_faults.any()):
            _raise_for_query_rows(check, cu_seqlens_q, total_q, max_seqlen_q)
        _paged_varlen.raise_for_contents(check, key_faults, bad_entry, keys, lengths, block_table,
                                         max_seqlen_k, k.shape[0])
    any_fault = faults.any()
    cache_seqlens = torch.where(any_fault, -1, lengths)
    if total_q == 0:
        return q.new_empty(q.shape)

    # Sequence b's row i in slot max_seqlen_q - L_q + i of its block.  The leading slots read a
    # row clamped into q, as does every slot of a faulty call: nothing is read out of bounds.
    first_slot = max_seqlen_q - (cu_seqlens_q[1:] - cu_seqlens_q[:-1])
    slot = torch.arange(max_seqlen_q, device=device)
    source = (cu_seqlens_q[:-1] - first_slot)[:, None] + slot  # (batch, max_seqlen_q) rows of q
    q_block = q.index_select(0, source.clamp(0, total_q - 1).flatten()).view(batch, max_seqlen_q, num_heads, -1)
    if not block_table.is_contiguous():
        block_table = block_table.contiguous()
    out_block = flash_attn_with_kvcache(
        q_block, k, v, cache_seqlens=cache_seqlens, block_table=block_table,
        softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
        alibi_slopes=alibi_slopes)

    # Each used slot's row back to its packed place; the leading slots all go to a spare row past
    # the end.  Rows that no sequence owns are not written, as in the packed call.
    destination = torch.where(slot >= first_slot[:, None], source, total_q).clamp(0, total_q)
    out = q.new_empty((total_q + 1,) + tuple(q.shape[1:]))
    out.index_copy_(0, destination.flatten(), out_block.flatten(0, 1))
    return out[:total_q].masked_fill_(any_fault, float("nan"))
