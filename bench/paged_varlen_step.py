"""A decode step as a serving engine batches it: flash_attn_varlen_func with one query row a
sequence over K/V in pages with a block table, which runs on the KV-cache path
(python/tileattn/_paged_varlen_kvcache.py), or the same call made to gather the pages into a padded
copy first (`gather=True`, the path every paged varlen call took before session 52).  Shared by
bench/cpu_decode.py and bench/gpu/decode.py."""

import torch

import tileattn


def decode_step(q, k_pages, v_pages, block_table, seqlens, max_seqlen_k, gather=False):
    """A zero-argument call of the step: q (batch, 1, heads, d), seqlens int32 (batch,) keys a
    sequence.  The gather is forced by making the KV-cache path's test refuse the call (on Hopper
    that path takes any number of rows, so its row limit alone would not)."""
    batch = q.shape[0]
    rows = q.flatten(0, 1)
    cu_q = torch.arange(batch + 1, device=q.device, dtype=torch.int32)
    cu_k = torch.cat([seqlens.new_zeros(1), seqlens.cumsum(0, dtype=torch.int32)])
    route = tileattn._paged_varlen_kvcache

    def run():
        kept = route.applies
        if gather:
            route.applies = lambda *args: False
        try:
            return tileattn.flash_attn_varlen_func(rows, k_pages, v_pages, cu_q, cu_k, 1, max_seqlen_k,
                                                   block_table=block_table)
        finally:
            route.applies = kept
    return run
