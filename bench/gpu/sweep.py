#!/usr/bin/env python3
"""The FlashAttention papers' sweep on the GPU, forward and backward, through tileattn's Python
API: 16k tokens in total (batch = 16384 / seqlen), hidden 2048 (heads = 2048 / headdim), bf16,
head dims 64/128/256, seqlen 512..16k, causal and not.  tileattn, PyTorch SDPA's flash backend
(FlashAttention-2) and its cuDNN backend are timed in the same process: median of >= 20 runs by
CUDA events after warm-up.  TFLOP/s by FA's count: forward 4 B H S^2 d (halved when causal),
backward 2.5x the forward; the backward time is (forward + backward) - forward.

    python3 bench/gpu/sweep.py [--headdims 64 128] [--seqlens 1024 8192] [--out file.csv]
"""
import argparse
import csv
import datetime
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import tileattn
from timing import ROOT, git_commit, median_ms

BACKENDS = ("tileattn", "flash", "cudnn")


def attention_fn(backend, q, k, v, causal):
    if backend == "tileattn":
        return lambda: tileattn.flash_attn_func(q, k, v, causal=causal)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    kind = SDPBackend.FLASH_ATTENTION if backend == "flash" else SDPBackend.CUDNN_ATTENTION

    def run():
        with sdpa_kernel(kind):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)
    return run


def measure(backend, seqlen, headdim, causal, runs, directions):
    batch, heads = 16384 // seqlen, 2048 // headdim
    shape = (batch, seqlen, heads, headdim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    fn = attention_fn(backend, q, k, v, causal)
    flops = 4 * batch * heads * seqlen * seqlen * headdim / (2 if causal else 1)

    def forward():
        with torch.no_grad():
            fn()

    def forward_backward():
        q.grad = k.grad = v.grad = None
        fn().backward(dout)

    result = {}
    try:
        t_fwd = median_ms(forward, runs)
        result["fwd"] = (t_fwd, flops / t_fwd / 1e9)
        if "bwd" in directions:
            t_both = median_ms(forward_backward, runs)
            t_bwd = max(t_both - t_fwd, 1e-6)
            result["bwd"] = (t_bwd, 2.5 * flops / t_bwd / 1e9)
    except RuntimeError as error:  # a backend that rejects the shape: record it as missing
        print(f"# {backend} S={seqlen} d={headdim} causal={causal}: {str(error).splitlines()[0]}")
    return batch, heads, result


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--headdims", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--directions", nargs="+", default=["fwd", "bwd"], choices=["fwd", "bwd"])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    gpu = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()
    commit = git_commit()
    out = args.out or os.path.join(ROOT, "bench", "results", f"gpu-sweep-{date}.csv")
    print(f"# {gpu}, torch {torch.__version__}, tileattn {tileattn.library_path()}, commit {commit}")
    header = " ".join(f"{d}:{b:>9}" for d in args.directions for b in BACKENDS)
    print(f"{'causal':>6} {'d':>4} {'S':>6} | {header}   (TFLOP/s)")
    rows = []
    for causal in (False, True):
        for headdim in args.headdims:
            for seqlen in args.seqlens:
                cells = {}
                for backend in BACKENDS:
                    batch, heads, result = measure(backend, seqlen, headdim, causal, args.runs, args.directions)
                    for direction, (ms, tflops) in result.items():
                        cells[direction, backend] = tflops
                        rows.append(dict(gpu=gpu, date=date, commit=commit, direction=direction,
                                         backend=backend, causal=causal, headdim=headdim, seqlen=seqlen,
                                         batch=batch, heads=heads, ms=ms, tflops=tflops))
                line = " ".join(f"{cells.get((d, b), float('nan')):>13.1f}"
                                for d in args.directions for b in BACKENDS)
                print(f"{str(causal):>6} {headdim:>4} {seqlen:>6} | {line}", flush=True)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"# wrote {out}")


if __name__ == "__main__":
    main()
