#!/usr/bin/env python3
"""One decode call for Nsight Compute to profile, on bench/gpu/decode.py's shape (one new token, 32
query heads over 8 KV heads, d128, bf16): a decode.py layout (contiguous, page16, cudnn, ...),
three warm-up calls, then the call inside an NVTX range named "profile":

    ncu --nvtx --nvtx-include "profile/" --metrics dram__bytes_read.sum,... \\
        python3 bench/gpu/ncu_decode_call.py cudnn 32 65536
"""
import argparse

import torch

from decode import DIM, HEADS, calls, make_caches


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("layout", help="a decode.py layout: contiguous, page16, page256, cudnn, flash, copy")
    p.add_argument("batch", type=int)
    p.add_argument("length", type=int)
    args = p.parse_args()
    caches = make_caches(args.batch, args.length, 1)
    q = torch.randn(args.batch, 1, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    seqlens = torch.full((args.batch,), args.length, device="cuda", dtype=torch.int32)
    call = calls(args.layout, q, caches, seqlens)[0]
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("profile")
    call()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


if __name__ == "__main__":
    main()
