"""Standalone GPU check of the CUDA backward (tileattn::bwd / varlen_bwd on CUDA tensors) against
float64, with FA's rule: error(ours) <= 2 x error(naive same-precision) + floor, for dQ, dK, dV;
plus bitwise determinism of deterministic=True.  The forward's out and LSE come from the float64
reference, so this checks the backward alone.

    TILEATTN_LIBRARY=build-cuda/src/libtileattn.so PYTHONPATH=python:tests/python \
        python3 tests/cuda/check_backward.py
"""

import sys

import torch

import tileattn  # noqa: F401  (registers torch.ops.tileattn)
from attn_reference import attention, dropout_keep

FLOOR = 1e-3


def max_err(x, ref):
    return (x.double() - ref.double()).abs().max().item() if x.numel() else 0.0


def check(name, grads, exact, naive):
    ok = True
    for key, ours in zip(("dq", "dk", "dv"), grads):
        e, n = max_err(ours, exact[key]), max_err(naive[key], exact[key])
        good = e <= 2 * n + FLOOR and torch.isfinite(ours).all().item()
        ok &= good
        print(f"  {name:<40} {key}: ours {e:.2e} naive {n:.2e} {'ok' if good else 'FAIL'}")
    return ok


def batch_case(name, b, sq, sk, h, hk, d, dtype, causal=False, window=(-1, -1), softcap=0.0,
               alibi=None, dropout_p=0.0):
    dev = "cuda"
    q = torch.randn(b, sq, h, d, device=dev, dtype=dtype)
    k = torch.randn(b, sk, hk, d, device=dev, dtype=dtype)
    v = torch.randn(b, sk, hk, d, device=dev, dtype=dtype)
    dout = torch.randn(b, sq, h, d, device=dev, dtype=dtype)
    left, right = window
    if causal:
        right = 0
    slopes = None
    if alibi == "H":
        slopes = torch.rand(h, device=dev, dtype=torch.float32)
    elif alibi == "BH":
        slopes = torch.rand(b, h, device=dev, dtype=torch.float32)
    seed, offset = 1234567, 8
    keep = None
    if dropout_p > 0:
        keep = dropout_keep(seed, offset, b, h, sq, sk, dropout_p).to(dev)
    opts = dict(window_left=left, window_right=right, softcap=softcap, alibi_slopes=slopes,
                keep=keep, dropout_p=dropout_p)
    exact = attention(q, k, v, dout, dtype=torch.float64, **opts)
    naive = attention(q, k, v, dout, dtype=dtype, **opts)
    out = exact["out"].to(dtype)
    lse = exact["lse"].float().contiguous()
    rng = torch.tensor([seed, offset], dtype=torch.int64)
    ok = True
    results = []
    for deterministic in (False, True, True):
        grads = torch.ops.tileattn.bwd(dout, q, k, v, out, lse, dropout_p, d ** -0.5, left, right,
                                       softcap, slopes, deterministic, rng)
        results.append(grads)
        ok &= check(f"{name} det={deterministic}", grads, exact, naive)
    same = all(torch.equal(x, y) for x, y in zip(results[1], results[2]))
    print(f"  {name:<40} deterministic runs bitwise equal: {same}")
    return ok and same


def varlen_case(dtype):
    dev = "cuda"
    lens_q, lens_k = [5, 0, 130, 17], [40, 3, 129, 0]
    h, hk, d = 4, 2, 64
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32, device=dev)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32, device=dev)
    tq, tk = sum(lens_q), sum(lens_k)
    q = torch.randn(tq, h, d, device=dev, dtype=dtype)
    k = torch.randn(tk, hk, d, device=dev, dtype=dtype)
    v = torch.randn(tk, hk, d, device=dev, dtype=dtype)
    dout = torch.randn(tq, h, d, device=dev, dtype=dtype)
    out = torch.empty_like(q)
    lse = torch.empty(h, tq, device=dev, dtype=torch.float32)
    exact_parts, naive_parts = [], []
    for i in range(len(lens_q)):
        sl_q = slice(int(cu_q[i]), int(cu_q[i + 1]))
        sl_k = slice(int(cu_k[i]), int(cu_k[i + 1]))
        args = (q[sl_q][None], k[sl_k][None], v[sl_k][None], dout[sl_q][None])
        e = attention(*args, dtype=torch.float64, window_right=0)
        nv = attention(*args, dtype=dtype, window_right=0)
        out[sl_q] = e["out"][0].to(dtype)
        lse[:, sl_q] = e["lse"][0].float()
        exact_parts.append(e)
        naive_parts.append(nv)
    exact = {key: torch.cat([p[key][0] for p in exact_parts]) for key in ("dq",)}
    naive = {key: torch.cat([p[key][0] for p in naive_parts]) for key in ("dq",)}
    for key in ("dk", "dv"):
        exact[key] = torch.cat([p[key][0] for p in exact_parts])
        naive[key] = torch.cat([p[key][0] for p in naive_parts])
    rng = torch.tensor([0, 0], dtype=torch.int64)
    ok = True
    for deterministic in (False, True):
        grads = torch.ops.tileattn.varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, None,
                                              max(lens_q), max(lens_k), 0.0, d ** -0.5, -1, 0, 0.0,
                                              None, deterministic, rng)
        ok &= check(f"varlen causal gqa {dtype} det={deterministic}", grads, exact, naive)
    return ok


def main():
    torch.manual_seed(0)
    bf, fp = torch.bfloat16, torch.float16
    cases = [
        ("plain d64", 2, 128, 128, 4, 4, 64, bf, {}),
        ("causal gqa7 d128 sq<sk", 1, 127, 300, 14, 2, 128, fp, dict(causal=True)),
        ("causal mqa d256 sq>sk", 2, 300, 127, 4, 1, 256, bf, dict(causal=True)),
        ("window d40 s1000", 1, 1000, 1000, 2, 2, 40, bf, dict(window=(100, 20))),
        ("softcap alibiBH d96", 2, 77, 140, 4, 2, 96, fp, dict(softcap=5.0, alibi="BH")),
        ("dropout alibiH d200", 2, 129, 200, 4, 4, 200, bf, dict(dropout_p=0.17, alibi="H")),
        # dropout in the warp-specialized kernel: under auto from 1024 rows, and forced
        # (TILEATTN_BACKWARD_WS=1) for the causal GQA case with seqlen_q != seqlen_k
        ("dropout d128 s1100", 1, 1100, 1100, 4, 4, 128, bf, dict(dropout_p=0.2)),
        ("dropout causal gqa d96 sq<sk", 2, 300, 520, 4, 2, 96, fp, dict(dropout_p=0.1, causal=True)),
        # d64 at >= 1000 rows in the warp-specialized kernel's d64 bucket (one consumer computes a
        # block's whole dQ, the two taking turns): under auto a head dim below the bucket with
        # seqlen_q > seqlen_k, and 7 query heads a KV head with seqlen_q < seqlen_k and a last query
        # block of 40 rows; when forced also GQA dropout (dK, dV through the expanded buffers) and
        # a causal window, which auto leaves to the FA2-structured kernel (d <= 64 with dropout; a
        # right-bounded window under 2048 rows)
        ("dropout gqa d64 s1300", 1, 1300, 1300, 4, 2, 64, fp, dict(dropout_p=0.15)),
        ("plain d48 sq>sk", 2, 1100, 700, 4, 4, 48, bf, {}),
        ("window d64 s1030", 1, 1030, 1030, 4, 4, 64, bf, dict(window=(200, 0))),
        ("plain gqa7 d64 sq<sk", 1, 1000, 1300, 14, 2, 64, fp, {}),
        ("seqlen1 d72", 1, 1, 1, 2, 2, 72, bf, {}),
        ("seqlen17 d72", 1, 17, 17, 2, 2, 72, fp, {}),
        # head_dim % 8 != 0: rows are not 16-byte aligned, so the WMMA fallback runs
        ("fallback causal gqa d36", 2, 77, 90, 4, 2, 36, bf, dict(causal=True)),
        # 1024 CTAs, several waves: deterministic turns must not deadlock or reorder
        ("causal gqa many CTAs d64", 4, 2048, 2048, 16, 4, 64, bf, dict(causal=True)),
        ("window many CTAs d256", 2, 1500, 1500, 8, 8, 256, fp, dict(window=(300, 100))),
        # no mask: rotated walks, deterministic turns in arrival order (bwd_walk_order.h), with
        # more key blocks than query blocks (8 vs 5) and the reverse (3 vs 16)
        ("plain gqa d128 sq<sk", 2, 300, 1000, 4, 2, 128, bf, {}),
        ("plain d128 sq>sk", 2, 1000, 300, 4, 4, 128, fp, {}),
        # 4096 query rows: the warp-specialized kernel under auto (d128), several waves of 32
        # CTAs a head; d256 has 64 key blocks a head, past the rotated turns' limit (66 on the H200)
        ("plain many CTAs d128 s4096", 1, 4096, 4096, 8, 8, 128, bf, {}),
        # the warp-specialized kernel under auto (unmasked, from 512 rows): a last query block of 12
        # rows with 7 query heads a KV head and seqlen_q > seqlen_k, and d96 in the 128 bucket
        # (columns 96-127 zero-filled on load, never stored)
        ("plain gqa7 d128 sq>sk", 1, 1100, 900, 14, 2, 128, fp, {}),
        ("plain d96 s1030", 1, 1030, 1030, 4, 4, 96, bf, {}),
        ("plain gqa many CTAs d256 s4096", 1, 4096, 4096, 4, 2, 256, bf, {}),
        # deterministic causal walks up from the diagonal with the grid reversed: 141 key blocks a
        # head, more than the H200's 132 SMs hold at once
        ("causal long d256 s9000", 1, 9000, 9000, 2, 2, 256, bf, dict(causal=True)),
        # d256 in the column-split warp-specialized kernel (forced, or under auto from 512 rows):
        # dK, dV by TMA store with ragged last blocks (seqlen_q > seqlen_k), and dropout
        ("plain d256 sq>sk", 2, 700, 333, 4, 4, 256, bf, {}),
        ("dropout d256 s600", 1, 600, 600, 2, 2, 256, fp, dict(dropout_p=0.1)),
        # a head dim inside the bucket: TMA zero-fills columns 200-255, dQ keeps the bucket's pitch
        ("plain d200 sq<sk", 1, 100, 250, 2, 2, 200, bf, {}),
        # the same walk in the warp-specialized kernel when it is forced (TILEATTN_BACKWARD_WS=1)
        ("causal d128 s600", 2, 600, 600, 4, 4, 128, bf, dict(causal=True)),
    ]
    ok = True
    for name, b, sq, sk, h, hk, d, dtype, opts in cases:
        ok &= batch_case(name, b, sq, sk, h, hk, d, dtype, **opts)
    ok &= varlen_case(bf)
    print("BACKWARD CHECK", "PASSED" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
