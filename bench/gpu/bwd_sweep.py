#!/usr/bin/env python3
"""The FA sweep for the backward only: tileattn (atomic dQ), tileattn deterministic, PyTorch SDPA's
flash (FlashAttention-2) and cuDNN backends in one process.  16k tokens (batch = 16384 / seqlen),
hidden 2048 (heads = 2048 / headdim), bf16.  The backward time is (forward + backward) - forward,
as in sweep.py and the anchors; median of --runs timings by CUDA events.  TFLOP/s by FA's count:
2.5 x 4 B H S^2 d, halved when causal.

    python3 bench/gpu/bwd_sweep.py [--headdims 128] [--seqlens 8192] [--out file.csv]
"""
import argparse
import csv
import datetime
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import tileattn
from timing import git_commit, median_ms

BACKENDS = ("tileattn", "tileattn_det", "flash", "cudnn")


def attention_fn(backend, q, k, v, causal):
    if backend.startswith("tileattn"):
        deterministic = backend == "tileattn_det"
        return lambda: tileattn.flash_attn_func(q, k, v, causal=causal, deterministic=deterministic)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    kind = SDPBackend.FLASH_ATTENTION if backend == "flash" else SDPBackend.CUDNN_ATTENTION

    def run():
        with sdpa_kernel(kind):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)
    return run


def backward_tflops(backend, seqlen, headdim, causal, runs):
    batch, heads = 16384 // seqlen, 2048 // headdim
    shape = (batch, seqlen, heads, headdim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    fn = attention_fn(backend, q, k, v, causal)
    flops = 2.5 * 4 * batch * heads * seqlen * seqlen * headdim / (2 if causal else 1)

    def forward():
        with torch.no_grad():
            fn()

    def forward_backward():
        q.grad = k.grad = v.grad = None
        fn().backward(dout)

    try:
        t_bwd = max(median_ms(forward_backward, runs) - median_ms(forward, runs), 1e-6)
    except RuntimeError as error:
        print(f"# {backend} S={seqlen} d={headdim} causal={causal}: {str(error).splitlines()[0]}")
        return batch, heads, None, None
    return batch, heads, t_bwd, flops / t_bwd / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--headdims", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--causal", nargs="+", default=["0", "1"], choices=["0", "1"])
    ap.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    gpu = torch.cuda.get_device_name()
    date = datetime.date.today().isoformat()
    commit = git_commit()
    print(f"# {gpu}, torch {torch.__version__}, tileattn {tileattn.library_path()}, commit {commit}")
    print(f"{'causal':>6} {'d':>4} {'S':>6} | " + " ".join(f"{b:>12}" for b in args.backends) + "   (bwd TFLOP/s)")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    fields = ["gpu", "date", "commit", "direction", "backend", "causal", "headdim", "seqlen", "batch", "heads",
              "ms", "tflops"]
    out = open(args.out, "w", newline="")
    writer = csv.DictWriter(out, fieldnames=fields)
    writer.writeheader()
    for causal in (c == "1" for c in args.causal):
        for headdim in args.headdims:
            for seqlen in args.seqlens:
                cells = []
                for backend in args.backends:
                    batch, heads, ms, tflops = backward_tflops(backend, seqlen, headdim, causal, args.runs)
                    cells.append(tflops)
                    if ms is not None:
                        writer.writerow(dict(gpu=gpu, date=date, commit=commit, direction="bwd", backend=backend,
                                             causal=causal, headdim=headdim, seqlen=seqlen, batch=batch,
                                             heads=heads, ms=ms, tflops=tflops))
                line = " ".join(f"{c:>12.1f}" if c is not None else f"{'-':>12}" for c in cells)
                print(f"{str(causal):>6} {headdim:>4} {seqlen:>6} | {line}", flush=True)
                out.flush()  # a run cut short still leaves every finished point
    out.close()
    print(f"# wrote {args.out}")


if __name__ == "__main__":
    main()
