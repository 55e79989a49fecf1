"""A few small forward + backward calls on CUDA for compute-sanitizer (memcheck / racecheck):
ragged varlen, GQA, causal, head dims off the buckets, deterministic and atomic dQ, the shapes
of the warp-specialized Hopper kernel.

    compute-sanitizer --tool memcheck python3 tests/cuda/sanitize_backward.py
"""
import torch

import tileattn


def run():
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    # The d96 / d128 / d256 cases are the warp-specialized Hopper kernel's (with TILEATTN_BACKWARD_WS=1).
    for b, sq, sk, h, hk, d, causal in [(1, 70, 33, 6, 2, 64, True), (2, 17, 130, 4, 4, 200, False),
                                        (1, 129, 129, 2, 1, 40, True), (2, 150, 300, 4, 2, 128, False),
                                        (1, 200, 200, 2, 2, 128, True), (1, 65, 129, 2, 2, 96, False),
                                        (1, 130, 77, 2, 2, 256, False), (1, 100, 140, 4, 2, 256, True)]:
        q = torch.randn(b, sq, h, d, device=dev, dtype=dt, requires_grad=True)
        k = torch.randn(b, sk, hk, d, device=dev, dtype=dt, requires_grad=True)
        v = torch.randn(b, sk, hk, d, device=dev, dtype=dt, requires_grad=True)
        for deterministic in (False, True):
            out = tileattn.flash_attn_func(q, k, v, causal=causal, deterministic=deterministic)
            out.backward(torch.randn_like(out))
    lens_q, lens_k = [5, 0, 77, 17], [40, 3, 65, 0]
    cu_q = torch.tensor([0, 5, 5, 82, 99], dtype=torch.int32, device=dev)
    cu_k = torch.tensor([0, 40, 43, 108, 108], dtype=torch.int32, device=dev)
    q = torch.randn(99, 4, 96, device=dev, dtype=dt, requires_grad=True)
    k = torch.randn(108, 2, 96, device=dev, dtype=dt, requires_grad=True)
    v = torch.randn(108, 2, 96, device=dev, dtype=dt, requires_grad=True)
    out = tileattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True)
    out.backward(torch.randn_like(out))
    torch.cuda.synchronize()
    print("sanitize_backward: done")


if __name__ == "__main__":
    run()
