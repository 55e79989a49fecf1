"""PNGs of the results, with matplotlib's file-only backend (no display on the GPU machine)."""
import os
from collections import defaultdict

from bench import results

STYLES = {"tileattn": ("tab:red", "-"), "sdpa-flash": ("tab:blue", "--"), "sdpa-cudnn": ("tab:green", "--"),
          "sdpa-efficient": ("tab:purple", ":"), "sdpa-math": ("tab:gray", ":"),
          "fa1-triton": ("tab:orange", "-."), "fa1-triton-seqpar": ("tab:brown", "-.")}


def available():
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def sweep_pngs(csv_path, directions=None):
    """One PNG per (shape set, direction) in the CSV (directions: only these): TFLOP/s vs seqlen,
    a line per backend, a panel per (head dim, causal).  Returns the paths written."""
    rows = results.read(csv_path)
    paths = []
    for shape, direction in sorted({(r["shape"], r["direction"]) for r in rows}):
        if directions is not None and direction not in directions:
            continue
        selected = [r for r in rows if r["shape"] == shape and r["direction"] == direction]
        path = f"{os.path.splitext(csv_path)[0]}-{shape}-{direction}.png"
        sweep_png(selected, path, f"{direction}, {shape} shapes, {selected[0]['gpu']} ({selected[0]['date']})")
        paths.append(path)
    return paths


def sweep_png(rows, path, title):
    plt = _pyplot()
    headdims = sorted({r["headdim"] for r in rows})
    causals = sorted({r["causal"] for r in rows})
    fig, axes = plt.subplots(len(causals), len(headdims), figsize=(4.8 * len(headdims), 3.8 * len(causals)),
                             squeeze=False, sharey=True)
    for i, causal in enumerate(causals):
        for j, headdim in enumerate(headdims):
            ax = axes[i][j]
            lines = defaultdict(list)
            for r in rows:
                if r["causal"] == causal and r["headdim"] == headdim:
                    lines[r["backend"]].append((r["seqlen"], r["tflops"]))
            for backend, points in sorted(lines.items()):
                points.sort()
                color, style = STYLES.get(backend, (None, "-"))
                ax.plot([p[0] for p in points], [p[1] for p in points], style, color=color, marker="o",
                        markersize=3, label=backend)
            ax.set_xscale("log", base=2)
            ax.set_title(f"d{headdim}, {'causal' if causal else 'non-causal'}")
            ax.set_xlabel("sequence length")
            ax.set_ylabel("TFLOP/s")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def memory_png(table, path, title):
    """table: {backend: [(seqlen, peak GiB or None)]}."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for backend, points in sorted(table.items()):
        points = [(s, m) for s, m in points if m is not None]
        color, style = STYLES.get(backend, (None, "-"))
        ax.plot([p[0] for p in points], [p[1] for p in points], style, color=color, marker="o", label=backend)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length")
    ax.set_ylabel("peak memory beyond inputs (GiB)")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
