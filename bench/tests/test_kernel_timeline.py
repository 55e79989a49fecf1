"""bench/gpu/kernel_timeline.py's grouping of a profile's kernels into calls, on made-up stamps:
two kernels a call, listed out of order, with known starts and durations."""
from gpu_scripts import load_gpu_script


def test_kernels_group_into_calls_with_periods_busy_time_and_spans():
    m = load_gpu_script("kernel_timeline")
    # Call i: a split kernel at 100 i (40 us) and a combine at 100 i + 45 (5 us); the third call's
    # combine overlaps its split kernel (a programmatic launch) and ends last at 255.
    kernels = [("split", 0.0, 40.0, (64, 4, 1)), ("combine", 45.0, 5.0, (256, 1, 1)),
               ("split", 100.0, 40.0, (64, 4, 1)), ("combine", 145.0, 5.0, (256, 1, 1)),
               ("split", 200.0, 40.0, (64, 4, 1)), ("combine", 230.0, 25.0, (256, 1, 1))]
    groups, periods, busy, spans = m.per_call(list(reversed(kernels)), 3)
    assert [[k[0] for k in g] for g in groups] == [["split", "combine"]] * 3
    assert periods == [100.0, 100.0]
    assert busy == [45.0, 45.0, 65.0]
    assert spans == [50.0, 50.0, 55.0]
    assert m.per_call(kernels[:5], 3) is None
    assert m.per_call([], 3) is None
