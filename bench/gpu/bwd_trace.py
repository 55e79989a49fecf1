#!/usr/bin/env python3
"""Where the warp-specialized backward's time goes within a query block: reads the clock64() stamps
of a trace build (scripts/bwd_trace/build.sh; event numbers in its patch's bwd_trace_sm90.h) after
one d128 backward and prints medians over the first wave's CTAs and the walks' steady steps, in SM
cycles: each consumer's phases, the two consumers' offset, and when the producer's loads and the
dQ writer's reductions happen against them.

    TILEATTN_LIBRARY=bwd-trace-d128.so python3 bench/gpu/bwd_trace.py --seqlens 2048 8192
"""
import argparse
import ctypes
import os

import torch

from trace_stamps import med, read, zero

CTAS, ROLES, STEPS, EVENTS = 132, 5, 48, 14
SHAPE = (CTAS, ROLES, STEPS, EVENTS)
PHASES = ["Q/dO wait", "S,dP issue", "S wait", "P", "dV issue+dP wait", "dS", "dK issue", "dS store", "dS barrier",
          "dQ issue", "products wait", "dQ buffer wait", "dQ store"]


def diffs(t, steps, a, b, role_a, role_b):
    """t[cta, role_b, step, b] - t[cta, role_a, step, a] where both were stamped."""
    return [t[c, role_b, s, b] - t[c, role_a, s, a] for c in range(CTAS) for s in steps
            if t[c, role_a, s, a] and t[c, role_b, s, b]]


def report(t, steps):
    for g in (0, 1):
        r = 3 + g
        period = [t[c, r, s + 1, 0] - t[c, r, s, 0] for c in range(CTAS) for s in steps
                  if s + 1 < STEPS and t[c, r, s, 0] and t[c, r, s + 1, 0]]
        parts = " ".join(f"{name}={med(diffs(t, steps, i, i + 1, r, r))}" for i, name in enumerate(PHASES))
        print(f"  consumer {g}: step {med(period)} cycles: {parts}")
    print(f"  consumer 1 - consumer 0: Q/dO landed {med(diffs(t, steps, 1, 1, 3, 4))}, "
          f"dS barrier passed {med(diffs(t, steps, 9, 9, 3, 4))}, products done {med(diffs(t, steps, 11, 11, 3, 4))}")
    print(f"  producer: stage free -> Q/dO issued {med(diffs(t, steps, 0, 1, 0, 0))}; "
          f"Q/dO issued -> consumer 0 sees them {med(diffs(t, steps, 1, 1, 0, 3))}; "
          f"consumer 0's step start - Q/dO issued {med(diffs(t, steps, 1, 0, 0, 3))}")
    print(f"  row statistics: stage free -> staged {med(diffs(t, steps, 0, 1, 1, 1))}")
    print(f"  dQ writer 0 (even steps): consumer 1's dQ staged -> writer sees it "
          f"{med(diffs(t, steps, 13, 0, 4, 2))}, reductions issued {med(diffs(t, steps, 0, 1, 2, 2))}, "
          f"read {med(diffs(t, steps, 1, 2, 2, 2))}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[8192])
    ap.add_argument("--tokens", type=int, default=16384, help="batch x seqlen (the FA sweep's 16k)")
    args = ap.parse_args()
    lib = ctypes.CDLL(os.environ["TILEATTN_LIBRARY"])
    import tileattn
    for seqlen in args.seqlens:
        batch, heads = max(1, args.tokens // seqlen), 16
        q, k, v = (torch.randn(batch, seqlen, heads, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        dout = torch.randn_like(q)
        for last in (False, False, False, True):
            out = tileattn.flash_attn_func(q, k, v)
            torch.cuda.synchronize()
            if last:
                zero(lib.tileattn_bwd_trace_read, SHAPE)
            out.backward(dout)
            torch.cuda.synchronize()
        walk = -(-seqlen // 64)
        print(f"d128 seqlen {seqlen}: batch {batch}, {heads} heads, walks of {walk} query blocks")
        steps = range(2, min(walk, STEPS) - 2)
        report(read(lib.tileattn_bwd_trace_read, SHAPE), steps)


if __name__ == "__main__":
    main()
