#!/usr/bin/env python3
"""The FlashAttention papers' forward sweep on the GPU: 16k tokens in total (batch = 16384 / seqlen),
hidden 2048 (heads = 2048 / headdim), bf16, head dims 64/128/256, seqlen 512..16k, causal and not.
tileattn (libtileattn through ctypes), PyTorch SDPA's flash backend (FlashAttention-2) and its
cuDNN backend are timed in the same process: median of >= 20 runs by CUDA events after warm-up.
TFLOP/s = 4 * B * H * S^2 * d / time (halved when causal).  Prints a table and writes a CSV (GPU,
date and git commit on every row) to bench/results/.

Usage: python3 bench/gpu/fwd_sweep.py [--lib path/to/libtileattn.so] [--out file.csv]
       [--headdims 64,128,256] [--seqlens 512,...] [--runs 30] [--families auto|sm80,sm90]

--families times tileattn once per forward family, forced through TILEATTN_FORWARD_FAMILY (see
src/cuda/cuda_forward.cu); rows are named tileattn-sm80, tileattn-sm90 (plain "tileattn" for auto).
"""
import argparse
import ctypes
import datetime
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "cuda"))
from timing import git_commit, median_ms  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=os.path.join(ROOT, "build-cuda", "src", "libtileattn.so"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--headdims", default="64,128,256")
    ap.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--families", default="auto", help="comma list of auto, sm80, sm90")
    args = ap.parse_args()
    sys.argv = [sys.argv[0], args.lib]
    import check_forward as tf  # the ctypes mirror and call helper

    gpu = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()
    commit = git_commit()
    out_path = args.out or os.path.join(ROOT, "bench", "results", f"fwd_sweep_{date}.csv")
    rows = []
    print(f"{gpu} | {date} | commit {commit}")
    families = args.families.split(",")
    impls = ["tileattn" if f == "auto" else f"tileattn-{f}" for f in families]
    print(f"{'causal':>6} {'d':>4} {'seqlen':>6} | " + " ".join(f"{n:>13}" for n in impls)
          + f" {'sdpa-flash':>10} {'sdpa-cudnn':>10}  TFLOP/s")
    for causal in (False, True):
        for d in [int(x) for x in args.headdims.split(",")]:
            for s in [int(x) for x in args.seqlens.split(",")]:
                b, h = 16384 // s, 2048 // d
                q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                out = torch.empty_like(q)
                lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
                window = (-1, 0) if causal else (-1, -1)
                flops = 4 * b * h * s * s * d / (2 if causal else 1)
                result = {}

                # The params are filled once, as a framework binding would cache them: the timed
                # call is the library's (validation, dispatch, launch), not ctypes field setting.
                params = ctypes.byref(tf.make_params(q, k, v, out, lse, window=window))

                def run_tileattn():
                    if tf.LIB.tileattn_forward(params) != 0:
                        raise RuntimeError(tf.LIB.tileattn_last_error().decode())

                qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                for name, fn in (
                    *[(n, run_tileattn) for n in impls],
                    ("sdpa-flash", lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)),
                    ("sdpa-cudnn", lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)),
                ):
                    backend = {"sdpa-flash": SDPBackend.FLASH_ATTENTION,
                               "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION}.get(name)
                    if name in impls:  # the library reads the variable on every call
                        os.environ["TILEATTN_FORWARD_FAMILY"] = families[impls.index(name)]
                    try:
                        if backend is None:
                            ms = median_ms(fn, args.runs)
                        else:
                            with sdpa_kernel(backend):
                                ms = median_ms(fn, args.runs)
                        result[name] = flops / ms / 1e9
                    except Exception as e:  # a backend that refuses a shape is recorded as missing
                        print(f"  {name} failed: {e}")
                        result[name] = float("nan")
                print(f"{str(causal):>6} {d:>4} {s:>6} | " + " ".join(f"{result[n]:13.1f}" for n in impls)
                      + f" {result['sdpa-flash']:10.1f} {result['sdpa-cudnn']:10.1f}", flush=True)
                for name, tflops in result.items():
                    rows.append((gpu, date, commit, name, int(causal), d, s, b, h, tflops))
                del q, k, v, out, lse, qt, kt, vt
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    with open(out_path, "w") as f:
        f.write("gpu,date,commit,impl,causal,headdim,seqlen,batch,heads,tflops\n")
        for r in rows:
            f.write(",".join(str(x) if not isinstance(x, float) else f"{x:.1f}" for x in r) + "\n")
    print("wrote", out_path)
    plot(rows, out_path[:-4] + ".png", f"{gpu}, bf16 forward, 16k tokens, hidden 2048 ({date}, {commit})")


def plot(rows, path, title):
    """TFLOP/s vs seqlen, one panel per (causal, head dim), one line per implementation."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    panels = sorted({(r[4], r[5]) for r in rows})
    heads = sorted({p[1] for p in panels})
    fig, axes = plt.subplots(2, len(heads), figsize=(5 * len(heads), 8), squeeze=False)
    for (causal, d) in panels:
        ax = axes[causal][heads.index(d)]
        for impl in sorted({r[3] for r in rows}):
            pts = sorted((r[6], r[9]) for r in rows if r[3] == impl and r[4] == causal and r[5] == d)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
        ax.set_xscale("log", base=2)
        ax.set_title(f"d{d} {'causal' if causal else 'non-causal'}")
        ax.set_xlabel("seqlen")
        ax.set_ylabel("TFLOP/s")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    print("wrote", path)


if __name__ == "__main__":
    main()
