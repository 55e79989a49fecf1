#!/usr/bin/env python3
"""Few query tiles over many keys through flash_attn_func (a chunked prefill against a long cache,
or one long head): the sm90 forward's persistent grid then has fewer tiles than slots, and without
the tail split most SMs idle (16 tiles of 128 rows on 66 cluster slots: a quarter of the GPU busy).
Times tileattn with TILEATTN_FORWARD_TAIL_SPLIT off, auto and on, and SDPA's cuDNN backend, in
rotation, and prints TFLOP/s (4 B H Sq Sk d) with the split's speedups (auto splits the first,
second and fourth shapes: docs/cuda-forward-sm90.md, "The tail split").  With --varlen tileattn
runs the same data through flash_attn_varlen_func (equal lengths in cu_seqlens), so the sequence-
bounds kernels and their key split serve it; cuDNN stays on the padded batch.  On the GPU
machine, from the repository root:

    TILEATTN_LIBRARY=... python3 bench/gpu/chunked_prefill.py [--varlen] [--runs 10] [--queue 5] [--rounds 3]
"""
import argparse
import os

import torch

import tileattn
import timing  # bench/gpu/timing.py: puts the repository root on sys.path
from bench import backends  # noqa: E402

# (batch, query rows, keys, heads), d128, non-causal.  Tiles: batch x heads x ceil(rows / 128).
SHAPES = [(1, 128, 32768, 16), (1, 512, 32768, 16), (4, 256, 8192, 16), (1, 8192, 8192, 1), (1, 2048, 16384, 8)]


def varlen_call(q, k, v):
    """The padded batch's data as equal-length sequences of a varlen call."""
    batch, rows, keys = q.shape[0], q.shape[1], k.shape[1]
    cu_q, cu_k = (torch.arange(0, (batch + 1) * n, n, device="cuda", dtype=torch.int32) for n in (rows, keys))
    flat_q, flat_k, flat_v = (t.flatten(0, 1) for t in (q, k, v))
    return lambda: tileattn.flash_attn_varlen_func(flat_q, flat_k, flat_v, cu_q, cu_k, rows, keys)


def with_split(call, value):
    def run():
        os.environ["TILEATTN_FORWARD_TAIL_SPLIT"] = value
        return call()
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--queue", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3, help="passes over the shapes, backends rotated")
    ap.add_argument("--varlen", action="store_true", help="tileattn through flash_attn_varlen_func")
    args = ap.parse_args()
    names = ["split off", "split auto", "split on", "sdpa-cudnn"]
    rates = {}
    for r in range(args.rounds):
        for batch, rows, keys, heads in SHAPES:
            q = torch.randn(batch, rows, heads, 128, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(batch, keys, heads, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            tile = varlen_call(q, k, v) if args.varlen else backends.get("tileattn").make(q, k, v, False)
            calls = {"split off": with_split(tile, "off"), "split auto": with_split(tile, "auto"),
                     "split on": with_split(tile, "on"),
                     "sdpa-cudnn": backends.get("sdpa-cudnn").make(q, k, v, False)}
            order = names[r % len(names):] + names[:r % len(names)]
            for name in order:
                with torch.no_grad():
                    ms = timing.median_ms(calls[name], args.runs, queue=args.queue)
                flops = 4.0 * batch * heads * rows * keys * 128
                rates.setdefault((batch, rows, keys, heads), {}).setdefault(name, []).append(flops / ms / 1e9)
    os.environ.pop("TILEATTN_FORWARD_TAIL_SPLIT", None)
    print(f"# {torch.cuda.get_device_name(0)}, d128 bf16 non-causal, commit {timing.git_commit()}; "
          f"TFLOP/s, median of {args.rounds} rounds; tileattn {'varlen' if args.varlen else 'padded'}")
    print(f"{'batch x rows x keys x heads':>28} {'tiles':>6} " + " ".join(f"{n:>11}" for n in names)
          + "  on/off auto/off")
    for (batch, rows, keys, heads), per in rates.items():
        med = {n: sorted(v)[len(v) // 2] for n, v in per.items()}
        tiles = batch * heads * -(-rows // 128)
        label = f"{batch} x {rows} x {keys} x {heads}"
        cells = " ".join(f"{med[n]:>11.1f}" for n in names)
        print(f"{label:>28} {tiles:>6} {cells}  {med['split on'] / med['split off']:6.2f} "
              f"{med['split auto'] / med['split off']:8.2f}")


if __name__ == "__main__":
    main()
