#!/usr/bin/env python3
"""What a back-to-back call spends outside its kernels: each backend's calls queued without
waiting, recorded by the PyTorch profiler (CUPTI's kernel start and end stamps on the GPU), and
per call the kernels it launched, their grid, their summed duration and the period from one call's
first kernel to the next call's.  period - kernels is the time the GPU ran none of the call's
kernels: launch gaps, and a kernel's ramp that no other kernel overlaps.

Session 28's trace of the sm90 forward put causal d64 512's busiest CTA at ~267k cycles (~137 us
at the 1.95 GHz that shape runs at) against ~153 us a call back to back; this says whether the rest
is between the kernels or inside them.

    python3 bench/gpu/kernel_timeline.py [--fwd 64:512:causal 128:512] [--decode 32:2048 8:2048]
        [--backends tileattn sdpa-cudnn] [--calls 20]
"""
import argparse
import json
import statistics
import tempfile

import torch

import timing  # noqa: F401  bench/gpu/timing.py: puts the repository root on sys.path
from bench import backends, shapes
from bench.measure import make_inputs

# decode.py's layout for each benchmark backend name
DECODE_LAYOUTS = {"tileattn": "contiguous", "sdpa-cudnn": "cudnn", "sdpa-flash": "flash"}


def kernels_of(run):
    """[(name, start_us, duration_us, grid)] of every kernel run() launched."""
    from torch.profiler import ProfilerActivity, profile
    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.load(open(f.name))["traceEvents"]
    return sorted((e["name"], float(e["ts"]), float(e["dur"]), tuple(e.get("args", {}).get("grid", ())))
                  for e in events if e.get("cat") == "kernel" and e.get("ph") == "X")


def per_call(kernels, calls):
    """The kernels (name, start_us, duration_us, grid) of `calls` calls in launch order, grouped a
    call: (groups, periods from one call's first kernel to the next's, each call's summed kernel
    time, each call's first start to last end); None when they do not split evenly."""
    kernels = sorted(kernels, key=lambda k: k[1])
    if not kernels or len(kernels) % calls:
        return None
    n = len(kernels) // calls
    groups = [kernels[i * n:(i + 1) * n] for i in range(calls)]
    starts = [g[0][1] for g in groups]
    periods = [b - a for a, b in zip(starts, starts[1:])]
    busy = [sum(k[2] for k in g) for g in groups]
    spans = [max(k[1] + k[2] for k in g) - g[0][1] for g in groups]
    return groups, periods, busy, spans


def report(label, run, calls):
    """run() makes `calls` calls back to back."""
    kernels = kernels_of(run)
    split = per_call(kernels, calls)
    if split is None:
        print(f"{label}: {len(kernels)} kernels for {calls} calls; not a whole number a call")
        return
    groups, periods, busy, spans = split
    period = statistics.median(periods)
    print(f"{label}: period {period:.1f} us a call, kernels {statistics.median(busy):.1f} us "
          f"(first start to last end {statistics.median(spans):.1f}), outside them {period - statistics.median(busy):.1f}")
    for i, (name, _, _, grid) in enumerate(groups[0]):
        durations = statistics.median(g[i][2] for g in groups)
        print(f"    {durations:8.1f} us  grid {grid}  {name[:110]}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fwd", nargs="*", default=["64:512:causal", "128:512", "128:512:causal", "64:2048:causal"],
                   help="HEADDIM:SEQLEN[:causal] on the FA sweep's shapes (16k tokens, hidden 2048)")
    p.add_argument("--decode", nargs="*", default=["8:2048", "32:2048"],
                   help="BATCH:CACHE_LEN on decode.py's shape (32 query heads over 8 KV heads, d128)")
    p.add_argument("--backends", nargs="+", default=["tileattn", "sdpa-cudnn"])
    p.add_argument("--calls", type=int, default=20)
    args = p.parse_args()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; CUPTI kernel stamps, {args.calls} calls "
          "queued back to back; medians over the calls")
    for spec in args.fwd:
        case = shapes.fa_spec(spec)
        q, k, v, _ = make_inputs(case, "cuda", torch.bfloat16, requires_grad=False)
        with torch.no_grad():
            for name in args.backends:
                fn = backends.get(name).make(q, k, v, case.causal)
                report(f"fwd d{case.headdim} {case.seqlen}{' causal' if case.causal else ''} {name}",
                       lambda: [fn() for _ in range(args.calls)], args.calls)
        del q, k, v
    # Decode as decode.py times it: the calls captured in a CUDA graph over copies of the cache that
    # do not fit the L2 together, one replay profiled.
    from decode import DIM, HEADS, cache_copies, calls, capture, make_caches
    for spec in args.decode:
        batch, length = (int(x) for x in spec.split(":"))
        caches = make_caches(batch, length, cache_copies(batch, length))
        q = torch.randn(batch, 1, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
        seqlens = torch.full((batch,), length, device="cuda", dtype=torch.int32)
        for name in args.backends:
            fns = calls(DECODE_LAYOUTS[name], q, caches, seqlens)
            graph, count = capture(fns * max(1, args.calls // len(fns)))
            report(f"decode {batch} x {length} {name}", graph.replay, count)
            del graph, fns
        del caches


if __name__ == "__main__":
    main()
