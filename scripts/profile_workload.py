#!/usr/bin/env python3
"""One tileattn workload run a few times, for Nsight Compute to profile (scripts/gpu_profile.sh).

    python3 scripts/profile_workload.py fwd|bwd|decode [--seqlen 8192] [--headdim 128] [--batch 1]
"""
import argparse

import torch

import tileattn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["fwd", "bwd", "decode"])
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--calls", type=int, default=4)
    a = ap.parse_args()
    dev, dt = "cuda", torch.bfloat16
    if a.what == "decode":
        # 32 query heads over 8 KV heads, one new token, like bench/gpu/decode.py.
        q = torch.randn(a.batch, 1, 32, a.headdim, device=dev, dtype=dt)
        kc = torch.randn(a.batch, a.seqlen, 8, a.headdim, device=dev, dtype=dt)
        vc = torch.randn_like(kc)
        lens = torch.full((a.batch,), a.seqlen, device=dev, dtype=torch.int32)
        for _ in range(a.calls):
            tileattn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens)
    else:
        # 16k tokens in all, as in the FA papers' sweep.
        b, h = max(1, 16384 // a.seqlen), 2048 // a.headdim
        q, k, v = (torch.randn(b, a.seqlen, h, a.headdim, device=dev, dtype=dt, requires_grad=True)
                   for _ in range(3))
        for _ in range(a.calls):
            out = tileattn.flash_attn_func(q, k, v, causal=a.causal, deterministic=a.deterministic)
            if a.what == "bwd":
                out.backward(torch.ones_like(out))
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
