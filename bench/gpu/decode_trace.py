#!/usr/bin/env python3
"""The timeline of decode calls, on a library built by scripts/decode_trace/build.sh: for each shape
(batch x cache length; 32 query heads over 8 KV heads, d128, bf16, contiguous cache, the split
heuristic), five warm-up calls, then one call with TILEATTN_DECODE_TRACE set, whose combine kernel
prints the split CTAs' steps and its own wait (lines starting TRACE; nothing prints for a call of
one split, which has no combine).  Eager calls: the numbers are inside one call, from the first
split CTA's start.  The splits merge through the combine kernel (TILEATTN_DECODE_SPLIT_MERGE=combine,
set here): a cluster-merged call has no combine to print.  With the TMA loop the trace also splits
warp 0's steps into waiting for a block, computing it and lane 0's request of the next.
`--splits N` fixes num_splits (N >= 2; with TILEATTN_DECODE_FAMILY=sm90 for the TMA loop, which
a fixed count otherwise does not take), e.g. to compare one CTA an SM with two.

    TILEATTN_LIBRARY=/tmp/trace-decode.so python3 bench/gpu/decode_trace.py [--shapes 1x2048 8x8192]
    TILEATTN_DECODE_FAMILY=sm90 ... decode_trace.py --shapes 4x32768 16x32768 --splits 2
"""
import argparse
import os
import sys

import torch

import tileattn


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["1x2048", "1x8192", "1x32768", "8x2048", "8x8192"],
                    help="BATCHxLENGTH")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--splits", type=int, default=0, help="num_splits (0: the heuristic's)")
    args = ap.parse_args()
    if args.splits == 1:
        ap.error("--splits 1 has no combine kernel to print the trace")
    os.environ["TILEATTN_DECODE_SPLIT_MERGE"] = "combine"
    for shape in args.shapes:
        batch, length = (int(x) for x in shape.split("x"))
        k = torch.randn(batch, length, 8, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        q = torch.randn(batch, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
        seqlens = torch.full((batch,), length, device="cuda", dtype=torch.int32)
        for repeat in range(args.repeats):
            for _ in range(5):
                tileattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, num_splits=args.splits)
            torch.cuda.synchronize()
            print(f"== {batch} x {length}, call {repeat + 1}", flush=True)
            os.environ["TILEATTN_DECODE_TRACE"] = "1"
            try:
                tileattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, num_splits=args.splits)
            finally:
                del os.environ["TILEATTN_DECODE_TRACE"]
            torch.cuda.synchronize()  # the device's printf buffer is flushed here
            sys.stdout.flush()


if __name__ == "__main__":
    main()
