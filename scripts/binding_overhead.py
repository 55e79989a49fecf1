"""Per-call overhead of the Python binding at a tiny shape, for docs/python-binding.md.

    TILEATTN_LIBRARY=build/src/libtileattn.so PYTHONPATH=python python scripts/binding_overhead.py
    ... --nanobind DIR   also time a nanobind prototype module `nbproto` built in DIR

Prints one table of microseconds per call (best of 7 repeats).  The work inside the library is
the same in every row with the same shape, so differences between rows are binding costs.
"""

import argparse
import ctypes
import importlib
import sys
import timeit

import torch
import torch.nn.functional as F

import tileattn
from tileattn import _ffi, _ops


def best_us(fn, number):
    return min(timeit.repeat(fn, number=number, repeat=7)) / number * 1e6


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--nanobind", help="folder holding the built nbproto extension")
    parser.add_argument("--number", type=int, default=20000)
    args = parser.parse_args()
    torch.set_num_threads(1)  # no OpenMP fork/join in the timings
    n = args.number

    q = torch.randn(1, 1, 1, 8, dtype=torch.float16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    out = torch.empty_like(q)
    lse = torch.empty(1, 1, 1, dtype=torch.float32)
    lib = _ffi.library()
    rows = []

    abi = ctypes.CDLL(str(lib.path)).tileattn_abi_version
    abi.restype = ctypes.c_int
    rows.append(("ctypes: empty C call (tileattn_abi_version)", best_us(abi, n)))

    params = _ffi.FwdParams()

    def fill():
        _ops._fill_forward(params, q, k, v, out, lse, None, batch=1, seqlen_q=1, seqlen_k=1,
                           varlen=False, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None,
                           dropout_p=0.0, softmax_scale=0.35, window_left=-1, window_right=-1,
                           softcap=0.0, alibi_slopes=None, seed=0, offset=0)

    fill()
    forward, byref = lib._forward, ctypes.byref
    rows.append(("ctypes: tileattn_forward, struct pre-filled",
                 best_us(lambda: forward(byref(params)), n)))
    rows.append(("ctypes: fill struct from tensors + tileattn_forward",
                 best_us(lambda: (fill(), forward(byref(params))), n)))

    if args.nanobind:
        sys.path.insert(0, args.nanobind)
        nbproto = importlib.import_module("nbproto")
        rows.append(("nanobind: empty C call (tileattn_abi_version)",
                     best_us(nbproto.abi_version, n)))
        rows.append(("nanobind: tensors via DLPack + fill struct + tileattn_forward",
                     best_us(lambda: nbproto.forward(q, k, v, out, lse, 0.35, -1, -1, 0.0, 0.0,
                                                     0, 0, _ffi.FLOAT16, 1), n)))

    fwd = torch.ops.tileattn.fwd
    rows.append(("custom op torch.ops.tileattn.fwd (allocates outputs)",
                 best_us(lambda: fwd(q, k, v, 0.0, 0.35, -1, -1, 0.0, None, False, False), n // 4)))
    rows.append(("tileattn.flash_attn_func (checks + custom op)",
                 best_us(lambda: tileattn.flash_attn_func(q, k, v), n // 4)))
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    rows.append(("for scale: F.scaled_dot_product_attention, same shape",
                 best_us(lambda: F.scaled_dot_product_attention(qt, kt, vt), n // 4)))

    print(f"torch {torch.__version__}, Python {sys.version.split()[0]}, "
          "shape (1, 1, 1, 8) float16, 1 thread")
    width = max(len(name) for name, _ in rows)
    for name, us in rows:
        print(f"{name:<{width}}  {us:7.2f} us")


if __name__ == "__main__":
    main()
