"""bench/gpu/fwd_trace.py's report on a made-up trace: every CTA's tiles start 1000 cycles apart
with known steps; a step a consumer skipped (stamps left at zero) reads as '-', not as a span."""
import numpy as np

from gpu_scripts import load_gpu_script


def made_up_trace(m):
    t = np.zeros((m.CTAS, m.ROLES, m.ROUNDS, m.EVENTS), dtype=np.int64)
    for r in range(6):
        start = 1000 + 1000 * r
        t[:, 0, r, 1] = start + 900  # producer: first K of round r issued
        for c in (1, 2):
            t[:, c, r, :11] = start + 10 * c + 50 * np.arange(11)  # consumer steps 50 cycles apart
            t[:, c, r, 38], t[:, c, r, 39], t[:, c, r, 40] = 4, 0, 4
        t[:, 2, r, 2] = 0                      # consumer 1 never put Q in registers
    return t


def test_report_spans_and_skipped_steps(capsys):
    m = load_gpu_script("fwd_trace")
    m.report(made_up_trace(m), consumers=2, rounds=6)
    out = capsys.readouterr().out
    assert "all tiles:" in out and "4 key blocks, period 1000 cycles" in out
    lines = [line for line in out.splitlines() if "consumer 0 (" in line or "consumer 1 (" in line]
    assert "sched+Q wait=50 Q to registers=50 first K wait=50" in lines[0] and "store=50" in lines[0]
    assert "Q to registers=- first K wait=- first turn=50" in lines[1]
    # Round r + 1's first K (start + 1000 + 900) against consumer 0's loop end in round r (start + 360).
    assert "next tile's first K issued 1540 after" in out


def test_cta_spans_take_each_ctas_first_and_last_stamp(capsys):
    """Every CTA runs from consumer 0's first step of round 0 (1010) to the producer's stamp of
    round 5 (6900), except CTA 0, whose last step of round 5 runs 1000 cycles late; the value
    slots 38-40 (block counts, not times) do not count."""
    m = load_gpu_script("fwd_trace")
    t = made_up_trace(m)
    t[0, 1, 5, 10] += 1000
    t[:, 1, 5, 38] = 10 ** 9
    m.cta_spans(t)
    out = capsys.readouterr().out
    late = 6000 + 10 + 500 + 1000 - 1010
    mean = ((m.CTAS - 1) * 5890 + late) / m.CTAS
    assert f"min 5890, median 5890, max {late}; mean / max {mean / late:.3f}" in out
