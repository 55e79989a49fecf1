"""bench/gpu/clocks_and_l2.py's reading of nvidia-smi's samples: the lines it prints with
`--format=csv,noheader,nounits` parse into (time, MHz, watts), lines that are not samples are
skipped, and each back-to-back window gets the medians of the samples taken inside it only."""
import datetime
import math

from gpu_scripts import load_gpu_script


def test_samples_parse_and_windows_take_their_own_medians():
    m = load_gpu_script("clocks_and_l2")
    lines = [
        "2026/12/02 03:50:01.000, 1980, 612.40\n",
        "timestamp, clocks.current.sm [MHz], power.draw [W]\n",  # a header: skipped
        "2026/12/02 03:50:01.020, 1755, 690.10\n",
        "2026/12/02 03:50:01.040, [N/A], 700.00\n",  # no clock reading: skipped
        "2026/12/02 03:50:01.060, 1740, 695.30\n",
        "2026/12/02 03:50:02.000, 1980, 120.00\n",
    ]
    samples = m.parse_smi_samples(lines)
    assert [mhz for _, mhz, _ in samples] == [1980, 1755, 1740, 1980]
    t0 = datetime.datetime(2026, 12, 2, 3, 50, 1, 10000).timestamp()
    t1 = datetime.datetime(2026, 12, 2, 3, 50, 1, 70000).timestamp()
    mhz, watts, n = m.window_stats(samples, t0, t1)
    assert (mhz, n) == (1747.5, 2)
    assert abs(watts - 692.7) < 1e-9
    mhz, watts, n = m.window_stats(samples, t1 + 0.5, t1 + 0.6)
    assert n == 0 and math.isnan(mhz) and math.isnan(watts)
