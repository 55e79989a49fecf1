#!/usr/bin/env python3
"""Inside a queued timing sample (bench/timing.py, --queue N): a CUDA event after every call, so
each call's GPU interval shows, and when each call returned to Python.  The first interval runs from
the sample's start event to the first call's end, so it holds whatever the GPU waited for that
call's launch; with the lead-in call bench/timing.py issues before the start event (--lead-in 1)
it should be as long as the rest.

Session 34 found the first interval of a 10-call sample 30-110 us longer than the rest on the
H200's host, 3-11% of the sample at 512 tokens, for cuDNN as for tileattn
(bench/results/h200-fwd-512-timing-methods-2026-12-02.txt).

    python3 bench/gpu/queue_intervals.py [--fwd 128:512:causal 128:512 64:512:causal]
        [--backends tileattn sdpa-cudnn] [--queue 10] [--samples 30] [--passes 2] [--lead-in 0 1]
"""
import argparse
import statistics
import time

import torch

import timing  # noqa: F401  bench/gpu/timing.py: puts the repository root on sys.path
from bench import backends, shapes
from bench.measure import make_inputs


def intervals(fn, queue, samples, lead_in):
    """Per call of a sample, the median GPU interval (us) from the previous event and the median
    time (us, from the sample's start) at which the call returned to Python."""
    gpu, host = [], []
    for _ in range(samples):
        events = [torch.cuda.Event(enable_timing=True) for _ in range(queue + 1)]
        for _ in range(lead_in):
            fn()
        returned = []
        t0 = time.perf_counter()
        events[0].record()
        for i in range(queue):
            fn()
            returned.append((time.perf_counter() - t0) * 1e6)
            events[i + 1].record()
        events[-1].synchronize()
        gpu.append([events[i].elapsed_time(events[i + 1]) * 1e3 for i in range(queue)])
        host.append(returned)
    median = lambda rows, i: statistics.median(row[i] for row in rows)  # noqa: E731
    return [median(gpu, i) for i in range(queue)], [median(host, i) for i in range(queue)]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fwd", nargs="*", default=["128:512:causal", "128:512", "64:512:causal"],
                   help="HEADDIM:SEQLEN[:causal] on the FA sweep's shapes (16k tokens, hidden 2048)")
    p.add_argument("--backends", nargs="+", default=["tileattn", "sdpa-cudnn"])
    p.add_argument("--queue", type=int, default=10)
    p.add_argument("--samples", type=int, default=30)
    p.add_argument("--passes", type=int, default=2, help="passes over the backends, alternating")
    p.add_argument("--lead-in", type=int, nargs="+", default=[0, 1],
                   help="untimed calls issued before each sample's start event")
    args = p.parse_args()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; {args.queue} queued calls a "
          f"sample, an event after each; medians of {args.samples} samples; us")
    for spec in args.fwd:
        case = shapes.fa_spec(spec)
        q, k, v, _ = make_inputs(case, "cuda", torch.bfloat16, requires_grad=False)
        with torch.no_grad():
            for _ in range(args.passes):
                for name in args.backends:
                    fn = backends.get(name).make(q, k, v, case.causal)
                    for _ in range(10):
                        fn()
                    torch.cuda.synchronize()
                    for lead_in in args.lead_in:
                        gpu, host = intervals(fn, args.queue, args.samples, lead_in)
                        label = f"d{case.headdim} {case.seqlen}{' causal' if case.causal else ''} {name} lead-in {lead_in}"
                        print(f"{label:40s} gpu " + " ".join(f"{x:6.1f}" for x in gpu) + f" | sum {sum(gpu):7.1f}")
                        print(f"{'':40s} ret " + " ".join(f"{x:6.1f}" for x in host), flush=True)
        del q, k, v


if __name__ == "__main__":
    main()
