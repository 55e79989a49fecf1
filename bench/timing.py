"""How every number in bench/ is timed: the median of `runs` samples, each between two CUDA events
(perf_counter on the CPU), after `warmup` untimed calls (the brief's 10 and >= 20).  A sample is one
call by default; with `queue` > 1 it is that many calls issued back to back, divided by `queue`."""
import statistics
import time

import torch

WARMUP = 10
RUNS = 20


def synchronize(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def median_ms(fn, device, runs=RUNS, warmup=WARMUP, queue=1, before=None):
    """Median milliseconds of fn() on `device`.  With queue=1 each timed call is bracketed by its
    own events and waited for, so a call's time includes the host's launch cost when the GPU is
    faster than the host can feed it (short sequences), as a user's eager call would.  With
    queue=N, N calls go between the two events and the sample is their mean: once the GPU has work
    queued the host's cost hides behind it, so the figure is the kernels' throughput, which is what
    an A/B of a kernel change needs (single calls at 512-1k tokens spread by up to 25%).  On CUDA a
    queued sample starts with one untimed lead-in call, issued before the start event: without it the
    GPU idles from the start event until the sample's first launch, the first call after a
    synchronize, which on the H200's host made the first interval 30-110 us longer than the rest, a
    different amount each sample, for every backend (3-11% of a 10-call sample at 512 tokens; perf
    log, session 34).
    `before`, if given, runs ahead of each timed sample, outside its events (an L2 flush), and the
    sample then has no lead-in, which would undo it."""
    if queue < 1:
        raise ValueError(f"queue must be at least 1, got {queue}")
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    on_cuda = torch.device(device).type == "cuda"
    for _ in range(runs):
        if before is not None:
            before()
        if on_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if queue > 1 and before is None:
                fn()
            start.record()
            for _ in range(queue):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / queue)
        else:
            t0 = time.perf_counter()
            for _ in range(queue):
                fn()
            times.append((time.perf_counter() - t0) * 1e3 / queue)
    return statistics.median(times)


def single_call_ms(fn, device):
    """Wall time of one call after one untimed call (which compiles Triton kernels, picks cuDNN
    plans): the estimate behind --max-case-s."""
    fn()
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    return (time.perf_counter() - t0) * 1e3


def round_orders(n):
    """The backend orders of a balanced design (Williams, 1949): over its rows every backend runs
    right after every other one equally often.  The H200 runs at its 700 W limit back to back (perf
    log, session 28), and a backend timed right after a heavy one inherits the clocks that one left:
    with the rounds rotated (a, b, c, d; b, c, d, a; ...) cuDNN always followed SDPA flash, the
    lightest, and tileattn followed cuDNN, and at 512 tokens a backend's rounds read 5-15% slower
    right after the other heavy backend than after a light one (sweeps v33 and v33b, session 47).
    Even n: rows i + (0, 1, n-1, 2, n-2, ...) mod n, each ordered pair adjacent once in n rows; odd
    n: each such row followed by its reverse, each pair adjacent twice in 2n rows."""
    steps, low, high = [0], 1, n - 1
    while len(steps) < n:
        steps.append(low)
        low += 1
        if len(steps) < n:
            steps.append(high)
            high -= 1
    rows = [[(i + c) % n for c in steps] for i in range(n)]
    if n % 2 == 1 and n > 1:
        rows = [row for pair in zip(rows, (r[::-1] for r in rows)) for row in pair]
    return rows
