#!/usr/bin/env python3
"""Where an eager forward call's time goes, tileattn next to SDPA's cuDNN and flash backends, bf16
at 16k tokens (B x S, hidden 2048 as in the sweep's "fa" shapes), no autograd:

  event-timed   one call between two CUDA events after a synchronize, as `python3 -m bench sweep`
                times it: the host's work before the launch plus the kernels
  kernels       the GPU time of the call's kernels (torch profiler), then the largest of them
  back-to-back  wall time per call over 50 calls issued without waiting
  host issue    wall time per call to issue 200 calls (the GPU queue absorbs them)

    python3 bench/gpu/host_vs_kernel.py [--headdims 128] [--seqlens 512 2048 8192] [--causal no]
"""
import argparse
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

import tileattn


def sdpa(backend, causal):
    def call(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=causal)
    return call


def measure(fn):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(30):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    event = sorted(times)[len(times) // 2]
    t0 = time.perf_counter()
    for _ in range(200):
        fn()
    issue = (time.perf_counter() - t0) / 200 * 1e6
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    back_to_back = (time.perf_counter() - t0) / 50 * 1e6
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
    averages = prof.key_averages()
    kernels = sum(e.device_time_total for e in averages) / 20
    # Each GPU op of the call and its time a call: a backend whose kernels add up to more than its
    # event-timed call runs work outside the timed stream, or more kernels than it seems.
    ops = sorted(((e.device_time_total / 20, e.count // 20, e.key) for e in averages if e.device_time_total > 0),
                 reverse=True)
    return event, kernels, back_to_back, issue, ops


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--headdims", type=int, nargs="+", default=[128])
    p.add_argument("--seqlens", type=int, nargs="+", default=[512, 2048, 8192])
    p.add_argument("--causal", choices=("no", "yes", "both"), default="no")
    args = p.parse_args()
    causal_values = {"no": [False], "yes": [True], "both": [False, True]}[args.causal]
    with torch.no_grad():
        for head_dim in args.headdims:
            for seqlen in args.seqlens:
                batch, heads = max(1, 16384 // seqlen), 2048 // head_dim
                q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16)
                           for _ in range(3))
                for causal in causal_values:
                    cudnn, flash = (sdpa(backend, causal)
                                    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION))
                    calls = (("tileattn", lambda: tileattn.flash_attn_func(q, k, v, causal=causal)),
                             ("sdpa-cudnn", lambda: cudnn(q, k, v)),
                             ("sdpa-flash", lambda: flash(q, k, v)))
                    for name, fn in calls:
                        event, kernels, back_to_back, issue, ops = measure(fn)
                        print(f"d{head_dim} S={seqlen:5d} B={batch:2d} causal={int(causal)} {name:10s} "
                              f"event-timed {event:7.1f} us  kernels {kernels:7.1f} us  "
                              f"back-to-back {back_to_back:7.1f} us  host issue {issue:6.1f} us")
                        for us, count, op in ops[:3]:
                            print(f"      {us:8.1f} us  x{count}  {op[:90]}")


if __name__ == "__main__":
    main()
