#!/usr/bin/env python3
"""One attention call for Nsight Compute to profile: a benchmark backend (bench/backends.py) on the
FA sweep's shape (bench/shapes.py, 16k tokens, hidden 2048, bf16), three warm-up calls, then the
call inside an NVTX range named "profile" (for the backward, only the backward is inside it;
autograd runs it on another thread, so ncu picks the backward's kernel by name and launch count
instead, scripts/ncu_compare.sh):

    ncu --nvtx --nvtx-include "profile/" --section SpeedOfLight ... \
        python3 bench/gpu/ncu_call.py tileattn bwd --headdim 256 --seqlen 8192
"""
import argparse

import torch

import timing  # noqa: F401  bench/gpu/timing.py: puts the repository root on sys.path
from bench import backends, shapes
from bench.measure import make_inputs


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("backend", help="a bench/backends.py name, e.g. tileattn, sdpa-cudnn")
    p.add_argument("direction", choices=["fwd", "bwd"])
    p.add_argument("--headdim", type=int, default=128)
    p.add_argument("--seqlen", type=int, default=8192)
    p.add_argument("--causal", action="store_true")
    args = p.parse_args()
    case = shapes.fa_papers(args.seqlen, args.headdim, args.causal)
    grad = args.direction == "bwd"
    q, k, v, dout = make_inputs(case, "cuda", torch.bfloat16, requires_grad=grad)
    call = backends.get(args.backend).make(q, k, v, args.causal)
    for last in (False, False, False, True):
        out = call() if grad else None  # the backward's forward, outside the range
        torch.cuda.synchronize()
        if last:
            torch.cuda.nvtx.range_push("profile")
        if grad:
            out.backward(dout)
        else:
            with torch.no_grad():
                call()
        torch.cuda.synchronize()
        if last:
            torch.cuda.nvtx.range_pop()
        q.grad = k.grad = v.grad = None


if __name__ == "__main__":
    main()
