#!/usr/bin/env python3
"""Where an eager forward call's time goes, tileattn next to SDPA's cuDNN backend, d128 bf16 at 16k
tokens (B x S, 16 heads), no autograd:

  event-timed   one call between two CUDA events after a synchronize, as `python3 -m bench sweep`
                times it: the host's work before the launch plus the kernels
  kernels       the GPU time of the call's kernels (torch profiler), then the largest of them
  back-to-back  wall time per call over 50 calls issued without waiting
  host issue    wall time per call to issue 200 calls (the GPU queue absorbs them)

    python3 bench/gpu/host_vs_kernel.py
"""
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

import tileattn


def cudnn(q, k, v):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))


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
    with torch.no_grad():
        for seqlen, batch in ((512, 32), (2048, 8), (8192, 2)):
            q, k, v = (torch.randn(batch, seqlen, 16, 128, device="cuda", dtype=torch.bfloat16)
                       for _ in range(3))
            for name, fn in (("tileattn", lambda: tileattn.flash_attn_func(q, k, v)),
                             ("sdpa-cudnn", lambda: cudnn(q, k, v))):
                event, kernels, back_to_back, issue, ops = measure(fn)
                print(f"S={seqlen:5d} B={batch:2d} {name:10s} event-timed {event:7.1f} us  "
                      f"kernels {kernels:7.1f} us  back-to-back {back_to_back:7.1f} us  "
                      f"host issue {issue:6.1f} us")
                for us, count, op in ops[:4]:
                    print(f"      {us:8.1f} us  x{count}  {op[:90]}")


if __name__ == "__main__":
    main()
