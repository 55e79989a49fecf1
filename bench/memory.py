"""`python3 -m bench memory`: peak memory of one forward + backward, SDPA math (which materializes
the B x H x S x S scores) against SDPA flash and tileattn (which keep O(S) extra: the LSE), at the
lecture's batch 2 x 16 heads, d 128, seqlen 1k..16k.  Peak = torch.cuda.max_memory_allocated
after a reset, minus what Q, K, V and dO already held: the memory the attention adds, its outputs
O, dQ, dK, dV (4 x B S H d x 2 bytes) included."""
import os

import torch

from bench import backends, environment, plots, shapes
from bench.measure import DTYPES, SCORE_MATRICES, make_inputs

SEQLENS = (1024, 2048, 4096, 8192, 16384)
BACKENDS = ("sdpa-math", "sdpa-flash", "tileattn")


def add_parser(subparsers):
    p = subparsers.add_parser("memory", help="peak memory, forward + backward", description=__doc__)
    p.add_argument("--seqlens", type=int, nargs="+", default=list(SEQLENS))
    p.add_argument("--headdim", type=int, default=128)
    p.add_argument("--backends", nargs="+", default=list(BACKENDS))
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default=None, help="markdown table path; the CSV and PNG go beside it")
    p.set_defaults(run=run)


def peak_gib(backend, case, device, dtype):
    """Extra GiB at the peak of one forward + backward, or a string saying why none was measured."""
    if torch.device(device).type != "cuda":
        return "needs CUDA"
    need = case.scores_bytes() * SCORE_MATRICES["fwdbwd"] if backend.materializes_scores else 0
    if need > torch.cuda.mem_get_info()[0]:
        return f"skipped: ~{need / 2**30:.0f} GiB of scores would not fit"
    q, k, v, dout = make_inputs(case, device, dtype, True)
    try:
        backend.make(q, k, v, case.causal)().backward(dout)  # warm: plans, workspaces, kernels
        q.grad = k.grad = v.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        backend.make(q, k, v, case.causal)().backward(dout)
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**30
    except torch.cuda.OutOfMemoryError:
        return "out of memory"
    except RuntimeError as error:
        return str(error).strip().splitlines()[0][:120]
    finally:
        del q, k, v, dout
        torch.cuda.empty_cache()


def run(args):
    chosen = [backends.get(name) for name in args.backends]
    table = {b.name: [] for b in chosen}
    lines = [f"Peak memory beyond Q, K, V, dO (so O, dQ, dK, dV included), forward + backward, batch 2 x 16 heads, d{args.headdim}, "
             f"{args.dtype}, {environment.device_name(args.device)} ({environment.today()}, commit "
             f"{environment.commit()}); GiB", "",
             "| seqlen | " + " | ".join(b.name for b in chosen) + " | O, dQ, dK, dV | B*H*S^2 bf16 scores |",
             "|---" * (len(chosen) + 3) + "|"]
    csv_lines = ["seqlen,headdim,backend,peak_gib,note,gpu,date,commit"]
    meta = f"{environment.device_name(args.device)},{environment.today()},{environment.commit()}"
    for seqlen in args.seqlens:
        case = shapes.lecture(seqlen, args.headdim, False)
        cells = []
        for backend in chosen:
            peak = peak_gib(backend, case, args.device, DTYPES[args.dtype])
            measured = None if isinstance(peak, str) else peak
            table[backend.name].append((seqlen, measured))
            cells.append(f"{measured:.3f}" if measured is not None else peak)
            csv_lines.append(f"{seqlen},{args.headdim},{backend.name},"
                             f"{'' if measured is None else f'{measured:.4f}'},{'' if measured is not None else peak},{meta}")
            print(f"S={seqlen:<6} {backend.name:<12} {cells[-1]}", flush=True)
        outputs = case.bytes_moved("fwd") / 2**30  # 4 tensors of q's size, as O, dQ, dK, dV
        lines.append(f"| {seqlen} | " + " | ".join(cells) + f" | {outputs:.3f} | {case.scores_bytes(2) / 2**30:.2f} |")
    out = args.out or os.path.join(environment.RESULTS, f"memory-{environment.today()}.md")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    stem = os.path.splitext(out)[0]
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(stem + ".csv", "w") as f:
        f.write("\n".join(csv_lines) + "\n")
    print("\n".join(lines))
    if plots.available() and any(m is not None for points in table.values() for _, m in points):
        plots.memory_png(table, stem + ".png", lines[0])
        print(f"# wrote {out}, {stem}.csv, {stem}.png")
    else:
        print(f"# wrote {out}, {stem}.csv (no plot: nothing measured or no matplotlib)")
