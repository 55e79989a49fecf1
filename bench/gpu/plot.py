#!/usr/bin/env python3
"""TFLOP/s vs sequence length from a bench/gpu/sweep.py CSV: one panel per (direction, causal),
a line per (backend, head dim).  python3 bench/gpu/plot.py results.csv out.png"""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    source, target = sys.argv[1], sys.argv[2]
    rows = list(csv.DictReader(open(source)))
    directions = sorted({r["direction"] for r in rows})
    fig, axes = plt.subplots(len(directions), 2, figsize=(12, 4.5 * len(directions)), squeeze=False)
    styles = {"tileattn": "-", "flash": "--", "cudnn": ":"}
    colors = {"64": "tab:blue", "128": "tab:orange", "256": "tab:green"}
    for i, direction in enumerate(directions):
        for j, causal in enumerate(("False", "True")):
            ax = axes[i][j]
            lines = defaultdict(list)
            for r in rows:
                if r["direction"] == direction and r["causal"] == causal:
                    lines[r["backend"], r["headdim"]].append((int(r["seqlen"]), float(r["tflops"])))
            for (backend, headdim), points in sorted(lines.items()):
                points.sort()
                ax.plot([p[0] for p in points], [p[1] for p in points], styles.get(backend, "-"),
                        color=colors.get(headdim), marker="o", markersize=3, label=f"{backend} d{headdim}")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{direction}, causal={causal}")
            ax.set_xlabel("sequence length (16k tokens per batch)")
            ax.set_ylabel("TFLOP/s")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, ncol=3)
    gpu = rows[0]["gpu"] if rows else ""
    fig.suptitle(f"tileattn vs SDPA flash / cuDNN, bf16, {gpu}")
    fig.tight_layout()
    fig.savefig(target, dpi=110)


if __name__ == "__main__":
    main()
