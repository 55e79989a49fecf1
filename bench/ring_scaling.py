"""`python3 -m bench ring`: ring attention's weak scaling, a fixed sequence length per GPU,
1 -> N GPUs over NCCL.

    python3 -m bench ring --tokens-per-gpu 8192 --out ring-scaling.csv

For each GPU count N (powers of two up to the machine's GPUs) it spawns N processes, shards one
sequence of N x tokens-per-gpu tokens (zigzag when causal), and times ring_flash_attn_func's
forward and forward+backward (median of --runs after --warmup, CUDA events, a barrier before each
run).  Throughput is FA's FLOP count of the whole sequence (4 B H N^2 d, halved when causal,
x3.5 for forward+backward) over the time; efficiency is throughput / (N x the 1-GPU throughput).
"""

import argparse
import csv
import os
import statistics
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bench import environment


def _flops(batch, heads, seqlen, dim, causal, direction):
    forward = 4 * batch * heads * seqlen * seqlen * dim / (2 if causal else 1)
    return forward * (3.5 if direction == "fwdbwd" else 1.0)


def _time(fn, warmup, runs):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _worker(rank, world, args, folder):
    import tileattn
    from tileattn import ring

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{folder}/rendezvous", rank=rank,
                            world_size=world)
    rows = []
    for causal in (False, True):
        shape = (args.batch, args.tokens_per_gpu * world, args.heads, args.dim)
        generator = torch.Generator(device="cuda").manual_seed(0)
        full = [torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=generator)
                for _ in range(4)]
        q, k, v, dout = [ring.zigzag_shard(x, rank, world) if causal else x.chunk(world, 1)[rank]
                         for x in full]
        del full
        q, k, v = (x.contiguous().requires_grad_() for x in (q, k, v))

        def forward():
            with torch.no_grad():
                tileattn.ring_flash_attn_func(q, k, v, causal=causal)

        def forward_backward():
            tileattn.ring_flash_attn_func(q, k, v, causal=causal).backward(dout)

        for direction, fn in (("fwd", forward), ("fwdbwd", forward_backward)):
            ms = _time(fn, args.warmup, args.runs)
            flops = _flops(args.batch, args.heads, shape[1], args.dim, causal, direction)
            rows.append(dict(gpus=world, tokens_per_gpu=args.tokens_per_gpu, seqlen=shape[1],
                             causal=causal, direction=direction, ms=round(ms, 3),
                             tflops=round(flops / ms / 1e9, 1)))
    if rank == 0:
        torch.save(rows, f"{folder}/rows.pt")
    dist.destroy_process_group()


def add_parser(subparsers):
    p = subparsers.add_parser("ring", help="ring attention's weak scaling over the machine's GPUs",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens-per-gpu", type=int, default=8192)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--out", default="ring-scaling.csv")
    p.set_defaults(run=run)


def run(args):
    gpus = torch.cuda.device_count()
    counts = [n for n in (1, 2, 4, 8) if n <= gpus]
    rows = []
    for world in counts:
        with tempfile.TemporaryDirectory() as folder:
            mp.spawn(_worker, args=(world, args, folder), nprocs=world, join=True)
            rows += torch.load(os.path.join(folder, "rows.pt"))
    stamp = dict(gpu=torch.cuda.get_device_name(0), date=environment.today(),
                 commit=environment.commit())
    rows = [dict(stamp, **r) for r in rows]
    single = {(r["causal"], r["direction"]): r["tflops"] for r in rows if r["gpus"] == 1}
    for r in rows:
        r["efficiency"] = round(r["tflops"] / (r["gpus"] * single[(r["causal"], r["direction"])]), 3)
        print(r)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
