"""CPU benchmark: tileattn's CPU backend next to PyTorch's CPU scaled_dot_product_attention (its
fused flash kernel), measured in the same run.

GFLOP/s by FlashAttention's count: forward 4 B H S^2 D (halved when causal), backward 2.5x that.
The backward time is (forward + backward) - forward, for both libraries; each is the median of
--repeats rounds that time every impl in turn.  Writes a CSV under
bench/results/ with the machine, date and commit, and prints a table.

    python3 bench/cpu.py                       # the full sweep (B=1, H=8, D 64/128, S 1k-4k)
    python3 bench/cpu.py --seqlens 1024 --headdims 64 --dtypes bfloat16
    python3 bench/cpu.py --impls tileattn tileattn-sgemm torch   # AMX / AVX-512 and sgemm
    python3 bench/cpu.py --impls tileattn tileattn-float32 torch --dtypes bfloat16
`tileattn-sgemm` is tileattn with TILEATTN_CPU_AMX=off and TILEATTN_CPU_SIMD=off: its products on
OpenBLAS's float32 sgemm, as on CPUs with neither AMX-BF16 nor AVX2 (on those it is the same as
`tileattn`).  `tileattn-float32` has TILEATTN_CPU_AMX=off alone: bf16 calls on the float32 SIMD
products instead of AMX's tiles or AVX512-BF16's dot products (float32 calls are unchanged).
"""

import argparse
import contextlib
import csv
import datetime
import os
import platform
import statistics
import subprocess
import time

import torch
import torch.nn.functional as F

import tileattn


IMPLS = ("tileattn", "tileattn-sgemm", "tileattn-float32", "torch")


# The switches each variant of tileattn sets to "off" while it is measured.
SWITCHES_OFF = {"tileattn-sgemm": ("TILEATTN_CPU_AMX", "TILEATTN_CPU_SIMD"), "tileattn-float32": ("TILEATTN_CPU_AMX",)}


@contextlib.contextmanager
def products_of(impl):
    """SWITCHES_OFF[impl] off while impl is measured; the caller's settings otherwise."""
    saved = {name: os.environ.get(name) for name in SWITCHES_OFF["tileattn-sgemm"]}
    for name in SWITCHES_OFF.get(impl, ()):
        os.environ[name] = "off"
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def calls_of(impl, q, k, v, dout, causal):
    """impl's (forward only, forward + backward) calls."""
    if impl.startswith("tileattn"):
        def forward():
            return tileattn.flash_attn_func(q, k, v, causal=causal)
    else:
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # SDPA takes (B, H, S, D)

        def forward():
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)

    def forward_only():
        with torch.no_grad():
            forward()

    def forward_backward():
        q.grad = k.grad = v.grad = None
        forward().backward(dout)

    return forward_only, forward_backward


def interleaved_medians(calls, repeats, context=lambda name: contextlib.nullcontext()):
    """{name: median seconds of calls[name]()} over `repeats` rounds, each round timing every call
    once in turn, after one warm-up call each (thread pools, first touch of buffers).  Interleaved
    rather than one call's repeats after another's, so that a slow spell of a shared machine (runs
    on the 2-core VMs this was tuned on differ by 10-30%) lands on every call alike instead of on
    whichever ran through it.  context(name) wraps each of name's calls."""
    def seconds(name):
        with context(name):
            start = time.perf_counter()
            calls[name]()
            return time.perf_counter() - start

    for name in calls:
        seconds(name)
    times = {name: [] for name in calls}
    for _ in range(repeats):
        for name in calls:
            times[name].append(seconds(name))
    return {name: statistics.median(t) for name, t in times.items()}


def measure(impls, q, k, v, dout, causal, repeats):
    """{impl: (forward seconds, backward seconds)}, each impl's forward and forward + backward
    timed in the same interleaved rounds."""
    calls = {}
    for impl in impls:
        calls[(impl, "fwd")], calls[(impl, "both")] = calls_of(impl, q, k, v, dout, causal)
    t = interleaved_medians(calls, repeats, context=lambda name: products_of(name[0]))
    return {impl: (t[(impl, "fwd")], max(t[(impl, "both")] - t[(impl, "fwd")], 1e-9)) for impl in impls}


def git_commit():
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--headdims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"],
                        choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5, help="rounds, each timing every impl once")
    parser.add_argument("--impls", nargs="+", choices=IMPLS, default=["tileattn", "torch"])
    parser.add_argument("--out", default=None, help="CSV path (default bench/results/cpu-<date>.csv)")
    args = parser.parse_args()

    threads = os.cpu_count()
    torch.set_num_threads(threads)
    date = datetime.date.today().isoformat()
    commit = git_commit()
    machine = f"{cpu_name()} x{threads}"
    out_path = args.out or os.path.join(os.path.dirname(__file__), "results", f"cpu-{date}.csv")
    rows = []
    print(f"# {machine}, torch {torch.__version__}, commit {commit}, {date}")
    width = 15 * len(args.impls) - 1
    names = " ".join(f"{impl:>14}" for impl in args.impls)
    print(f"{'dtype':>9} {'D':>4} {'S':>5} {'causal':>6} | {'fwd GFLOP/s':>{width}} | {'bwd GFLOP/s':>{width}}")
    print(f"{'':>9} {'':>4} {'':>5} {'':>6} | {names} | {names}")
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for d in args.headdims:
            for s in args.seqlens:
                for causal in (False, True):
                    torch.manual_seed(0)
                    shape = (args.batch, s, args.heads, d)
                    q, k, v = (torch.randn(shape, dtype=dtype, requires_grad=True) for _ in range(3))
                    dout = torch.randn(shape, dtype=dtype)
                    flops = 4 * args.batch * args.heads * s * s * d / (2 if causal else 1)
                    seconds = measure(args.impls, q, k, v, dout, causal, args.repeats)
                    result = {}
                    for impl in args.impls:
                        t_fwd, t_bwd = seconds[impl]
                        result[impl] = (flops / t_fwd / 1e9, 2.5 * flops / t_bwd / 1e9)
                        rows.append(dict(machine=machine, date=date, commit=commit,
                                         torch=torch.__version__, threads=threads, impl=impl,
                                         dtype=dtype_name, batch=args.batch, heads=args.heads,
                                         headdim=d, seqlen=s, causal=causal,
                                         fwd_ms=t_fwd * 1e3, bwd_ms=t_bwd * 1e3,
                                         fwd_gflops=result[impl][0], bwd_gflops=result[impl][1]))
                    fwd = " ".join(f"{result[impl][0]:>14.1f}" for impl in args.impls)
                    bwd = " ".join(f"{result[impl][1]:>14.1f}" for impl in args.impls)
                    print(f"{dtype_name:>9} {d:>4} {s:>5} {str(causal):>6} | {fwd} | {bwd}", flush=True)
    write_rows(rows, out_path)


def write_rows(rows, out_path):
    """The rows as a CSV (columns from the first row); the folder is created if needed."""
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with open(out_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"# wrote {out_path}")


if __name__ == "__main__":
    main()
