"""A few small forward + backward calls on CUDA for compute-sanitizer (memcheck / racecheck):
ragged varlen, GQA, causal, head dims off the buckets, deterministic and atomic dQ, the shapes
of the warp-specialized Hopper kernel; and varlen calls whose cu_seqlens / seqused_k point far
outside the packed tensors, which must read and write nothing out of bounds and give NaN
(sequence_view's in_bounds, src/cuda/index_poison.h).

    compute-sanitizer --tool memcheck python3 tests/cuda/sanitize_backward.py
"""
import torch

import tileattn


def run():
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    # The d96 / d128 / d256 cases are the warp-specialized Hopper kernel's (with TILEATTN_BACKWARD_WS=1);
    # 1030 query rows over 700 keys: a ragged last block on both sides, under auto too.
    for b, sq, sk, h, hk, d, causal in [(1, 70, 33, 6, 2, 64, True), (2, 17, 130, 4, 4, 200, False),
                                        (1, 129, 129, 2, 1, 40, True), (2, 150, 300, 4, 2, 128, False),
                                        (1, 200, 200, 2, 2, 128, True), (1, 65, 129, 2, 2, 96, False),
                                        (1, 130, 77, 2, 2, 256, False), (1, 100, 140, 4, 2, 256, True),
                                        (1, 1030, 700, 2, 1, 128, False)]:
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
    out_of_bounds_indices(dev, dt)
    torch.cuda.synchronize()
    print("sanitize_backward: done")


def out_of_bounds_indices(dev, dt):
    """Over 300 packed rows of sequences of 100 and 200 (max_seqlen 200): entries a million rows
    out, backwards, negative, longer than max_seqlen, and seqused_k past the keys."""
    far = 1 << 20
    cases = [([0, 100, far], [0, 100, 300], None), ([0, far, 300], [0, 100, 300], None),
             ([0, 100, 300], [-far, 100, 300], None), ([0, 250, 100], [0, 100, 300], None),
             ([0, 100, 300], [0, 100, 300], [far, 200]), ([0, 100, 300], [0, 100, 300], [-1, 200])]
    index = lambda values: torch.tensor(values, dtype=torch.int32, device=dev)  # noqa: E731
    for d in (64, 128):
        q = torch.randn(300, 4, d, device=dev, dtype=dt, requires_grad=True)
        k = torch.randn(300, 2, d, device=dev, dtype=dt, requires_grad=True)
        v = torch.randn(300, 2, d, device=dev, dtype=dt, requires_grad=True)
        for cu_q, cu_k, used in cases:
            for causal in (False, True):
                q.grad = k.grad = v.grad = None
                out = tileattn.flash_attn_varlen_func(q, k, v, index(cu_q), index(cu_k), 200, 200, causal=causal,
                                                      seqused_k=None if used is None else index(used))
                out.backward(torch.randn_like(out))
                for x in (out, q.grad, k.grad, v.grad):
                    assert torch.isnan(x).all(), (d, cu_q, cu_k, used, causal)


if __name__ == "__main__":
    run()
