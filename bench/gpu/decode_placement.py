#!/usr/bin/env python3
"""Does decode speed depend on where the cache lies?  tileattn (contiguous cache) and SDPA's cuDNN
backend on the same K/V, the decode benchmark's shape (32 query heads over 8 KV heads, d128, bf16),
timed as bench/gpu/decode.py times them (CUDA graph, median per call), first at byte offsets
0 B .. 34 MB inside one large allocation, then in eight fresh allocations with growing ones made in
between.  A ratio that moves with the placement in one backend and not the other names a DRAM
channel or L2 slice effect (perf log, "Decode: the placement measurement").

    python3 bench/gpu/decode_placement.py [BATCH [CACHE_LEN]]     (default 128 2048)
"""
import sys

import torch

from decode import DIM, HEADS, HEADS_K, calls, graph_ms

OFFSETS = [0, 4096, 65536, 1 << 20, (1 << 20) + 4096, 2 << 20, 3 << 20, 5 << 20, 8 << 20, 13 << 20,
           21 << 20, 34 << 20]


def rates(q, seqlens, k, v, gigabytes):
    """GB/s of K and V read by each backend on this cache."""
    return {layout: gigabytes / (graph_ms(calls(layout, q, [(k, v)], seqlens), replays=7) * 1e-3)
            for layout in ("contiguous", "cudnn")}


def report(label, r):
    print(f"{label:28s} ours {r['contiguous']:7.0f}  cudnn {r['cudnn']:7.0f}  "
          f"ratio {r['contiguous'] / r['cudnn']:.3f}", flush=True)


def main():
    batch = int(sys.argv[1]) if len(sys.argv) > 1 else 128
    length = int(sys.argv[2]) if len(sys.argv) > 2 else 2048
    elems = batch * length * HEADS_K * DIM
    gigabytes = 2 * elems * 2 / 1e9
    q = torch.randn(batch, 1, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    seqlens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    print(f"# batch {batch} x {length} keys, K + V {gigabytes * 1e3:.0f} MB")
    big = torch.empty(2 * elems + (64 << 20) // 2, device="cuda", dtype=torch.bfloat16).normal_()
    for offset in OFFSETS:
        first = offset // 2  # bf16 elements
        k = big[first:first + elems].view(batch, length, HEADS_K, DIM)
        v = big[first + elems:first + 2 * elems].view(batch, length, HEADS_K, DIM)
        report(f"offset {offset:>10} B", rates(q, seqlens, k, v, gigabytes))
    del big
    torch.cuda.empty_cache()
    spacers = []
    for trial in range(8):
        k = torch.randn(batch, length, HEADS_K, DIM, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        report(f"fresh {trial} k at {k.data_ptr() % (1 << 30):#011x}", rates(q, seqlens, k, v, gigabytes))
        spacers.append(torch.empty((trial + 1) * (7 << 20), device="cuda", dtype=torch.uint8))
        del k, v


if __name__ == "__main__":
    main()
