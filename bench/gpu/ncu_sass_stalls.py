#!/usr/bin/env python3
"""Where a kernel's warps wait, instruction by instruction: reads the SASS source page Nsight Compute
exports (`ncu --import R.ncu-rep --page source --csv --print-source sass`, scripts/ncu_sass.sh) and
prints the stall samples by reason, the instructions that hold the most samples with their top
reasons, and, given --regions, the share of samples in each address range (region boundaries are
the low 20 bits of SASS addresses, read off the listing, e.g. a8040:loop).

    python3 bench/gpu/ncu_sass_stalls.py fwd-sass.csv --top 30 --regions a2800:setup a8040:loop
"""
import argparse
import csv


def load(path):
    rows = list(csv.reader(open(path)))
    header = rows[1]  # rows[0] names the kernel
    return header, rows[2:]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--regions", nargs="*", default=[], help="ADDR:NAME, ADDR the region's first address in hex")
    args = p.parse_args()
    header, rows = load(args.csv)
    col = {h: i for i, h in enumerate(header)}
    reasons = [h for h in header if h.startswith("stall_") and not h.endswith("(Not Issued)")]
    samples_col = col["Warp Stall Sampling (All Samples)"]

    def samples(r):
        return int(r[samples_col] or 0)

    def count(r, h):
        return int(r[col[h]] or 0)

    total = sum(samples(r) for r in rows) or 1
    print(f"{total} samples")
    by_reason = {h: sum(count(r, h) for r in rows) for h in reasons}
    for h, v in sorted(by_reason.items(), key=lambda kv: -kv[1])[:12]:
        print(f"  {h[6:]:20} {v:9} {100 * v / total:5.1f}%")
    print(f"\ntop {args.top} instructions (address, samples, share, SASS, top reasons):")
    for r in sorted(rows, key=lambda r: -samples(r))[: args.top]:
        top = sorted(((count(r, h), h[6:]) for h in reasons), reverse=True)[:2]
        why = " ".join(f"{name}:{v}" for v, name in top if v)
        print(f"  {r[0][-5:]} {samples(r):8} {100 * samples(r) / total:5.1f}%  {r[1].strip()[:64]:64} {why}")
    if args.regions:
        cuts = sorted((int(a, 16), name) for a, name in (x.split(":", 1) for x in args.regions))
        share = {name: 0 for _, name in cuts}
        for r in rows:
            address = int(r[0], 16) & 0xFFFFF
            inside = [name for start, name in cuts if address >= start]
            if inside:
                share[inside[-1]] += samples(r)
        print("\nregions:")
        for start, name in cuts:
            print(f"  {start:05x} {name:28} {share[name]:8} {100 * share[name] / total:5.1f}%")


if __name__ == "__main__":
    main()
