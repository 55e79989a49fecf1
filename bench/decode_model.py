#!/usr/bin/env python3
"""A model of the CUDA decode's split kernel, fitted to fixed-split-count measurements
(`bench/gpu/decode.py --layouts contiguous:s1 contiguous:s2 ...` with TILEATTN_DECODE_FAMILY=sm90),
and its predictions for other split counts or kernel rates.  No GPU needed.

The model (docs/cuda-decode.md, "Next"): the grid's CTAs (batch x 8 KV heads x splits) go to the
SMs as slots free up, at most `slots` an SM, the SM with the fewest first; a CTA spends `fixed` us
on its bounds, Q, first-block latency, merge and stores, then streams its share of the keys (512
bytes a key at 8 KV heads x d128 x K and V in bf16) at min(cta_rate, sm_rate / the SM's streaming
CTAs) GB/s, all of them together under `hbm` GB/s; a call of several splits adds `combine` us.
Session 36's fit over 75 points (batch 8-32 x 2k-32k x 1-6 splits) gave cta_rate 32, sm_rate 44,
fixed 5, combine 3, a mean error of 3.6% and at most 12%.

    python3 bench/decode_model.py --csv bench/results/h200-decode-fixed-splits-tma-2026-12-03.csv
    python3 bench/decode_model.py --csv ... --what-if cta_rate=48 sm_rate=60 slots=3
    python3 bench/decode_model.py --csv ... --balanced 2     (equal shares across pairs, 2 us a pair)
"""
import argparse
import csv
import dataclasses
import itertools
import math

KEY_BYTES = 512  # K and V of one key of one KV head at d128, bf16
KV_HEADS = 8


@dataclasses.dataclass(frozen=True)
class Rates:
    cta_rate: float = 32.0  # GB/s one CTA can stream
    sm_rate: float = 44.0   # GB/s one SM can stream, shared by its streaming CTAs
    fixed: float = 5.0      # us a CTA spends besides streaming
    combine: float = 3.0    # us the combine adds to a split call
    hbm: float = 4500.0     # GB/s of the whole GPU
    slots: int = 2          # CTAs an SM
    sms: int = 132


def call_us(batch, keys, splits, r=Rates()):
    """The modelled time of one call, in us: batch x KV heads x splits CTAs of equal shares."""
    us = grid_us(batch * KV_HEADS * splits, keys * KEY_BYTES / splits / 1e6, r)
    return us + (r.combine if splits > 1 else 0.0)


def balanced_us(batch, keys, r=Rates(), segment=2.0):
    """A grid of one or `slots` CTAs an SM, each streaming an equal share of all (sequence, KV
    head) pairs' keys laid end to end, so a CTA's share may span pairs: each pair after its first
    costs `segment` us more (its bounds, Q and merge), and the partials always go through the
    combine.  The best over 1..slots CTAs an SM, in us."""
    pair_mb = keys * KEY_BYTES / 1e6
    total_mb = batch * KV_HEADS * pair_mb
    best = None
    for per_sm in range(1, r.slots + 1):
        ctas = per_sm * r.sms
        share = total_mb / ctas
        # The most pairs a share touches: a whole number of pairs fits exactly, else it can start
        # inside one and end inside another.
        pairs = share // pair_mb if share % pair_mb == 0 else math.ceil(share / pair_mb) + 1
        spanned = dataclasses.replace(r, fixed=r.fixed + segment * (pairs - 1))
        us = grid_us(ctas, share, spanned) + r.combine
        best = us if best is None else min(best, us)
    return best


def grid_us(ctas, mb_per_cta, r):
    """The time, in us, of `ctas` CTAs of mb_per_cta MB each, by stepping their phases to each next
    event."""
    waiting = ctas
    sms = [[] for _ in range(r.sms)]  # per SM: [fixed us left, MB left] of each resident CTA
    now = 0.0

    def dispatch():
        nonlocal waiting
        while waiting:
            sm = min(range(r.sms), key=lambda i: (len(sms[i]), i))
            if len(sms[sm]) >= r.slots:
                return
            sms[sm].append([r.fixed, mb_per_cta])
            waiting -= 1

    dispatch()
    while any(sms):
        rate = {}  # MB/us of each streaming CTA
        demand = 0.0
        for resident in sms:
            streaming = [c for c in resident if c[0] <= 0]
            for c in streaming:
                rate[id(c)] = min(r.cta_rate, r.sm_rate / len(streaming)) / 1e3
                demand += rate[id(c)]
        scale = min(1.0, r.hbm / 1e3 / demand) if demand else 1.0
        step = min(c[0] if c[0] > 0 else c[1] / (rate[id(c)] * scale) for resident in sms for c in resident)
        now += step
        for resident in sms:
            for c in list(resident):
                if c[0] > 0:
                    c[0] -= step
                else:
                    c[1] -= rate[id(c)] * scale * step
                if c[0] <= 1e-9 and c[1] <= 1e-9:
                    resident.remove(c)
        dispatch()
    return now


def read_fixed_splits(path):
    """{(batch, keys, splits): us} from a decode.py CSV's `contiguous:sN` rows, and {(batch, keys):
    us} of its `cudnn` rows."""
    points, cudnn = {}, {}
    with open(path) as f:
        for row in csv.DictReader(f):
            us = float(row["ms_graph"]) * 1e3
            if row["layout"].startswith("contiguous:s"):
                splits = int(row["layout"].split(":s")[1])
                points[(int(row["batch"]), int(row["cache_len"]), splits)] = us
            elif row["layout"] == "cudnn":
                cudnn[(int(row["batch"]), int(row["cache_len"]))] = us
    return points, cudnn


def relative_errors(points, r):
    return {p: call_us(*p, r) / us - 1 for p, us in points.items()}


def fit(points):
    """The grid point of (cta_rate, sm_rate, fixed, combine) with the least squared relative error."""
    best = None
    for cta, sm, fixed, comb in itertools.product([28, 30, 32, 34], [36, 40, 44, 48], [2, 3, 4, 5, 6], [1, 2, 3]):
        r = Rates(cta_rate=cta, sm_rate=sm, fixed=fixed, combine=comb)
        err = sum(e * e for e in relative_errors(points, r).values())
        if best is None or err < best[0]:
            best = (err, r)
    return best[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", required=True, help="decode.py CSV with contiguous:sN layouts")
    ap.add_argument("--what-if", nargs="*", default=[], help="field=value overrides of the fitted rates")
    ap.add_argument("--balanced", type=float, metavar="SEGMENT_US",
                    help="also model equal shares spanning pairs (balanced_us) at this cost a pair")
    args = ap.parse_args()
    points, cudnn = read_fixed_splits(args.csv)
    r = fit(points)
    errors = relative_errors(points, r)
    print(f"fit: {r}; mean |error| {sum(map(abs, errors.values())) / len(errors):.3f}, "
          f"max {max(map(abs, errors.values())):.3f} over {len(points)} points")
    changed = dataclasses.replace(r, **{k: type(getattr(r, k))(v) for k, v in (a.split("=") for a in args.what_if)})
    for batch, keys in sorted({(b, k) for b, k, _ in points}):
        base = min((call_us(batch, keys, s, r), s) for s in range(1, 17))
        new = min((call_us(batch, keys, s, changed), s) for s in range(1, 17))
        line = f"{batch:4d} x {keys:6d}: best {base[1]} splits {base[0]:8.1f} us"
        if args.what_if:
            line += f"; what-if best {new[1]} splits {new[0]:8.1f} us ({base[0] / new[0]:.2f}x)"
        if args.balanced is not None:
            even = balanced_us(batch, keys, changed, args.balanced)
            line += f"; balanced {even:8.1f} us ({base[0] / even:.2f}x)"
        if (batch, keys) in cudnn:
            line += f"; cuDNN measured {cudnn[(batch, keys)]:8.1f} us"
        print(line)


if __name__ == "__main__":
    main()
