"""How every number in bench/ is timed: the median of `runs` calls, each between two CUDA events
(perf_counter on the CPU), after `warmup` untimed calls (the brief's 10 and >= 20)."""
import statistics
import time

import torch

WARMUP = 10
RUNS = 20


def synchronize(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def median_ms(fn, device, runs=RUNS, warmup=WARMUP):
    """Median milliseconds of fn() on `device`.  Each timed call is bracketed by its own events
    and waited for, so a call's time includes the host's launch cost when the GPU is faster than
    the host can feed it (short sequences), as a user's eager call would."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    on_cuda = torch.device(device).type == "cuda"
    for _ in range(runs):
        if on_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
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
