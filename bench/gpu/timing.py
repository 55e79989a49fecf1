"""Shared by the GPU benchmarks: the median time of a call by CUDA events, and the commit to
record beside each result."""
import os
import statistics
import subprocess

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def median_ms(fn, runs, warmup=5):
    """Median of `runs` timings of fn(), each between two CUDA events and synchronized (as
    shared/anchors/measure_sdpa.py times SDPA), after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def git_commit():
    """The checkout's commit; TILEATTN_COMMIT where the copy has no .git (the GPU machine)."""
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("TILEATTN_COMMIT", "unknown")
