#!/usr/bin/env python3
"""Where an eager call's time goes, tileattn next to SDPA's cuDNN and flash backends (as
bench/backends.py calls them), bf16, the sweep's "fa" shapes (16k tokens, hidden 2048); the forward
without autograd, or forward + backward as the sweep times it (`--direction fwdbwd`):

  event-timed   one call between two CUDA events after a synchronize, as `python3 -m bench sweep`
                times it: the host's work before the launch plus the kernels
  kernels       the GPU time of the call's kernels (torch profiler), then the largest of them
  back-to-back  wall time per call over 50 calls issued without waiting
  host issue    wall time per call to issue 200 calls (the GPU queue absorbs them)

With --timeline, one more call of each is profiled with the host's ops and printed in time order,
each host op and kernel with its start and end in microseconds from the call's first event: the
gaps between kernels show which host work the GPU waits for.

    python3 bench/gpu/host_vs_kernel.py [--headdims 128] [--seqlens 512 2048 8192] [--causal no]
                                        [--direction fwd|fwdbwd] [--timeline]
"""
import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

import timing  # noqa: F401  bench/gpu/timing.py: puts the repository root on sys.path
from bench import backends, shapes
from bench.measure import make_inputs


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


def timeline(fn, depth=2):
    """(start us, end us, kind, name) of one profiled call, sorted by start, from the call's first
    event; kind is 'gpu' or 'cpu' followed by the host op's nesting depth.  Host ops nested deeper
    than `depth` are left out, except kernel launches, which pair with the kernels."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.events():
        gpu = e.device_type != torch.autograd.DeviceType.CPU
        level, parent = 0, e.cpu_parent
        while parent is not None:
            level, parent = level + 1, parent.cpu_parent
        if not gpu and level > depth and "Launch" not in e.name:
            continue
        rows.append((e.time_range.start, e.time_range.end, "gpu" if gpu else f"cpu{level}", e.name))
    rows.sort()
    t0 = rows[0][0]
    return [(start - t0, end - t0, kind, name) for start, end, kind, name in rows]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--headdims", type=int, nargs="+", default=[128])
    p.add_argument("--seqlens", type=int, nargs="+", default=[512, 2048, 8192])
    p.add_argument("--causal", choices=("no", "yes", "both"), default="no")
    p.add_argument("--direction", choices=("fwd", "fwdbwd"), default="fwd")
    p.add_argument("--timeline", action="store_true", help="print one call's host ops and kernels in time order")
    args = p.parse_args()
    causal_values = {"no": [False], "yes": [True], "both": [False, True]}[args.causal]
    backward = args.direction == "fwdbwd"
    with torch.set_grad_enabled(backward):
        for head_dim in args.headdims:
            for seqlen in args.seqlens:
                for causal in causal_values:
                    case = shapes.fa_papers(seqlen, head_dim, causal)
                    q, k, v, dout = make_inputs(case, "cuda", torch.bfloat16, requires_grad=backward)
                    for name in ("tileattn", "sdpa-cudnn", "sdpa-flash"):
                        call = backends.get(name).make(q, k, v, causal)
                        fn = call
                        if backward:
                            def fn(call=call):
                                q.grad = k.grad = v.grad = None
                                call().backward(dout)
                        event, kernels, back_to_back, issue, ops = measure(fn)
                        print(f"d{head_dim} S={seqlen:5d} B={case.batch:2d} causal={int(causal)} {name:10s} "
                              f"{args.direction} event-timed {event:7.1f} us  kernels {kernels:7.1f} us  "
                              f"back-to-back {back_to_back:7.1f} us  host issue {issue:6.1f} us")
                        for us, count, op in ops[:3 if not args.timeline else 8]:
                            print(f"      {us:8.1f} us  x{count}  {op[:90]}")
                        if args.timeline:
                            for start, end, kind, op in timeline(fn):
                                print(f"      {kind:4s} {start:9.1f} {end:9.1f}  {op[:90]}")

if __name__ == "__main__":
    main()
