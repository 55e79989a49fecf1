#!/usr/bin/env python3
"""Decode over a KV cache on the GPU: one query token, 32 query heads over 8 KV heads, d 128, bf16;
batch 1..128, cache 2k..128k keys (points whose K + V exceed --max-gb are skipped).  tileattn's
flash_attn_with_kvcache on a contiguous cache and on paged caches (pages of 16 and 256, random
block tables) next to PyTorch SDPA's flash and cuDNN backends (enable_gqa, K/V as a (B, Hk, L, d)
view of the same contiguous cache), all in one process.

Metric: GB/s of K and V read, 2 B Hk L d 2 bytes / time; every backend reads each K/V byte once.
The `copy` layout is the ceiling at the point's size: a device-to-device copy of K alone, which
moves the same bytes (half read, half written; the anchors' 4.0 TB/s counts a copy so), timed the
same way, so a small point's launch and ramp are in the ceiling as they are in the decode.
A tileattn layout may end in `:sN` (`contiguous:s2`) to fix num_splits at N instead of the library's
heuristic, so split counts can be compared in one interleaved run, and in `:a` (`page16:a`) to make
each call append its token as a serving step does: k and v of one new token given, written at
position L - 1, attention over the L positions (the same K/V bytes read, plus the append kernel).
`varlen16` / `varlen256` make the step flash_attn_varlen_func's paged call (one query row a
sequence, cu_seqlens and a block table, as vLLM batches a decode step), which runs on the same
kernels; `varlen16-gather` forces that call through the gather of the pages into a padded copy.
`func` makes the step flash_attn_func(q, k_cache, v_cache) over the whole contiguous cache (a model
that passes its K/V whole, as Hugging Face's flash-attention path does), which runs on the same
kernels (python/tileattn/_batch_decode_route.py); `func-forward` makes that call on the forward
kernels, the path before session 73.  `packed` / `packed-forward`: the same as
flash_attn_varlen_func over the cache seen as packed rows (one query row a sequence, no pages).
Time: each backend's calls are captured in a CUDA graph (no host launch cost in the number, as in
a serving loop) over enough copies of the cache that consecutive calls miss L2 (50 MB); the
backends' graphs are replayed in interleaved rounds, and each gets the median per call over its
replays (interleaved_ms says why); the copy, which leaves dirty lines in L2, in rounds of its
own.  The anchor shapes are also timed eagerly, one call between two
events, as shared/anchors/measure_sdpa.py measured SDPA.

    python3 bench/gpu/decode.py [--batches 1 8] [--lengths 32768] [--out file.csv] [--png file.png]
"""
import argparse
import contextlib
import csv
import datetime
import math
import os
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import tileattn
from tileattn import _batch_decode_route
from timing import ROOT, git_commit, median_ms, round_orders
from bench.paged_varlen_step import decode_step  # noqa: E402 (timing puts the repository root on sys.path)

HEADS, HEADS_K, DIM = 32, 8, 128  # DIM: --headdim
ANCHORS = {(1, 32768), (8, 8192), (32, 8192), (64, 4096)}
L2_BYTES = 50 << 20


def kv_bytes_of(batch, length):
    """Bytes of K and V a call reads at (batch, length)."""
    return 2 * batch * HEADS_K * length * DIM * 2


def cache_copies(batch, length):
    """Copies of the cache that consecutive calls rotate through so that none finds its K/V in L2
    (four L2s' worth, at most 16)."""
    return max(1, min(16, math.ceil(4 * L2_BYTES / kv_bytes_of(batch, length))))


def make_caches(batch, length, copies):
    """`copies` contiguous caches (B, L, Hk, d) with a random length-L history each."""
    shape = (batch, length, HEADS_K, DIM)
    return [(torch.randn(shape, device="cuda", dtype=torch.bfloat16),
             torch.randn(shape, device="cuda", dtype=torch.bfloat16)) for _ in range(copies)]


def parse_layout(layout):
    """(layout, num_splits, append) of a layout name: `contiguous:s2` -> ("contiguous", 2, False),
    `page16:a` -> ("page16", 0, True); without `:sN` num_splits is 0, the library's heuristic."""
    name, *suffixes = layout.split(":")
    unknown = [x for x in suffixes if x != "a" and not (x.startswith("s") and x[1:].isdigit())]
    if unknown:
        raise ValueError(f"layout {layout}: unknown suffix {unknown[0]} (:sN or :a)")
    splits = [int(x[1:]) for x in suffixes if x.startswith("s")]
    return name, splits[-1] if splits else 0, "a" in suffixes


@contextlib.contextmanager
def decode_route(on):
    """The decode route of flash_attn_func / flash_attn_varlen_func on or off for the calls inside
    (python/tileattn/_batch_decode_route.py)."""
    kept = _batch_decode_route.DEVICES
    _batch_decode_route.DEVICES = ("cuda",) if on else ()
    try:
        yield
    finally:
        _batch_decode_route.DEVICES = kept


def calls(layout, q, caches, seqlens):
    """One zero-argument function per cache copy for `layout`."""
    layout, splits, append = parse_layout(layout)
    if append and layout in ("copy", "flash", "cudnn", "func", "func-forward", "packed", "packed-forward"):
        raise ValueError(f"layout {layout}: only tileattn's cache layouts take :a (SDPA and "
                         "flash_attn_func do not append)")
    if splits and layout in ("func", "func-forward", "packed", "packed-forward"):
        raise ValueError(f"layout {layout}: flash_attn_func takes no :sN (the library picks the splits)")
    if layout.startswith("varlen") and (append or splits):
        raise ValueError(f"layout {layout}: the varlen call takes neither :a nor :sN")
    batch, length = caches[0][0].shape[:2]
    # With an append the cache holds L - 1 tokens before the call and L after it.
    new = {}
    if append:
        shape = (batch, 1, HEADS_K, DIM)
        new = dict(k=torch.randn(shape, device="cuda", dtype=torch.bfloat16),
                   v=torch.randn(shape, device="cuda", dtype=torch.bfloat16))
        seqlens = seqlens - 1
    fns = []
    for k_cache, v_cache in caches:
        if layout == "copy":
            def run(k_cache=k_cache, target=torch.empty_like(k_cache)):
                return target.copy_(k_cache)
        elif layout in ("flash", "cudnn"):
            qt, kt, vt = q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2)
            kind = SDPBackend.FLASH_ATTENTION if layout == "flash" else SDPBackend.CUDNN_ATTENTION

            def run(qt=qt, kt=kt, vt=vt, kind=kind):
                with sdpa_kernel(kind):
                    return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
        elif layout in ("func", "func-forward"):
            # func-forward names its scale, so its repeat-call plan (_fwd_plan, keyed by the
            # options: a plan of the forward kernels, which does not look at the route) never
            # serves func's calls, which keep the default scale (their plan is the route's).
            route = layout == "func"
            options = {} if route else dict(softmax_scale=DIM ** -0.5)

            def run(k_cache=k_cache, v_cache=v_cache, route=route, options=options):
                with decode_route(route):
                    return tileattn.flash_attn_func(q, k_cache, v_cache, **options)
        elif layout in ("packed", "packed-forward"):
            route = layout == "packed"
            options = {} if route else dict(softmax_scale=DIM ** -0.5)  # apart plans, as for func
            rows = q.flatten(0, 1)
            cu_q = torch.arange(batch + 1, device="cuda", dtype=torch.int32)
            cu_k = cu_q * length

            def run(k_cache=k_cache, v_cache=v_cache, route=route, options=options):
                with decode_route(route):
                    return tileattn.flash_attn_varlen_func(rows, k_cache.flatten(0, 1), v_cache.flatten(0, 1), cu_q,
                                                           cu_k, 1, length, **options)
        elif layout in ("contiguous", "contiguous-int"):
            # contiguous-int: cache_seqlens as one Python int for every sequence (flash-attn's
            # other form), which the seqlens here allow: all sequences hold the same tokens.
            lengths = int(seqlens[0]) if layout == "contiguous-int" else seqlens

            def run(k_cache=k_cache, v_cache=v_cache, lengths=lengths):
                return tileattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lengths,
                                                        num_splits=splits, **new)
        elif layout.startswith("varlen"):
            run = varlen_call(layout, q, k_cache, v_cache, seqlens)
        else:  # paged: the same memory seen as pages, in a random order
            page = int(layout.removeprefix("page"))
            blocks = batch * length // page
            k_pages = k_cache.view(blocks, page, HEADS_K, DIM)
            v_pages = v_cache.view(blocks, page, HEADS_K, DIM)
            table = torch.randperm(blocks, device="cuda", dtype=torch.int32).view(batch, length // page)

            def run(k_pages=k_pages, v_pages=v_pages, table=table):
                return tileattn.flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=seqlens,
                                                        block_table=table, num_splits=splits, **new)
        fns.append(run)
    return fns


def varlen_call(layout, q, k_cache, v_cache, seqlens):
    """`varlenN`: the step as a serving engine batches it, flash_attn_varlen_func with one query
    row a sequence and the cache in pages of N (random order), which runs on the KV-cache kernels;
    `varlenN-gather`: the same call made to gather the pages into a padded copy first, the path
    every paged varlen call took before session 52."""
    page_text, _, path = layout.removeprefix("varlen").partition("-")
    if not page_text.isdigit() or path not in ("", "gather"):
        raise ValueError(f"layout {layout}: expected varlenN or varlenN-gather")
    page = int(page_text)
    batch, length = k_cache.shape[:2]
    blocks = batch * length // page
    k_pages = k_cache.view(blocks, page, HEADS_K, DIM)
    v_pages = v_cache.view(blocks, page, HEADS_K, DIM)
    table = torch.randperm(blocks, device="cuda", dtype=torch.int32).view(batch, length // page)
    return decode_step(q, k_pages, v_pages, table, seqlens, length, gather=path == "gather")


def capture(fns):
    """The calls captured in one CUDA graph, repeated to at least 6 calls a replay: (graph, calls)."""
    repeat = max(1, math.ceil(6 / len(fns)))
    for fn in fns:
        fn()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for fn in fns:
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeat):
            for fn in fns:
                fn()
    graph.replay()
    return graph, repeat * len(fns)


def replay_ms(graph, calls):
    """Time per call of one replay."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def graph_ms(fns, replays=5):
    """Median time per call of the calls captured in one graph."""
    graph, count = capture(fns)
    times = [replay_ms(graph, count) for _ in range(replays)]
    del graph
    return statistics.median(times)


def interleaved_ms(graphs, rounds=5, replays=2):
    """Median time per call of each captured layout, timed in rounds that visit every layout, after
    one round that is not counted.  Timing each layout to the end before the next put whatever the
    GPU still did after the previous point on the first layout timed: after a point of 4 GB caches
    the first layout timed at 128 x 2k ran 7-12% slow, whichever it was (cuDNN too), and the others
    did not (perf log, session 19).  The rounds take timing.round_orders' balanced orders (each
    layout right after every other equally often) rather than a rotation, which put every layout
    after the same neighbour each round: in the FA sweep, at the power limit, the backend right
    after a heavy one read 2.5-5% slow (perf log, session 47)."""
    names = list(graphs)
    times = {name: [] for name in names}
    orders = round_orders(len(names))
    for r in range(rounds + 1):
        for name in (names[k] for k in orders[r % len(orders)]):
            for _ in range(replays):
                ms = replay_ms(*graphs[name])
                if r > 0:
                    times[name].append(ms)
    return {name: statistics.median(t) for name, t in times.items()}


def main():
    global DIM  # --headdim sets it for the whole run
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64, 128])
    ap.add_argument("--lengths", type=int, nargs="+",
                    default=[2048, 4096, 8192, 16384, 32768, 65536, 131072])
    ap.add_argument("--layouts", nargs="+",
                    default=["contiguous", "page16", "page256", "flash", "cudnn", "copy"])
    ap.add_argument("--max-gb", type=float, default=40.0, help="skip points whose K + V exceed this")
    ap.add_argument("--headdim", type=int, default=DIM, help="head dim (the anchors' shapes are d 128)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--png", default=None)
    args = ap.parse_args()
    DIM = args.headdim

    gpu, date, commit = torch.cuda.get_device_name(), datetime.date.today().isoformat(), git_commit()
    out = args.out or os.path.join(ROOT, "bench", "results", f"h200-decode-{date}.csv")
    print(f"# {gpu}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"tileattn {tileattn.library_path()}, commit {commit}")
    print(f"{'B':>4} {'L':>7} | " + " ".join(f"{name:>10}" for name in args.layouts) + "   (GB/s, graph)")
    rows = []
    for batch in args.batches:
        for length in args.lengths:
            kv_bytes = kv_bytes_of(batch, length)
            if kv_bytes > args.max_gb * 1e9:
                continue
            caches = make_caches(batch, length, cache_copies(batch, length))
            q = torch.randn(batch, 1, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
            seqlens = torch.full((batch,), length, device="cuda", dtype=torch.int32)
            # The calls stay referenced while their graphs replay: a graph holds the addresses of
            # what they captured (the random block tables), not the tensors.
            cells, graphs, eager, captured = [], {}, {}, {}
            for layout in args.layouts:
                try:
                    fns = captured[layout] = calls(layout, q, caches, seqlens)
                    graphs[layout] = capture(fns)
                    eager[layout] = median_ms(fns[0], 20) if (batch, length) in ANCHORS else float("nan")
                except RuntimeError as error:
                    print(f"# {layout} B={batch} L={length}: {str(error).splitlines()[0]}")
            # The copy writes as many bytes as it reads and leaves up to an L2 (50 MB) of dirty
            # lines, which the next graph's reads first write back: in the rotation that cost the
            # layout timed after it 2-8% (session 46: contiguous at 1 x 32k 3395 GB/s after it,
            # 3635 without it; cuDNN 1-3% when it came after it).  The copy is a ceiling, not a
            # contender, so it gets rounds of its own after the readers'.
            readers = {name: graph for name, graph in graphs.items() if name != "copy"}
            graph_times = interleaved_ms(readers) if readers else {}
            if "copy" in graphs:
                graph_times.update(interleaved_ms({"copy": graphs["copy"]}))
            for layout in args.layouts:
                ms = graph_times.get(layout, float("nan"))
                gbs = kv_bytes / ms / 1e6
                cells.append(gbs)
                rows.append(dict(gpu=gpu, date=date, commit=commit, layout=layout, batch=batch,
                                 cache_len=length, heads=HEADS, heads_k=HEADS_K, headdim=DIM,
                                 kv_bytes=kv_bytes, ms_graph=ms, gbs_graph=gbs,
                                 ms_eager=eager.get(layout, float("nan")),
                                 gbs_eager=kv_bytes / eager.get(layout, float("nan")) / 1e6))
            print(f"{batch:>4} {length:>7} | " + " ".join(f"{g:>10.0f}" for g in cells), flush=True)
            del caches, graphs, captured
            torch.cuda.empty_cache()
    print("# eager (one call between events, as the anchors): " + "; ".join(
        f"{r['layout']} B={r['batch']} L={r['cache_len']} {r['gbs_eager']:.0f}"
        for r in rows if not math.isnan(r["ms_eager"])))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"# wrote {out}")
    if args.png:
        plot(rows, args.png)


def plot(rows, target):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    batches = sorted({r["batch"] for r in rows})
    fig, axes = plt.subplots(1, len(batches), figsize=(4 * len(batches), 4), squeeze=False)
    for ax, batch in zip(axes[0], batches):
        for layout in dict.fromkeys(r["layout"] for r in rows):
            points = sorted((r["cache_len"], r["gbs_graph"]) for r in rows
                            if r["batch"] == batch and r["layout"] == layout)
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=layout,
                    linestyle={"copy": ":", "flash": "--", "cudnn": "--"}.get(layout, "-"))
        ax.set_xscale("log", base=2)
        ax.set_title(f"batch {batch}")
        ax.set_xlabel("cache length")
        ax.set_ylabel("GB/s of K+V")
        ax.grid(alpha=0.3)
    axes[0][0].legend()
    fig.suptitle("decode, 32 q heads / 8 KV heads, d128 bf16 (H200)")
    fig.tight_layout()
    fig.savefig(target, dpi=110)
    print(f"# wrote {target}")


if __name__ == "__main__":
    main()
