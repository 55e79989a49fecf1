#!/usr/bin/env python3
"""Attention with dropout on CUDA: forward and forward+backward at p = 0.1, d64 and d128, 2k and 8k
tokens (16k tokens a batch, 2048 hidden, bf16), tileattn next to SDPA's flash and cuDNN backends
and tileattn without dropout, all in one run.  TFLOP/s by FA's formula (4 B H Sq Sk d, halved when
causal; forward+backward 3.5x the forward).

    python3 bench/gpu/dropout.py --out bench/results/h200-dropout-<date>.csv
"""
import argparse
import csv
import datetime

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import timing  # bench/gpu/timing.py: the bench package's timer and provenance
import tileattn

P = 0.1


def tileattn_call(p):
    return lambda q, k, v, causal: tileattn.flash_attn_func(q, k, v, dropout_p=p, causal=causal)


def sdpa_call(backend):
    def call(q, k, v, causal):
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 dropout_p=P, is_causal=causal)
        return out.transpose(1, 2)
    return call


BACKENDS = {
    "tileattn": tileattn_call(P),
    "tileattn-no-dropout": tileattn_call(0.0),
    "sdpa-flash": sdpa_call(SDPBackend.FLASH_ATTENTION),
    "sdpa-cudnn": sdpa_call(SDPBackend.CUDNN_ATTENTION),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=list(BACKENDS))
    args = parser.parse_args()
    gpu, date, commit = torch.cuda.get_device_name(), datetime.date.today().isoformat(), timing.git_commit()
    rows = []
    for d in (64, 128):
        for seqlen in (2048, 8192):
            for causal in (False, True):
                batch, heads = 16384 // seqlen, 2048 // d
                q, k, v = (torch.randn(batch, seqlen, heads, d, device="cuda", dtype=torch.bfloat16,
                                       requires_grad=True) for _ in range(3))
                dout = torch.randn_like(q)
                flops = 4 * batch * heads * seqlen * seqlen * d / (2 if causal else 1)
                for name in args.backends:
                    call = BACKENDS[name]
                    def forward():
                        with torch.no_grad():
                            call(q, k, v, causal)

                    def forward_backward():
                        torch.autograd.grad(call(q, k, v, causal), (q, k, v), dout)

                    for direction, fn, work in (("fwd", forward, flops), ("fwdbwd", forward_backward, 3.5 * flops)):
                        try:
                            ms = timing.median_ms(fn, args.runs)
                        except RuntimeError as error:  # a backend that refuses the shape or dropout
                            print(f"{name} {direction} d{d} {seqlen} causal={int(causal)}: {str(error)[:80]}")
                            ms = float("nan")
                        rows.append([gpu, date, commit, name, direction, d, seqlen, int(causal), ms, work / ms / 1e9])
                        print(f"{name:20s} {direction:6s} d{d:<4d} {seqlen:5d} causal={int(causal)}  "
                              f"{ms:8.3f} ms  {work / ms / 1e9:6.0f} TFLOP/s", flush=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["gpu", "date", "commit", "backend", "direction", "headdim", "seqlen", "causal", "ms", "tflops"])
        writer.writerows(rows)


if __name__ == "__main__":
    main()
