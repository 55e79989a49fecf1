"""flash_attn_varlen_func with block_table and few query rows, run on the KV-cache kernels.

A serving engine batches decode steps (one query row a sequence, or a few speculative ones) as a
paged varlen call.  That is the call flash_attn_with_kvcache's kernels are built for: they read K
and V where they lie in the pages, once per KV group (the group's query rows share one 16-row
tensor-core tile), and split long caches over the SMs; on the H200 they stream pages of 16 at
0.91-0.96 of cuDNN's rate (docs/cuda-decode.md).  The gather (_paged_varlen.py) instead copies
every visible key and value and then runs a forward kernel built for 128-row query tiles.  So a
paged call that wants no gradient, no dropout and no attn_probs, and whose KV groups have at most
ROW_LIMIT query rows (max_seqlen_q x nheads / nheads_k), runs as a kvcache call without an append,
with the packed query rows as they are (cu_seqlens_q, max_seqlen_q: flash_attn_with_kvcache's
packed form, which aligns each sequence's rows to the bottom right of its keys as the varlen call
does) and each sequence's key count (seqused_k, else its cu_seqlens_k length) as its
cache_seqlens.

Nothing is read on the host (CUDA-graph capturable, traced by torch.compile).  Bad contents: the
CPU (and CUDA with TILEATTN_CHECK_CONTENTS=on) raises naming cu_seqlens_k, seqused_k or
block_table here, and cu_seqlens_q or max_seqlen_q in the library, as on the gather path.
Otherwise on CUDA they are NaN as flash_attn_with_kvcache makes them: a
sequence whose key count or seqused_k breaks a rule gets the cache length -1 and NaN rows, a
block-table entry that is not a page makes the rows that read it NaN, and a bad cu_seqlens_q makes
every output NaN (the gather path NaNs every output for any of them).
"""

import torch

from . import _host_contents, _paged_varlen

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


def attention(check, q, k, v, block_table, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
              seqused_k, softmax_scale, causal, window_size, softcap, alibi_slopes):
    """The paged varlen call's output, for arguments that passed
    _paged_varlen.check_paged_call and applies()."""
    from .interface import flash_attn_with_kvcache

    keys = cu_seqlens_k[1:] - cu_seqlens_k[:-1]
    lengths = keys if seqused_k is None else seqused_k
    if _host_contents.read_on_host(q.device):
        faults, bad_entry = _paged_varlen.sequence_faults(keys, lengths, block_table, max_seqlen_k, k.shape[0],
                                                          k.shape[1])
        if bool((faults[0] | faults[1] | faults[2]).any()):
            _paged_varlen.raise_for_contents(check, faults, bad_entry, keys, lengths, block_table, max_seqlen_k,
                                             k.shape[0])
        cache_seqlens = lengths
    else:
        # The length rules only, ~8 small kernels rather than the page check's ~10 more (each one a
        # launch in a decode step's graph): the kvcache kernels check the block-table entries they
        # read and the cache lengths themselves.
        bad_keys, bad_length = _paged_varlen.length_faults(keys, lengths, max_seqlen_k)
        cache_seqlens = torch.where(bad_keys | bad_length, -1, lengths)
    return flash_attn_with_kvcache(
        q, k, v, cache_seqlens=cache_seqlens,
        block_table=block_table if block_table.is_contiguous() else block_table.contiguous(),
        softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
        alibi_slopes=alibi_slopes, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q)
