#!/usr/bin/env python3
"""KV-cache calls with many query rows (a chunked prefill through flash_attn_with_kvcache): how the
decode kernels, which give every 16 rows of a KV group a CTA of their own that streams the whole
cache, compare with the forward kernels on the same data as the query rows grow.

Shapes: batch B, a full cache of L keys, 32 query heads over 8 KV heads, d 128 (--heads, --heads-k,
--dim), bf16, Sq query rows a sequence (no append), non-causal and causal (bottom-right, as
flash-attn aligns Sq < Sk).
Columns, each captured in a CUDA graph (decode.py's capture: 6 calls a replay, so the host's
launch cost is out of the number; eager launches were host-bound at a few rows on session 62's
second H100) and replayed in balanced interleaved rounds (decode.py's interleaved_ms); the route's
choice is read when a call is captured:
  kvcache       tileattn.flash_attn_with_kvcache on the contiguous cache, cache_seqlens = L, the
                library's choice of kernels (TILEATTN_KVCACHE_FORWARD=auto)
  decode, route the same call forced onto the decode kernels (=off) or the forward kernels (=on)
  route-packed, route-unpacked  the route with each KV group's query heads packed into the forward's
                rows or not (TILEATTN_KVCACHE_PACK_GQA = on | off; `route` takes the library's choice)
  kvcache-p16   the same memory as pages of 16 in a random order, the library's choice (the forward
                reads them box by box from 16 rows a sequence, kvcache_forward_route.cu)
  p16-decode, p16-route  the same call forced onto the decode kernels or the forward (where the
                rule's threshold for pages read box by box crosses over)
  kvcache-p256  pages of 256 (on compute capability 9.0 the forward reads them in place)
  forward       tileattn.flash_attn_func(q, k_cache, v_cache) on the same data (the sm90 forward)
  cudnn, flash  SDPA's backends, non-causal only (enable_gqa; their causal mask is top-left)
With --rotary every kvcache column passes rotary tables (rotary_dim = d, not interleaved: q rotated
at cache_seqlens, + i when causal), which the decode kernels apply as they load q and the route by a
kernel that writes a rotated copy of q first; forward, cudnn and flash stay unrotated.
TFLOP/s by FA's formula, 4 B H Sq L d, halved when causal (for Sq << L the causal call does
almost the non-causal work, so its TFLOP/s reads low; the times are what to compare).

    python3 bench/gpu/kvcache_rows.py [--batch 4] [--length 4096] [--rows 1 2 4 8 16 32 64 128 512 1024] [--rotary]
        [--heads 32] [--heads-k 8] [--dim 128]
"""
import argparse
import datetime
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import timing  # bench/gpu/timing.py: puts the repository root on sys.path
import tileattn  # noqa: E402
from decode import capture, interleaved_ms  # noqa: E402 (bench/gpu/decode.py)



def with_route(call, value, pack="auto"):
    """call() with TILEATTN_KVCACHE_FORWARD set to value and TILEATTN_KVCACHE_PACK_GQA to pack (read
    by the library at every call)."""
    def run():
        os.environ["TILEATTN_KVCACHE_FORWARD"] = value
        os.environ["TILEATTN_KVCACHE_PACK_GQA"] = pack
        return call()
    return run


def columns(q, k_cache, v_cache, causal, rotary):
    """name -> zero-argument call."""
    batch, length = k_cache.shape[:2]
    seqlens = torch.full((batch,), length, device="cuda", dtype=torch.int32)
    extra = {}
    if rotary:
        positions = length + q.shape[1]  # the last query row's position when causal
        angles = torch.rand(positions, q.shape[-1] // 2, device="cuda") * 6.28
        extra = dict(rotary_cos=angles.cos().to(q.dtype), rotary_sin=angles.sin().to(q.dtype))

    def paged(page):
        """The same memory as pages of `page` rows in a random order."""
        blocks = batch * length // page
        k_pages = k_cache.view(blocks, page, *k_cache.shape[2:])
        v_pages = v_cache.view(blocks, page, *v_cache.shape[2:])
        table = torch.randperm(blocks, device="cuda", dtype=torch.int32).view(batch, length // page)
        return lambda: tileattn.flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=seqlens,
                                                        block_table=table, causal=causal, **extra)
    def contiguous():
        return tileattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, causal=causal, **extra)

    fns = {
        "kvcache": with_route(contiguous, "auto"),
        "decode": with_route(contiguous, "off"),
        "route": with_route(contiguous, "on"),
        "route-packed": with_route(contiguous, "on", "on"),
        "route-unpacked": with_route(contiguous, "on", "off"),
        "kvcache-p16": with_route(paged(16), "auto"),
        "p16-decode": with_route(paged(16), "off"),
        "p16-route": with_route(paged(16), "on"),
        "kvcache-p256": with_route(paged(256), "auto"),
        "forward": lambda: tileattn.flash_attn_func(q, k_cache, v_cache, causal=causal),
    }
    if not causal:
        qt, kt, vt = q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2)
        for name, kind in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            def run(kind=kind):
                with sdpa_kernel(kind):
                    return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
            fns[name] = run
    return fns


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 512, 1024])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rotary", action="store_true", help="rotary tables on the kvcache columns")
    ap.add_argument("--heads", type=int, default=32, help="query heads")
    ap.add_argument("--heads-k", type=int, default=8, help="KV heads")
    ap.add_argument("--dim", type=int, default=128, help="head dim")
    args = ap.parse_args()
    print(f"# {torch.cuda.get_device_name()}, {datetime.date.today().isoformat()}, torch {torch.__version__}, tileattn {tileattn.library_path()}, "
          f"commit {timing.git_commit()}; B {args.batch}, L {args.length}, {args.heads}/{args.heads_k} heads, d {args.dim}, bf16"
          + (", rotary on the kvcache columns" if args.rotary else ""))
    names = ["kvcache", "decode", "route", "route-packed", "route-unpacked", "kvcache-p16", "p16-decode", "p16-route", "kvcache-p256", "forward", "cudnn", "flash"]
    print(f"{'causal':>6} {'Sq':>5} | " + " ".join(f"{n:>14}" for n in names) + "   (us | TFLOP/s)")
    shape = (args.batch, args.length, args.heads_k, args.dim)
    k_cache = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    for causal in (False, True):
        for rows in args.rows:
            q = torch.randn(args.batch, rows, args.heads, args.dim, device="cuda", dtype=torch.bfloat16)
            fns = columns(q, k_cache, v_cache, causal, args.rotary)
            graphs = {}
            for name, fn in fns.items():
                try:
                    graphs[name] = capture([fn])
                except RuntimeError:  # an SDPA backend that does not take the shape: its column reads "-"
                    if name not in ("cudnn", "flash"):
                        raise
            times = interleaved_ms(graphs, rounds=args.rounds)
            del graphs
            flops = 4 * args.batch * args.heads * rows * args.length * args.dim / (2 if causal else 1)
            cells = []
            for name in names:
                if name not in times:
                    cells.append(f"{'-':>14}")
                    continue
                ms = times[name]
                cells.append(f"{ms * 1e3:>7.0f} {flops / ms / 1e9:>6.0f}")
            print(f"{str(causal):>6} {rows:>5} | " + " ".join(cells), flush=True)


if __name__ == "__main__":
    main()
