"""A few small decode calls on CUDA for compute-sanitizer (memcheck): contiguous and paged caches
(pages of 16, 32, 48 and 256), appends with rotary, splits, 21 rows per KV group, head dims 20 (element
loads), 72, 128 (each TMA ring, TILEATTN_DECODE_RING) and 256, an out-of-range page index and an
overflowing cache_seqlens (both must stay in bounds).  The caches are exactly as large as the
shapes say, so any stray read shows.

    compute-sanitizer --tool memcheck python3 tests/cuda/sanitize_decode.py
"""
import torch

import tileattn


def run():
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    for batch, heads, heads_k, dim, page, capacity, new, splits in [
            (3, 8, 2, 64, 0, 100, 1, 0), (2, 14, 2, 128, 16, 96, 3, 3), (2, 3, 1, 20, 256, 512, 2, 1),
            (2, 4, 4, 256, 16, 64, 1, 3), (3, 8, 1, 72, 0, 33, 2, 2), (3, 32, 8, 128, 0, 100, 1, 0),
            (2, 32, 8, 128, 32, 96, 1, 0),
            # Long enough that a warp's page window (its next 32 blocks' pages) moves on with one split;
            # 32-key blocks as two boxes on two pages (d64, the wide ring), blocks across pages of 48.
            (2, 8, 2, 64, 16, 2304, 1, 1), (2, 32, 8, 128, 16, 2304, 1, 1), (2, 32, 8, 128, 48, 2304, 1, 1)]:
        entries = batch if page == 0 else batch * capacity // page
        rows = capacity if page == 0 else page
        k_cache = torch.randn(entries, rows, heads_k, dim, device=dev, dtype=dt)
        v_cache = torch.randn_like(k_cache)
        table = None
        if page:
            table = torch.randperm(entries, device=dev, dtype=torch.int32).view(batch, capacity // page)
        seqlens = torch.randint(0, capacity - new + 1, (batch,), device=dev, dtype=torch.int32)
        seqlens[0] = capacity - new
        q = torch.randn(batch, new, heads, dim, device=dev, dtype=dt)
        k = torch.randn(batch, new, heads_k, dim, device=dev, dtype=dt)
        v = torch.randn_like(k)
        cos = torch.randn(capacity + new, max(1, dim // 4), device=dev, dtype=dt)  # rotary_dim ~ dim / 2
        sin = torch.randn_like(cos)
        for causal in (False, True):
            tileattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos=cos, rotary_sin=sin,
                                             cache_seqlens=seqlens, block_table=table, causal=causal,
                                             num_splits=splits, window_size=(-1, -1) if causal else (7, 2))
        bad = seqlens.clone()
        bad[-1] = capacity + 5
        tileattn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=bad, block_table=table,
                                         num_splits=splits)
        if table is not None:
            broken = table.clone()
            broken[0, 0] = entries
            broken[-1, -1] = -3
            tileattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=broken,
                                             num_splits=splits)
    torch.cuda.synchronize()
    print("decode sanitize script finished")


if __name__ == "__main__":
    run()
