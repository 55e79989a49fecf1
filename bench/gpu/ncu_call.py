#!/usr/bin/env python3
"""One attention call for Nsight Compute to profile: the FA sweep's shapes (16k tokens, hidden 2048,
bf16), three warm-up calls, then the call inside an NVTX range named "profile" (for the backward,
only the backward is inside it; autograd runs it on another thread, so ncu picks the backward's
kernel by name and launch count instead, scripts/ncu_compare.sh):

    ncu --nvtx --nvtx-include "profile/" --section SpeedOfLight ... \
        python3 bench/gpu/ncu_call.py tileattn bwd --headdim 256 --seqlen 8192

Backends: tileattn, tileattn-deterministic, sdpa-flash, sdpa-cudnn.  scripts/ncu_compare.sh runs
the comparisons that the perf log quotes.
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import tileattn

SDPA = {"sdpa-flash": SDPBackend.FLASH_ATTENTION, "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION}


def attention(backend, causal):
    """(q, k, v) in flash-attn's (B, S, H, D) layout -> out in the same layout."""
    if backend in SDPA:
        def call(q, k, v):
            with sdpa_kernel(SDPA[backend]):
                out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                     is_causal=causal)
            return out.transpose(1, 2)
        return call
    deterministic = backend == "tileattn-deterministic"
    return lambda q, k, v: tileattn.flash_attn_func(q, k, v, causal=causal, deterministic=deterministic)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("backend", choices=["tileattn", "tileattn-deterministic", *SDPA])
    p.add_argument("direction", choices=["fwd", "bwd"])
    p.add_argument("--headdim", type=int, default=128)
    p.add_argument("--seqlen", type=int, default=8192)
    p.add_argument("--causal", action="store_true")
    args = p.parse_args()
    batch, heads = max(1, 16384 // args.seqlen), 2048 // args.headdim
    grad = args.direction == "bwd"
    q, k, v = (torch.randn(batch, args.seqlen, heads, args.headdim, device="cuda", dtype=torch.bfloat16,
                           requires_grad=grad) for _ in range(3))
    call = attention(args.backend, args.causal)
    dout = torch.randn(batch, args.seqlen, heads, args.headdim, device="cuda", dtype=torch.bfloat16)
    for last in (False, False, False, True):
        if grad:
            out = call(q, k, v)
            torch.cuda.synchronize()
            if last:
                torch.cuda.nvtx.range_push("profile")
            out.backward(dout)
        else:
            with torch.no_grad():
                if last:
                    torch.cuda.nvtx.range_push("profile")
                call(q, k, v)
        if last:
            torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
        q.grad = k.grad = v.grad = None


if __name__ == "__main__":
    main()
