#!/usr/bin/env python3
"""Host cost per call on CUDA, by layer, at a tiny shape (so the GPU is never the bottleneck):
calls issued back to back, one synchronize at the end, wall time / calls.  Also times the
backward with atomic and deterministic dQ at one large shape.

    python3 bench/gpu/overhead.py
"""
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import tileattn
from tileattn import _ffi, _ops


def per_call_us(fn, calls=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main():
    q, k, v = (torch.randn(1, 128, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = torch.empty_like(q)
    lse = torch.empty(1, 8, 128, device="cuda", dtype=torch.float32)
    params = _ffi.FwdParams()
    _ops._fill_forward(params, q, k, v, out, lse, None, batch=1, seqlen_q=128, seqlen_k=128,
                       varlen=False, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None,
                       dropout_p=0.0, softmax_scale=0.125, window_left=-1, window_right=-1,
                       softcap=0.0, alibi_slopes=None, seed=0, offset=0)
    lib = _ffi.library()
    rows = [
        ("ctypes call, params prefilled (validation, pointer checks, launch)", lambda: lib.forward(params)),
        ("torch.ops.tileattn.fwd, no_grad", lambda: _no_grad(lambda: torch.ops.tileattn.fwd(
            q, k, v, 0.0, 0.125, -1, -1, 0.0, None, False, False))),
        ("flash_attn_func, no_grad", lambda: _no_grad(lambda: tileattn.flash_attn_func(q, k, v))),
        ("flash_attn_func, grad on (inputs need grad)", None),
        ("SDPA flash, no_grad", lambda: _no_grad(lambda: _sdpa(q, k, v))),
    ]
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    rows[3] = (rows[3][0], lambda: tileattn.flash_attn_func(qg, kg, vg))
    dout = torch.randn_like(q)

    def fwd_bwd(attention):
        def step():
            qg.grad = kg.grad = vg.grad = None
            attention(qg, kg, vg).backward(dout)
        return step

    # The same 128 tokens packed as one varlen sequence: (total, H, D) views of the batch tensors.
    cu = torch.tensor([0, 128], dtype=torch.int32, device="cuda")
    packed = [x[0] for x in (q, k, v)]

    def varlen(a, b, c):
        return tileattn.flash_attn_varlen_func(a[0], b[0], c[0], cu, cu, 128, 128).unsqueeze(0)

    rows += [
        ("flash_attn_func forward + backward(dout)", fwd_bwd(tileattn.flash_attn_func)),
        ("flash_attn_varlen_func forward + backward(dout)", fwd_bwd(varlen)),
        ("flash_attn_varlen_func, no_grad",
         lambda: _no_grad(lambda: tileattn.flash_attn_varlen_func(*packed, cu, cu, 128, 128))),
        ("SDPA flash forward + backward(dout)",
         fwd_bwd(lambda a, b, c: _sdpa(a, b, c).transpose(1, 2))),
    ]
    for name, fn in rows:
        print(f"{per_call_us(fn):8.1f} us  {name}")

    # Backward, atomic vs deterministic dQ, d128 8k non-causal (B=2, H=16).
    shape = (2, 8192, 16, 128)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    flops = 2.5 * 4 * 2 * 16 * 8192 ** 2 * 128
    for deterministic in (False, True):
        o = tileattn.flash_attn_func(q, k, v, deterministic=deterministic)
        def step():
            torch.autograd.grad(o, (q, k, v), dout, retain_graph=True)
        ms = per_call_us(step, calls=10) / 1e3
        print(f"backward d128 8k deterministic={deterministic}: {ms:.2f} ms, {flops / ms / 1e9:.1f} TFLOP/s")


def _no_grad(fn):
    with torch.no_grad():
        return fn()


def _sdpa(q, k, v):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))


if __name__ == "__main__":
    main()
