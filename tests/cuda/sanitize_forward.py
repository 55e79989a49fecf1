"""Forward calls on CUDA for compute-sanitizer: the shapes that reach the K/V-multicast kernel's
edges when it is forced (TILEATTN_FORWARD_KV_MULTICAST=on): one query block, whose cluster's
second CTA has no rows (seqlen 1 and 17), an odd count of blocks (129 rows at d128, 130 at d256),
d96 in the d128 bucket (columns past head_dim zero-filled), GQA, seqlen_k off the key block and
below it, and an empty key set, each without a mask and causal (bottom-right: with Sq > Sk the
first tiles see no key while their cluster's second tiles do).  Causal calls with ragged tiles start
their first tile above row 0 (sm90_tile_first_row): 17, 129, 130, 300 and 385 rows by one 64-row
consumer, d64's 1000 rows (192-row tiles, no multicast kernel: cluster_sm90.h) by two.  The d64
shapes (seqlen_k off the 64- and 128-key blocks, d48 in the d64 bucket, no keys) are the edges of
the short-walk kernel (64-key blocks, four stages) when it is forced on every call
(TILEATTN_FORWARD_SHORT_WALK=on; short_walk.h).  With the tail split forced
(TILEATTN_FORWARD_TAIL_SPLIT=on; tail_split.h) every non-causal shape with keys runs its tiles cut
into pieces of one to a few key blocks, and the pieces' partial results through the workspace;
the varlen calls (the sequence-bounds kernels) run every tile cut into shares of its own key range
(the key split), sequences without keys or query rows among them.

    TILEATTN_FORWARD_KV_MULTICAST=on compute-sanitizer --tool memcheck python3 tests/cuda/sanitize_forward.py
    TILEATTN_FORWARD_SHORT_WALK=on compute-sanitizer --tool memcheck python3 tests/cuda/sanitize_forward.py
    TILEATTN_FORWARD_TAIL_SPLIT=on compute-sanitizer --tool memcheck python3 tests/cuda/sanitize_forward.py
"""
import itertools

import torch

import tileattn


def run():
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    for b, sq, sk, h, hk, d in [(1, 1, 1, 2, 2, 128), (2, 17, 130, 4, 4, 128), (1, 129, 300, 2, 1, 128),
                                (1, 300, 77, 6, 2, 96), (1, 130, 77, 2, 2, 256), (2, 385, 1000, 7, 1, 128),
                                (1, 1000, 1000, 2, 2, 64), (1, 256, 0, 2, 2, 128), (2, 17, 130, 4, 4, 64),
                                (1, 300, 77, 6, 2, 48), (1, 256, 0, 2, 2, 64)]:
        q = torch.randn(b, sq, h, d, device=dev, dtype=dt)
        k = torch.randn(b, sk, hk, d, device=dev, dtype=dt)
        v = torch.randn(b, sk, hk, d, device=dev, dtype=dt)
        for causal in (False, True):
            out, lse, _ = tileattn.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
            assert torch.isfinite(out).all(), (sq, sk, d, causal)
    for d in (64, 128):
        seqlens_q, seqlens_k = [100, 0, 37, 5], [3000, 700, 0, 129]
        cu_q, cu_k = (torch.tensor([0, *itertools.accumulate(n)], device=dev, dtype=torch.int32)
                      for n in (seqlens_q, seqlens_k))
        q = torch.randn(sum(seqlens_q), 4, d, device=dev, dtype=dt)
        k, v = (torch.randn(sum(seqlens_k), 2, d, device=dev, dtype=dt) for _ in range(2))
        for causal in (False, True):
            out = tileattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(seqlens_q), max(seqlens_k), causal=causal)
            assert torch.isfinite(out).all(), ("varlen", d, causal)
    torch.cuda.synchronize()
    print("sanitize_forward: done")


if __name__ == "__main__":
    run()
