"""The bench package's timing and provenance (bench/timing.py, bench/environment.py) for the
scripts in bench/gpu/, which run by path and so import this module as `timing`."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from bench import environment  # noqa: E402
from bench import timing as _timing  # noqa: E402

git_commit = environment.commit
round_orders = _timing.round_orders


def median_ms(fn, runs, warmup=5, queue=1, before=None):
    """Median CUDA-event milliseconds of fn() over `runs` samples, after `warmup` untimed calls; a
    sample is `queue` calls back to back, `before` runs ahead of each outside its events
    (bench/timing.py)."""
    return _timing.median_ms(fn, "cuda", runs=runs, warmup=warmup, queue=queue, before=before)
