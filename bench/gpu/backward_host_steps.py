#!/usr/bin/env python3
"""Host time of `out.backward()` after an idle GPU, split at tileattn's autograd node: from the
call to the node's start (autograd's engine hands the node to its CUDA device thread), the node
itself (our Python and the library's launches), and from the node's end to the call's return
(the gradients accumulated, control back to the caller).  Then the same with the library calls
replaced by a ctypes no-op, to separate the engine's cost from ours, and a trivial Python
autograd.Function for scale.  d64, 512 tokens, batch 32, 32 heads, bf16 (the sweep's d64 512 point).

    python3 bench/gpu/backward_host_steps.py
"""
import ctypes
import statistics
import time

import torch

import timing  # noqa: F401  puts the repository root on sys.path
import tileattn
from tileattn import _ffi, _ops

SHAPE = (32, 512, 32, 64)
stamps = {}


def stamp_backward(function):
    """Wrap an autograd.Function's backward to record when it starts and ends."""
    inner = function.backward

    def backward(ctx, *grads):
        stamps["in"] = time.perf_counter()
        result = inner(ctx, *grads)
        stamps["out"] = time.perf_counter()
        return result
    function.backward = staticmethod(backward)


class Trivial(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return torch.empty_like(q)

    @staticmethod
    def backward(ctx, grad):
        q, k, v = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def run(name, forward, inputs, dout, calls=40, warmup=5):
    rows = []
    for i in range(warmup + calls):
        for x in inputs:
            x.grad = None
        out = forward()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out.backward(dout)
        t1 = time.perf_counter()
        if i >= warmup:
            rows.append((stamps["in"] - t0, stamps["out"] - stamps["in"], t1 - stamps["out"], t1 - t0))
    to_node, node, after, total = (statistics.median(r[j] for r in rows) * 1e6 for j in range(4))
    print(f"{name:42s} to node {to_node:6.1f}  node {node:6.1f}  after {after:6.1f}  total {total:6.1f} us",
          flush=True)


def main():
    q, k, v = (torch.randn(SHAPE, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(SHAPE, device="cuda", dtype=torch.bfloat16)
    stamp_backward(_ops._EagerFwd)
    stamp_backward(Trivial)
    run("tileattn", lambda: tileattn.flash_attn_func(q, k, v), (q, k, v), dout)
    run("trivial autograd.Function", lambda: Trivial.apply(q, k, v), (q, k, v), dout)
    library = _ffi.library()
    real = library.forward, library.backward
    noop = ctypes.CDLL(None).getppid  # a C call that ignores its argument, as the library's calls do
    noop.argtypes = [ctypes.c_void_p]
    library.backward = lambda params: noop(ctypes.byref(params))
    run("tileattn, backward library call a no-op", lambda: tileattn.flash_attn_func(q, k, v), (q, k, v), dout)
    library.forward = lambda params: noop(ctypes.byref(params))
    run("tileattn, both library calls no-ops", lambda: tileattn.flash_attn_func(q, k, v), (q, k, v), dout)
    library.forward, library.backward = real


if __name__ == "__main__":
    main()
