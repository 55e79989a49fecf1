"""`python3 -m bench sweep`: every (shape set, causal, head dim, seqlen) x backend x direction, as
a CSV (bench/results.py's columns), a console table and one PNG per (shape set, direction)."""
import os
import statistics
import time

import torch

from bench import backends, environment, plots, results, shapes, timing
from bench.measure import DTYPES, Limits, memory_skip, time_backend
from bench.progress import Progress

DIRECTIONS = ("fwd", "bwd", "fwdbwd")


def add_parser(subparsers):
    p = subparsers.add_parser("sweep", help="TFLOP/s, GB/s and fraction of peak per shape and backend",
                              description=__doc__)
    p.add_argument("--shapes", nargs="+", default=["lecture", "fa"], choices=sorted(shapes.SHAPE_SETS),
                   help="lecture: batch 2 x 16 heads; fa: 16k tokens, hidden 2048")
    p.add_argument("--seqlens", type=int, nargs="+", default=list(shapes.SEQLENS))
    p.add_argument("--headdims", type=int, nargs="+", default=list(shapes.HEADDIMS))
    p.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    p.add_argument("--direction", nargs="+", default=["fwd"], choices=DIRECTIONS,
                   help="bwd is (fwd + bwd) - fwd; fwdbwd is the two together")
    p.add_argument("--backends", nargs="+", default=list(backends.DEFAULT_SWEEP))
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--runs", type=int, default=timing.RUNS)
    p.add_argument("--warmup", type=int, default=timing.WARMUP)
    p.add_argument("--queue", type=int, default=1,
                   help="calls per timed sample, issued back to back (default 1: each call alone, the "
                        "host's launch cost included; more: the kernels' throughput, for A/Bs)")
    p.add_argument("--repeat", type=int, default=1,
                   help="time each case this many times, the backends in a balanced order (each follows "
                        "every other equally often over n rounds for n backends, 2n when n is odd), and "
                        "report the median: on the H200 one pass's points at 512-2k tokens move 10-30%% "
                        "between sweeps (perf log)")
    p.add_argument("--max-case-s", type=float, default=30.0,
                   help="skip a (case, backend) whose warm-up + timed calls would take longer")
    p.add_argument("--deadline-s", type=float, default=float("inf"),
                   help="start no new case after this many seconds (the CSV keeps what finished)")
    p.add_argument("--out", default=None, help="CSV path; PNGs go beside it")
    p.add_argument("--plot", nargs="+", default=["all"], choices=["all", "none"] + list(DIRECTIONS),
                   help="which directions get a PNG (one per shape set and direction)")
    p.add_argument("--dry-run", action="store_true", help="list the cases and skips, time nothing")
    p.set_defaults(run=run)


def causal_values(choice):
    return {"both": (False, True), "yes": (True,), "no": (False,)}[choice]


def run(args):
    chosen = [backends.get(name) for name in args.backends]
    cases = shapes.cases(args.shapes, args.seqlens, args.headdims, causal_values(args.causal))
    out = args.out or os.path.join(environment.RESULTS, f"sweep-{environment.today()}.csv")
    if args.dry_run:
        return dry_run(cases, chosen, args)
    meta = dict(gpu=environment.device_name(args.device), date=environment.today(), commit=environment.commit(),
                library=environment.library_md5())
    print(f"# {meta['gpu']} | torch {torch.__version__} | {args.dtype} | commit {meta['commit']} | "
          f"library md5 {meta['library']} | median of {args.runs} samples of {args.queue} call(s) after {args.warmup} warm-ups | "
          f"peak {shapes.GEMM_PEAK_TFLOPS:g} TFLOP/s")
    writer = results.CsvWriter(out, meta)
    limits = Limits(max_case_s=args.max_case_s)
    progress = Progress(len(cases) * len(chosen) * args.repeat, "sweep")
    start = time.perf_counter()
    try:
        for case in cases:
            if time.perf_counter() - start > args.deadline_s:
                progress.write(f"# deadline {args.deadline_s:g} s reached: stopped before {case.label()}")
                break
            rounds = time_rounds(case, chosen, args, limits, progress)
            cells = {}
            for (direction, name), values in rounds.items():
                ms = statistics.median(values)
                tflops, gbps, frac = shapes.rate(case, direction, ms)
                writer.add(case, direction, name, ms, tflops, gbps, frac, rounds=values)
                cells[direction, name] = tflops
            for direction in args.direction:
                line = "  ".join(f"{b.name} {cells[direction, b.name]:.3g}" for b in chosen
                                 if (direction, b.name) in cells)
                progress.write(f"{case.label():<40} {direction:<6} TFLOP/s: {line}")
    finally:
        progress.close()
        writer.close()
    print(f"# wrote {out}")
    wanted = None if "all" in args.plot else [d for d in args.plot if d != "none"]
    if wanted == []:
        return
    if not plots.available():
        print("# no plot: matplotlib is not installed")
    else:
        for path in plots.sweep_pngs(out, wanted):
            print(f"# wrote {path}")


def time_rounds(case, chosen, args, limits, progress):
    """{(direction, backend name): [ms of each round]}: args.repeat rounds over the backends, so a
    slow stretch of the GPU lands on every backend alike, in timing.round_orders' balanced orders, so
    that none always runs right after the same one; a backend skipped once is not retried."""
    rounds, skipped = {}, set()
    orders = timing.round_orders(len(chosen))
    for r in range(args.repeat):
        for backend in (chosen[k] for k in orders[r % len(orders)]):
            if backend.name in skipped:
                progress.step(f"{case.label()} {backend.name} (skipped)")
                continue
            directions = [d for d in args.direction if backends.skip_reason(backend, args.device, d) is None]
            if directions:
                measured = time_backend(backend, case, directions, args.device, DTYPES[args.dtype], limits,
                                        args.runs, args.warmup, args.queue)
            else:
                measured = backends.skip_reason(backend, args.device, args.direction[0])
            if isinstance(measured, str):
                progress.write(f"# skip {backend.name}: {case.label()}: {measured}")
                skipped.add(backend.name)
                measured = {}
            for direction, ms in measured.items():
                rounds.setdefault((direction, backend.name), []).append(ms)
            progress.step(f"{case.label()} {backend.name}")
    return rounds


def dry_run(cases, chosen, args):
    limits = Limits()
    for case in cases:
        for backend in chosen:
            reasons = [backends.skip_reason(backend, args.device, d) for d in args.direction]
            if args.device != "cpu" and torch.cuda.is_available():
                reasons.append(memory_skip(backend, case, args.direction, args.device, limits))
            reason = "; ".join(r for r in reasons if r)
            flops = case.flops(args.direction[0]) / 1e12
            print(f"{case.label():<40} {backend.name:<18} {flops:8.3f} TFLOP {'skip: ' + reason if reason else ''}")
    print(f"# {len(cases)} cases x {len(chosen)} backends x {args.direction}")
