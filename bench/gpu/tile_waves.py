#!/usr/bin/env python3
"""Does the sm90 forward lose the last, partly filled round of its persistent schedule?  Every
non-causal point of the FA sweep has 2048 query tiles at d128 (1024 at d256, 2752-3072 at d64):
on 132 SMs 15.52 rounds, so the last round runs 68 tiles while 64 SMs idle, 3% of the call if a
round costs what a tile does.  This times forward calls whose tile counts fill their last round to
different degrees at the same sequence length (heads varied, batch fixed) and prints TFLOP/s per
shape, tileattn and SDPA's cuDNN backend in the same process, the backends in rotation.  If the
tail costs what the model says, tileattn's rate at a count that fills whole rounds (2112 tiles at
d128 8k: 1 x 33 heads) is ~3% above its rate at 2048 (1 x 32: 0.97 of 16 rounds), while cuDNN,
whose schedule differs, moves otherwise.

    python3 bench/gpu/tile_waves.py [--seqlen 8192] [--headdim 128] [--shapes 1x32 1x33 2x16 ...]
"""
import argparse
import math

import torch

import timing  # noqa: F401  bench/gpu/timing.py: puts the repository root on sys.path
from bench import backends, shapes
from bench.measure import Limits, time_backend

ROWS = {64: 192, 128: 128, 256: 128}  # query rows a tile of the sm90 forward (tile_config_sm90.h)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--headdim", type=int, default=128)
    ap.add_argument("--shapes", nargs="+", default=["1x32", "1x33", "2x16", "1x31", "1x34", "2x17"],
                    help="batch x heads")
    ap.add_argument("--backends", nargs="+", default=["tileattn", "sdpa-cudnn"])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--queue", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3, help="passes over the shapes, backends rotated")
    args = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cases = []
    for spec in args.shapes:
        batch, heads = (int(x) for x in spec.split("x"))
        cases.append(shapes.Case("waves", batch, heads, args.seqlen, args.headdim, False))
    results = {(c.label(), b): [] for c in cases for b in args.backends}
    for r in range(args.rounds):
        order = args.backends[r % len(args.backends):] + args.backends[:r % len(args.backends)]
        for case in cases:
            for name in order:
                timed = time_backend(backends.get(name), case, ["fwd"], "cuda", torch.bfloat16, Limits(),
                                     runs=args.runs, queue=args.queue)
                if isinstance(timed, str):  # the backend refused or skipped the case
                    raise SystemExit(f"{name}, {case.label()}: {timed}")
                results[(case.label(), name)].append(shapes.rate(case, "fwd", timed["fwd"])[0])
    print(f"# {torch.cuda.get_device_name(0)}, {sms} SMs, d{args.headdim}, {args.seqlen} keys, non-causal, "
          f"commit {timing.git_commit()}; TFLOP/s, median of {args.rounds} rounds")
    print("# tiles: batch x heads x ceil(seqlen / rows); fill: tiles / (rounds x SMs)")
    print(f"{'shape':>8} {'tiles':>6} {'fill':>6} " + " ".join(f"{b:>12}" for b in args.backends))
    for case in cases:
        tiles = case.batch * case.heads * math.ceil(case.seqlen / ROWS[case.headdim])
        fill = tiles / (math.ceil(tiles / sms) * sms)
        rates = [sorted(results[(case.label(), b)])[len(results[(case.label(), b)]) // 2] for b in args.backends]
        print(f"{case.batch:>3}x{case.heads:<4} {tiles:>6} {fill:>6.3f} " + " ".join(f"{x:>12.1f}" for x in rates))


if __name__ == "__main__":
    main()
