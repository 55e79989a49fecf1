"""`python3 -m bench profile`: Nsight Compute on one tileattn forward (default seqlen 4096, d128,
bf16, batch 2 x 16 heads): tensor-core instructions, tensor-path operations, DRAM bytes read and
written, kernel time.  The DRAM bytes are set against what FlashAttention must move (Q, K, V, O)
and what a kernel that materialized S = Q K^T would move (S written and read once, bf16).
Writes a markdown summary and a CSV, never the .ncu-rep; prints the command that reproduces it.

The profiled process is this module again with --target (it runs the forward a few times); ncu
replays the one launch it picks until every counter is read."""
import argparse
import csv
import io
import os
import shlex
import subprocess
import sys

import torch

from bench import environment, shapes
from bench.measure import DTYPES, make_inputs

# Tried in order; the first one this ncu knows is used (names differ between ncu versions).
TENSOR_INSTRUCTIONS = ("sm__inst_executed_pipe_tensor_op_hmma.sum", "smsp__inst_executed_pipe_tensor_op_hmma.sum",
                       "sm__inst_executed_pipe_tensor.sum")
TENSOR_OPS = {"bf16": ("sm__ops_path_tensor_src_bf16_dst_fp32.sum",),
              "fp16": ("sm__ops_path_tensor_src_fp16_dst_fp32.sum",)}
ALWAYS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum", "gpu__time_duration.sum",
          "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
          "launch__registers_per_thread", "launch__grid_size")
# FLOPs per warp-level tensor instruction, to name the instruction the counts imply: an sm80-family
# mma.sync m16n8k16 is 16 x 8 x 16 multiply-adds; an sm90-family wgmma 64 x N x 16 is issued by a
# warpgroup's 4 warps, each counted once, so a warp's share is 16 x N x 16 (65536 FLOPs at N = 128).
FLOPS_PER_HMMA_16816 = 2 * 16 * 8 * 16


def tensor_instruction_name(flops_per_instruction):
    # Counts are printed to 6 digits: match within 0.1%.
    if abs(flops_per_instruction / FLOPS_PER_HMMA_16816 - 1) < 1e-3:
        return "mma.sync m16n8k16"
    n = round(flops_per_instruction / (2 * 16 * 16))
    if n >= 8 and abs(flops_per_instruction / (2 * 16 * 16 * n) - 1) < 1e-3:
        return f"a warp's quarter of a wgmma 64x{n}x16"
    return "mixed instruction shapes"


def add_parser(subparsers):
    p = subparsers.add_parser("profile", help="ncu counters of tileattn's forward", description=__doc__)
    p.add_argument("--seqlen", type=int, default=4096)
    p.add_argument("--headdim", type=int, default=128)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    p.add_argument("--kernel-regex", default="fwd_kernel", help="which kernel ncu profiles")
    p.add_argument("--ncu", default="ncu")
    p.add_argument("--out", default=None, help="markdown summary path; a CSV goes beside it")
    p.add_argument("--target", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(run=run)


def target(args):
    """The profiled program: three forwards (ncu skips the first two launches: lazy init)."""
    import tileattn

    case = shapes.Case("lecture", args.batch, args.heads, args.seqlen, args.headdim, args.causal)
    q, k, v, _ = make_inputs(case, "cuda", DTYPES[args.dtype], False)
    for _ in range(3):
        tileattn.flash_attn_func(q, k, v, causal=args.causal)
    torch.cuda.synchronize()


def known_metrics(ncu):
    """Base names this ncu and GPU offer, or None when the query fails (then ask for everything)."""
    try:
        listing = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = {line.split()[0] for line in listing.splitlines() if line.strip() and "__" in line.split()[0]}
    return names or None


def choose_metrics(known, dtype):
    def offered(metric):
        return known is None or metric.split(".")[0] in known

    chosen = [m for m in ALWAYS if offered(m)]
    for group in (TENSOR_INSTRUCTIONS, TENSOR_OPS[dtype]):
        first = next((m for m in group if offered(m)), None)
        if first:
            chosen.append(first)
    return chosen


def parse_raw_csv(text):
    """{metric: value} of the first profiled kernel in `ncu --csv --page raw` output."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise SystemExit("profile: no CSV in ncu's output:\n" + text[-3000:])
    rows = list(csv.reader(io.StringIO("\n".join(line for line in lines[start:] if line.startswith('"')))))
    header, data = rows[0], [r for r in rows[1:] if r and r[0].isdigit()]
    if not data:
        raise SystemExit("profile: ncu profiled no kernel (check --kernel-regex):\n" + text[-3000:])
    values = {}
    for name, cell in zip(header, data[0]):
        try:
            values[name] = float(cell.replace(",", ""))
        except ValueError:
            values[name] = cell
    return values


def summarize(values, case, dtype):
    """Markdown lines and (name, value) pairs for the CSV."""
    flops = case.flops("fwd")
    io_bytes = case.bytes_moved("fwd")
    s_bytes = 2 * case.scores_bytes(2)  # S written once and read once, bf16
    nan = float("nan")
    read, written = values.get("dram__bytes_read.sum", nan), values.get("dram__bytes_write.sum", nan)
    dram = read + written
    seconds = values.get("gpu__time_duration.sum", nan) * 1e-9
    tflops = flops / seconds / 1e12
    pairs = [("flops_formula", flops), ("dram_bytes_total", dram), ("qkvo_bytes", io_bytes),
             ("materialized_s_bytes", s_bytes), ("achieved_tflops", tflops)]
    peak = shapes.GEMM_PEAK_TFLOPS
    lines = [f"| kernel time | {seconds * 1e3:.3f} ms |",
             f"| FLOPs (4 B H S^2 d{', halved: causal' if case.causal else ''}) | {flops:.4g} |",
             f"| achieved | {tflops:.1f} TFLOP/s ({tflops / peak:.1%} of the {peak:g} GEMM peak) |"]
    ops = next((values[m] for m in TENSOR_OPS[dtype] if m in values), nan)
    for metric in TENSOR_INSTRUCTIONS:
        if metric in values:
            count = values[metric]
            per = ops / count if count else nan
            named = tensor_instruction_name(per) if per == per else "no tensor-path count to name it"
            lines.append(f"| tensor-core instructions ({metric}) | {count:.4g} warp-level, {per:.6g} FLOPs each "
                         f"(tensor-path ops / instructions): {named} |")
            pairs.append(("tensor_instructions", count))
            break
    for metric in TENSOR_OPS[dtype]:
        if metric in values:
            lines.append(f"| tensor-path operations ({metric}) | {values[metric]:.4g}, "
                         f"{values[metric] / flops:.2f}x the formula |")
            pairs.append(("tensor_ops", values[metric]))
    shape = f"{case.batch}x{case.seqlen}x{case.heads}x{case.headdim}"
    lines += [f"| DRAM read | {read / 1e6:.1f} MB |",
              f"| DRAM written | {written / 1e6:.1f} MB |",
              f"| Q, K, V, O once ({shape} x 4 tensors x 2 B) | {io_bytes / 1e6:.1f} MB: DRAM moved "
              f"{dram / io_bytes:.2f}x this |",
              f"| a materialized S (B H S^2 bf16, written + read once) | {s_bytes / 1e6:.1f} MB: "
              f"{s_bytes / dram:.0f}x what the kernel moved |"]
    if "lts__t_bytes.sum" in values:
        lines.append(f"| L2 traffic (lts__t_bytes) | {values['lts__t_bytes.sum'] / 1e9:.2f} GB |")
    for metric in ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                   "launch__registers_per_thread", "launch__grid_size"):
        if metric in values:
            lines.append(f"| {metric} | {values[metric]:g} |")
    return lines, pairs


def run(args):
    if args.target:
        return target(args)
    case = shapes.Case("lecture", args.batch, args.heads, args.seqlen, args.headdim, args.causal)
    metrics = choose_metrics(known_metrics(args.ncu), args.dtype)
    command = [args.ncu, "--clock-control", "none", "--kernel-name", f"regex:{args.kernel_regex}",
               "--launch-skip", "2", "--launch-count", "1", "--metrics", ",".join(metrics), "--csv",
               "--page", "raw", "--print-units", "base",
               sys.executable, "-m", "bench", "profile", "--target", "--seqlen", str(args.seqlen),
               "--headdim", str(args.headdim), "--batch", str(args.batch), "--heads", str(args.heads),
               "--dtype", args.dtype] + (["--causal"] if args.causal else [])
    shown = " ".join(shlex.quote(c) for c in command)
    print(f"# {shown}", flush=True)
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"profile: ncu exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")
    values = parse_raw_csv(done.stdout)
    lines, pairs = summarize(values, case, args.dtype)
    title = (f"tileattn forward under Nsight Compute: {case.label()}, {args.dtype}, "
             f"{environment.device_name('cuda')} ({environment.today()}, commit {environment.commit()})")
    env = "TILEATTN_LIBRARY=<libtileattn.so> PYTHONPATH=python:. "
    text = "\n".join([title, "", "| | |", "|---|---|"] + lines +
                     ["", "Reproduce (repo root, GPU machine):", "", "```", env + shown.replace(sys.executable, "python3"), "```"])
    out = args.out or os.path.join(environment.RESULTS, f"profile-{environment.today()}.md")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        f.write(text + "\n")
    with open(os.path.splitext(out)[0] + ".csv", "w") as f:
        f.write("metric,value,gpu,date,commit\n")
        meta = f"{environment.device_name('cuda')},{environment.today()},{environment.commit()}"
        for name, value in [(m, values[m]) for m in metrics if m in values] + pairs:
            if isinstance(value, float):
                f.write(f"{name},{value:.6g},{meta}\n")
    print(text)
    print(f"# wrote {out}")
