#!/usr/bin/env python3
"""Why a call's speed back to back can differ from its cycles: the SM clock and power while a
backend's calls run back to back, and the same call timed alone with the L2 warm or flushed.

Under Nsight Compute (clocks locked, caches flushed before each call) tileattn's d128 512-token
forward takes the same cycles as cuDNN's (216k against 213k, bench/results/ncu-h200-2026-12-02/),
while back to back cuDNN is 7% faster (sweeps v21, v22).  Two things differ between the two ways
of timing, and this script measures both, per backend, bf16, the sweep's "fa" shapes:

  back-to-back  microseconds a call over --seconds of calls queued without waiting (the sweep's
                --queue timing), with the SM clock nvidia-smi samples meanwhile and the board's
                energy a call: NVML's total-energy counter read before and after the window
                (nvidia-smi's power.draw is a one-second average on Ampere and later, so its
                samples in a one-second window mix in whatever ran the second before)
  warm          one call between two events, the previous call's data left in the L2
  flushed       the same after a 256 MB write that evicts the L2 (50 MB on the H200)

If the clocks differ between backends back to back, the gap is power; if "flushed" brings the
two level while "warm" does not, it is the L2 state one call leaves the next.

    python3 bench/gpu/clocks_and_l2.py [--headdims 128] [--seqlens 512 8192] [--causal no]
"""
import argparse
import ctypes
import datetime
import statistics
import subprocess
import tempfile
import time

import timing  # bench/gpu/timing.py: puts the repository root on sys.path
from bench import backends, shapes

SMI_FIELDS = "timestamp,clocks.sm,power.draw"
SMI_TIME_FORMAT = "%Y/%m/%d %H:%M:%S.%f"


class EnergyCounter:
    """NVML's total energy of GPU 0 since the driver loaded, in millijoules (Volta and later),
    through the driver's own libnvidia-ml (no Python package needed)."""

    def __init__(self):
        self._nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if self._nvml.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit_v2 failed")
        self._handle = ctypes.c_void_p()
        if self._nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self._handle)) != 0:
            raise RuntimeError("nvmlDeviceGetHandleByIndex_v2(0) failed")
        self._value = ctypes.c_ulonglong()

    def millijoules(self):
        if self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle, ctypes.byref(self._value)) != 0:
            raise RuntimeError("nvmlDeviceGetTotalEnergyConsumption failed")
        return self._value.value


def parse_smi_samples(lines):
    """(seconds since the epoch, SM MHz, watts) of each `nvidia-smi --query-gpu=SMI_FIELDS
    --format=csv,noheader,nounits` line; lines that do not parse (a header, "[N/A]") are skipped."""
    samples = []
    for line in lines:
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != 3:
            continue
        try:
            stamp = datetime.datetime.strptime(parts[0], SMI_TIME_FORMAT).timestamp()
            samples.append((stamp, float(parts[1]), float(parts[2])))
        except ValueError:
            continue
    return samples


def window_stats(samples, start, end):
    """Median SM MHz and watts of the samples taken in [start, end] (seconds since the epoch), and
    how many there were; (nan, nan, 0) when none."""
    inside = [(mhz, watts) for stamp, mhz, watts in samples if start <= stamp <= end]
    if not inside:
        return float("nan"), float("nan"), 0
    return statistics.median(m for m, _ in inside), statistics.median(w for _, w in inside), len(inside)


def main():
    import torch

    from bench.measure import make_inputs

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--headdims", type=int, nargs="+", default=[128])
    p.add_argument("--seqlens", type=int, nargs="+", default=[512, 8192])
    p.add_argument("--causal", choices=("no", "yes", "both"), default="no")
    p.add_argument("--backends", nargs="+", default=["tileattn", "sdpa-cudnn"])
    p.add_argument("--seconds", type=float, default=1.5,
                   help="how long each backend's calls run back to back: nvidia-smi samples every 20 ms, "
                        "so a 512-token call (~0.14 ms) needs ~10,000 calls for 75 samples")
    p.add_argument("--runs", type=int, default=30, help="single calls timed per backend and L2 state")
    args = p.parse_args()

    causal_values = {"no": [False], "yes": [True], "both": [False, True]}[args.causal]
    scratch = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    energy = EnergyCounter()
    with tempfile.TemporaryFile("w+") as log:
        sampler = subprocess.Popen(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits",
                                    "-lms", "20"], stdout=log, stderr=subprocess.DEVNULL, text=True)
        rows = []
        try:
            time.sleep(0.5)
            for head_dim in args.headdims:
                for seqlen in args.seqlens:
                    for causal in causal_values:
                        case = shapes.fa_papers(seqlen, head_dim, causal)
                        q, k, v, _ = make_inputs(case, "cuda", torch.bfloat16, requires_grad=False)
                        with torch.no_grad():
                            for name in args.backends:
                                fn = backends.get(name).make(q, k, v, causal)
                                estimate = timing.median_ms(fn, runs=3, warmup=3)
                                calls = max(100, int(args.seconds * 1e3 / estimate))
                                for _ in range(10):
                                    fn()
                                torch.cuda.synchronize()
                                begin, joules_before = time.time(), energy.millijoules() / 1e3
                                queued = timing.median_ms(fn, runs=1, warmup=0, queue=calls) * 1e3
                                end, joules = time.time(), energy.millijoules() / 1e3 - joules_before
                                board_watts = joules / (end - begin)
                                warm = timing.median_ms(fn, runs=args.runs, warmup=0) * 1e3
                                flushed = timing.median_ms(fn, runs=args.runs, warmup=0, before=scratch.zero_) * 1e3
                                tflops = shapes.rate(case, "fwd", queued / 1e3)[0]
                                rows.append((head_dim, seqlen, causal, name, queued, tflops, begin, end, board_watts,
                                             joules / calls * 1e3, warm, flushed))
            time.sleep(0.2)
        finally:
            sampler.terminate()
            sampler.wait()
        log.seek(0)
        samples = parse_smi_samples(log.readlines())

    print(f"{len(samples)} nvidia-smi samples; the clock is their median over each back-to-back window, "
          "watts and mJ a call from NVML's energy counter over the same window (smi W: power.draw's median)")
    print("   d seqlen causal backend       back-to-back us  TFLOP/s   SM MHz  watts  mJ/call  smi W (n)   warm us  flushed us")
    for head_dim, seqlen, causal, name, queued, tflops, begin, end, watts, mj, warm, flushed in rows:
        mhz, smi_watts, n = window_stats(samples, begin, end)
        print(f"{head_dim:4d} {seqlen:6d} {int(causal):6d} {name:12s} {queued:15.1f} {tflops:8.1f} {mhz:8.0f} "
              f"{watts:6.0f} {mj:8.1f} {smi_watts:6.0f} ({n:3d}) {warm:9.1f} {flushed:11.1f}")


if __name__ == "__main__":
    main()
