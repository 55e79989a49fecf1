#!/usr/bin/env python3
"""An eager fwd+bwd step (B1 S512 causal d128 bf16, with and without GQA), one step between two
CUDA events, as captured graphs of the same step accumulate and after they are freed; and the
replay time of one graph.  Flat is right.  With the backward's scratch from tileattn's own pool,
the GQA step grew 829 -> 1158 us over 16 captures and stayed there (session 22,
bench/results/h200-decode-host-path-2026-12-01.txt); the host's noise on these steps is +-20%.

    python3 bench/gpu/train_step_graphs.py
"""
import statistics

import torch

import tileattn

def event_us(fn, n=30):
    for _ in range(5): fn()
    ts = []
    for _ in range(n):
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); e.synchronize(); ts.append(s.elapsed_time(e) * 1e3)
    return statistics.median(ts)

for (B, S, H, Hk, D) in ((1, 512, 16, 16, 128), (1, 512, 32, 8, 128)):
    q = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, S, Hk, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, S, Hk, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)
    def step():
        out = tileattn.flash_attn_func(q, k, v, causal=True)
        return torch.autograd.grad(out, (q, k, v), do)
    graphs = []
    for alive in (0, 1, 4, 16):
        while len(graphs) < alive:
            side = torch.cuda.Stream(); side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                step()
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                step()
            g.replay(); graphs.append(g)
        rep = event_us(lambda: graphs[0].replay()) if graphs else float("nan")
        print(f"B{B} S{S} H{H}/{Hk} D{D} graphs {alive:2d}: eager fwd+bwd event {event_us(step):7.1f} us | replay {rep:7.1f} us", flush=True)
    graphs.clear(); torch.cuda.synchronize()
    print(f"  deleted: eager {event_us(step):7.1f} us", flush=True)
