"""bench/gpu/fwd_trace.py's report on a made-up trace: every CTA's tiles start 1000 cycles apart
with known steps; a step a consumer skipped (stamps left at zero) reads as '-', not as a span."""
import importlib.util
import pathlib

import numpy as np

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "gpu" / "fwd_trace.py"


def load():
    spec = importlib.util.spec_from_file_location("fwd_trace", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    m = load()
    m.report(made_up_trace(m), consumers=2, rounds=6)
    out = capsys.readouterr().out
    assert "all tiles:" in out and "4 key blocks, period 1000 cycles" in out
    lines = [line for line in out.splitlines() if "consumer 0 (" in line or "consumer 1 (" in line]
    assert "sched+Q wait=50 Q to registers=50 first K wait=50" in lines[0] and "store=50" in lines[0]
    assert "Q to registers=- first K wait=- first turn=50" in lines[1]
    # Round r + 1's first K (start + 1000 + 900) against consumer 0's loop end in round r (start + 360).
    assert "next tile's first K issued 1540 after" in out
