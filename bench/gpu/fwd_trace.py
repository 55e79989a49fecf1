#!/usr/bin/env python3
"""Where the sm90 forward's time goes, step by step: reads the clock64() stamps of a trace build
(scripts/fwd_trace/build.sh; event numbers in its patch's fwd_trace_sm90.h) after one forward call
and prints medians over CTAs and rounds, in SM cycles: each consumer's steps per tile (grouped by
query block when the tiles differ, as under a causal mask), the key-block loop's iterations 2-4
split into turn, issue, waits and softmax, and the producer's loads against the consumers.

    TILEATTN_LIBRARY=trace-d128.so python3 bench/gpu/fwd_trace.py --headdim 128 --seqlens 1024 8192
"""
import argparse
import ctypes
import os

import numpy as np
import torch

from trace_stamps import med, read, zero

CTAS, ROLES, ROUNDS, EVENTS = 132, 4, 64, 41
SHAPE = (CTAS, ROLES, ROUNDS, EVENTS)
STAMPS = 38  # events 0..37 are clock64 stamps; 38..40 hold values (key blocks, query block, own blocks)
TILE_STEPS = ["sched+Q wait", "Q to registers", "first K wait", "first turn", "first QK", "first softmax",
              "loop", "last PV", "finalize", "store"]
LOOP_STEPS = {"turn": (0, 1), "QK issue": (1, 7), "V wait": (7, 8), "PV issue": (8, 2), "S wait": (2, 3),
              "softmax": (3, 4), "PV wait": (4, 5), "tail": (5, 6)}


def spans(t, sel, a, b):
    """t[.., b] - t[.., a] over the (cta, round) pairs in sel where both steps ran (stamps are zeroed first)."""
    return [t[c, r, b] - t[c, r, a] for c, r in sel if t[c, r, a] and t[c, r, b]]


def report(trace, consumers, rounds):
    rs = range(1, rounds - 1)  # full rounds, the first and last left out
    cons = [trace[:, 1 + c] for c in range(consumers)]
    groups = sorted(set(cons[0][:, 1:rounds - 1, 39].ravel()))
    if len(set(cons[0][:, 1:rounds - 1, 38].ravel())) == 1:
        groups = [None]  # every tile alike: one group
    for g in groups:
        sel = [(c, r) for c in range(CTAS) for r in rs if g is None or cons[0][c, r, 39] == g]
        period = [cons[0][c, r + 1, 0] - cons[0][c, r, 0] for c, r in sel if cons[0][c, r + 1, 0]]
        head = "all tiles" if g is None else f"query block {g}"
        blocks = med([cons[0][c, r, 38] for c, r in sel])
        print(f"  {head}: {len(sel)} tiles, {blocks} key blocks, period {med(period)} cycles")
        for k, t in enumerate(cons):
            own = med([t[c, r, 40] for c, r in sel])
            steps = " ".join(f"{name}={med(spans(t, sel, i, i + 1))}" for i, name in enumerate(TILE_STEPS))
            print(f"    consumer {k} ({own} own blocks): {steps}")

    def loop(t, i, k):
        return np.array([t[c, r, 11 + 9 * i + k] for c in range(CTAS) for r in rs])

    if cons[0][:, 1:rounds - 1, 38].min() >= 6:
        for k, t in enumerate(cons):
            steps = " ".join(f"{name}={med(np.concatenate([loop(t, i, b) - loop(t, i, a) for i in range(3)]))}"
                             for name, (a, b) in LOOP_STEPS.items())
            iteration = med(np.concatenate([loop(t, i + 1, 0) - loop(t, i, 0) for i in range(2)]))
            print(f"    loop, consumer {k}: {steps} iteration={iteration}")
        if consumers == 2:
            s0_s1 = np.concatenate([loop(cons[1], i, 3) - loop(cons[0], i, 3) for i in range(3)])
            s1_s0 = np.concatenate([loop(cons[0], i + 1, 3) - loop(cons[1], i, 3) for i in range(2)])
            print(f"    tensor pipe: consumer 0's S -> consumer 1's S {med(s0_s1)}, back {med(s1_s0)} (2 products each)")
    prod = trace[:, 0]
    issued = [prod[c, r + 1, 1] - cons[0][c, r, 7] for c in range(CTAS) for r in rs]
    landed = [cons[0][c, r + 1, 3] - prod[c, r + 1, 1] for c in range(CTAS) for r in rs]
    print(f"  producer: next tile's first K issued {med(issued)} after consumer 0's loop ended, "
          f"seen landed {med(landed)} after issue")
    # The producer's steps around a tile boundary, against consumer 0's loop end (event 7) of the
    # same round: V(first + 1) and V(first) issued, the next round's start (its tile decoded after
    # it), first K issued, Q's buffer free and Q issued.
    marks = [("V(first+1)", 0, 5), ("V(first)", 0, 6), ("next round", 1, 0), ("next K(last)", 1, 1),
             ("next Q free", 1, 2), ("next Q issued", 1, 3)]
    cols = []
    for name, dr, e in marks:
        vals = [prod[c, r + dr, e] - cons[0][c, r, 7] for c in range(CTAS) for r in rs
                if prod[c, r + dr, e] and cons[0][c, r, 7]]
        cols.append(f"{name} {med(vals)}")
    print("  producer around the boundary (cycles after consumer 0's loop end): " + ", ".join(cols))


def cta_spans(trace):
    """Each CTA's busy span, its first stamp to its last over every role and round (one SM's clock:
    spans compare across CTAs, stamps do not), and how far the CTAs' spans spread: the call's tail
    is the longest span against the mean."""
    times = trace[:, :, :, :STAMPS]
    spans = np.array([t[t > 0].max() - t[t > 0].min() for t in times if (t > 0).any()])
    print(f"  CTA spans (cycles): min {spans.min()}, median {np.median(spans):.0f}, max {spans.max()}; "
          f"mean / max {spans.mean() / spans.max():.3f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 8192])
    ap.add_argument("--causal", choices=["no", "yes", "both"], default="no")
    ap.add_argument("--tokens", type=int, default=16384, help="batch x seqlen (the FA sweep's 16k)")
    args = ap.parse_args()
    lib = ctypes.CDLL(os.environ["TILEATTN_LIBRARY"])
    import tileattn
    consumers = 3 if args.headdim <= 64 else 2
    rows = 64 * consumers
    for seqlen in args.seqlens:
        for causal in {"no": [False], "yes": [True], "both": [False, True]}[args.causal]:
            batch, heads = max(1, args.tokens // seqlen), 2048 // args.headdim
            q, k, v = (torch.randn(batch, seqlen, heads, args.headdim, device="cuda", dtype=torch.bfloat16)
                       for _ in range(3))
            for _ in range(4):
                tileattn.flash_attn_func(q, k, v, causal=causal)
            torch.cuda.synchronize()
            zero(lib.tileattn_fwd_trace_read, SHAPE)
            tileattn.flash_attn_func(q, k, v, causal=causal)
            torch.cuda.synchronize()
            tiles = batch * heads * -(-seqlen // rows)
            rounds = min(tiles // CTAS, ROUNDS - 1)
            print(f"d{args.headdim} seqlen {seqlen} causal {causal}: batch {batch}, {heads} heads, {tiles} tiles, "
                  f"{rounds} full rounds")
            if rounds < 3:
                print("  too few rounds to report")
                continue
            trace = read(lib.tileattn_fwd_trace_read, SHAPE)
            report(trace, consumers, rounds)
            cta_spans(trace)


if __name__ == "__main__":
    main()
