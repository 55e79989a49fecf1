#!/usr/bin/env python3
"""The host side of a decode call (bench/results/h200-decode-host-path-2026-12-01.txt), batch 1,
32 query heads over 8 KV heads, d128, bf16:

  per cache length: the host time of tileattn's call, of its Python part alone (the library call
  stubbed out), of the library call alone (a parameter struct captured from a real call), and of
  SDPA's cuDNN call; "event" is one call between two CUDA events after a synchronize, as the
  anchors were measured.
  graphs: one eager call's event time as captured graphs of split calls accumulate, then after
  they are freed.  Flat is right: when the split partials came from tileattn's own pool, each
  capture added ~5.5 us to every later eager call (session 22).

    python3 bench/gpu/decode_host.py [--lengths 256 32768] [--graphs 0 1 4 16]
"""
import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import tileattn
from tileattn import _ffi

import decode as decode_bench  # bench/gpu/decode.py: its graph capture
from timing import median_ms

HEADS, HEADS_K, DIM = 32, 8, 128


def host_us(fn, runs=100):
    for _ in range(10):
        fn()
    times = []
    for _ in range(runs):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def event_us(fn, runs=30):
    """One call between two CUDA events, waited for (bench/timing.py), in microseconds."""
    return median_ms(fn, runs) * 1e3


def problem(length):
    q = torch.randn(1, 1, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, length, HEADS_K, DIM, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    seqlens = torch.full((1,), length, device="cuda", dtype=torch.int32)
    return q, k, v, seqlens


def host_split(length):
    q, k, v, seqlens = problem(length)
    call = lambda: tileattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens)  # noqa: E731
    lib = _ffi.library()
    real, captured = lib.forward_kvcache, []
    lib.forward_kvcache = lambda params: (captured.append(params), real(params))
    kept = call()  # the outputs the captured struct points at stay alive
    lib.forward_kvcache = lambda params: None
    python_only = host_us(call)
    lib.forward_kvcache = real
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)

    print(f"L={length}: Python part {python_only:.1f} us; library call {host_us(lambda: real(captured[-1])):.1f} us; "
          f"tileattn host {host_us(call):.1f} event {event_us(call):.1f} us; "
          f"SDPA cuDNN host {host_us(cudnn):.1f} event {event_us(cudnn):.1f} us", flush=True)
    del kept


def graphs_alive(counts, length=2048):
    q, k, v, seqlens = problem(length)
    call = lambda: tileattn.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens)  # noqa: E731
    graphs = []
    for count in counts:
        while len(graphs) < count:
            graphs.append(decode_bench.capture([call]))
        print(f"graphs alive {count:3d}: eager event {event_us(call):.1f} us", flush=True)
    graphs.clear()
    torch.cuda.synchronize()
    print(f"graphs freed:      eager event {event_us(call):.1f} us", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 32768])
    ap.add_argument("--graphs", type=int, nargs="+", default=[0, 1, 4, 16])
    args = ap.parse_args()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, tileattn {tileattn.library_path()}")
    for length in args.lengths:
        host_split(length)
    graphs_alive(args.graphs)


if __name__ == "__main__":
    sys.exit(main())
