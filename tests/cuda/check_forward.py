#!/usr/bin/env python3
"""Standalone GPU check of the CUDA forward: libtileattn through ctypes against a float64 torch
reference, with FlashAttention's tolerance rule

    max|ours - ref64| <= 2 * max|naive same-precision - ref64| + floor

over odd shapes and every option.  Outputs are poisoned with NaN before each call.  Exits 1 if any
case fails.  Usage: python3 tests/cuda/check_forward.py [path/to/libtileattn.so] [--quick] [--cases=a,b]
"""
import ctypes
import math
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The package's ctypes mirror of tileattn_fwd_params: one copy of the struct layout to keep in sync.
sys.path.insert(0, os.path.join(ROOT, "python"))
from tileattn._ffi import FwdParams  # noqa: E402
args = [a for a in sys.argv[1:] if not a.startswith("--")]
QUICK = "--quick" in sys.argv
# --cases=a,b: run only the cases whose name contains one of these (e.g. under compute-sanitizer).
ONLY = next((a.split("=", 1)[1].split(",") for a in sys.argv[1:] if a.startswith("--cases=")), None)
LIB = ctypes.CDLL(args[0] if args else os.path.join(ROOT, "build-cuda", "src", "libtileattn.so"))
LIB.tileattn_forward.argtypes = [ctypes.POINTER(FwdParams)]
LIB.tileattn_fwd_params_init.argtypes = [ctypes.POINTER(FwdParams)]
LIB.tileattn_fwd_params_size.restype = ctypes.c_int64
LIB.tileattn_last_error.restype = ctypes.c_char_p
LIB.tileattn_last_error_argument.restype = ctypes.c_char_p
assert LIB.tileattn_fwd_params_size() == ctypes.sizeof(FwdParams), "struct mirror out of date"
assert LIB.tileattn_has_cuda() == 1, "library built without CUDA"

DTYPES = {torch.float16: 0, torch.bfloat16: 1}
DEV = "cuda"


def call_forward(*args, **kwargs):
    """Fills the params for these tensors and options, calls tileattn_forward; returns
    (status, error message, error argument)."""
    p = make_params(*args, **kwargs)
    rc = LIB.tileattn_forward(ctypes.byref(p))
    return rc, (LIB.tileattn_last_error() or b"").decode(), (LIB.tileattn_last_error_argument() or b"").decode()


def make_params(q, k, v, out, lse, *, probs=None, cu_q=None, cu_k=None, seqused_k=None,
                max_q=0, max_k=0, scale=None, window=(-1, -1), softcap=0.0, alibi=None,
                dropout_p=0.0, seed=0, offset=0):
    p = FwdParams()
    LIB.tileattn_fwd_params_init(ctypes.byref(p))
    varlen = cu_q is not None
    p.q, p.k, p.v, p.out = q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
        s = t.stride()
        if varlen:
            setattr(p, name + "_batch_stride", 0)
            setattr(p, name + "_row_stride", s[0])
            setattr(p, name + "_head_stride", s[1])
        else:
            setattr(p, name + "_batch_stride", s[0])
            setattr(p, name + "_row_stride", s[1])
            setattr(p, name + "_head_stride", s[2])
    p.softmax_lse = lse.data_ptr()
    if varlen:
        p.lse_batch_stride, p.lse_head_stride = 0, lse.stride(0)
        p.batch = cu_q.numel() - 1
        p.seqlen_q, p.seqlen_k = max_q, max_k
        p.num_heads, p.head_dim = q.shape[1], q.shape[2]
        p.num_heads_k = k.shape[1]
        p.cu_seqlens_q, p.cu_seqlens_k = cu_q.data_ptr(), cu_k.data_ptr()
        p.total_q, p.total_k = q.shape[0], k.shape[0]
    else:
        p.lse_batch_stride, p.lse_head_stride = lse.stride(0), lse.stride(1)
        p.batch, p.seqlen_q, p.num_heads, p.head_dim = q.shape
        p.seqlen_k, p.num_heads_k = k.shape[1], k.shape[2]
    if seqused_k is not None:
        p.seqused_k = seqused_k.data_ptr()
    if probs is not None:
        p.attn_probs = probs.data_ptr()
        p.probs_batch_stride, p.probs_head_stride, p.probs_row_stride = probs.stride()[:3]
    p.softmax_scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    p.window_left, p.window_right = window
    p.softcap = softcap
    if alibi is not None:
        p.alibi_slopes = alibi.data_ptr()
        p.alibi_batch_stride = alibi.shape[-1] if alibi.dim() == 2 else 0
    p.dropout_p = dropout_p
    p.philox_seed, p.philox_offset = seed, offset
    p.dtype = DTYPES[q.dtype]
    p.device = 1
    p.stream = torch.cuda.current_stream().cuda_stream
    return p


# ---- reference ---------------------------------------------------------------------------------
M0, M1, W0, W1, MASK = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85, 0xFFFFFFFF


def philox_keep(seed, offset, b, h, H, rows, cols, p):
    """common/philox.h's dropout_keep for a (rows, cols) grid, in int64 torch arithmetic."""
    r = torch.arange(rows, device=DEV, dtype=torch.int64)[:, None].expand(rows, cols)
    c = torch.arange(cols, device=DEV, dtype=torch.int64)[None, :].expand(rows, cols)
    stream = offset + b * H + h
    c0, c1 = (c >> 4) * 4 + ((c & 7) >> 1), (r >> 4) * 8 + (r & 7)
    c2 = torch.full_like(r, stream & MASK)
    c3 = torch.full_like(r, (stream >> 32) & MASK)
    k0, k1 = seed & MASK, (seed >> 32) & MASK
    for _ in range(7):  # common/philox.h's kDropoutPhiloxRounds
        p0, p1 = c0 * M0, c2 * M1  # < 2^64: wraps in int64, low/high words stay exact
        hi0, lo0 = (p0 >> 32) & MASK, p0 & MASK
        hi1, lo1 = (p1 >> 32) & MASK, p1 & MASK
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + W0) & MASK, (k1 + W1) & MASK
    slot = ((r >> 3) & 1) * 4 + ((c >> 3) & 1) * 2 + (c & 1)
    words = torch.stack([c0, c1, c2, c3], -1).gather(-1, (slot >> 1)[..., None])[..., 0]
    draws = torch.where((slot & 1) == 1, words >> 16, words & 0xFFFF)
    scaled = float(torch.tensor(p, dtype=torch.float32).item()) * 65536.0
    threshold = 65536 if scaled >= 65536.0 else int(scaled)
    return draws >= threshold


def reference(q, k, v, *, scale, window, softcap, alibi_row, dropout_p, keep, dtype):
    """One sequence, all heads: q (Sq, H, D), k/v (Sk, Hk, D).  Returns (out, lse, probs) in float64
    and the naive same-precision (out, lse)."""
    Sq, H, D = q.shape
    Sk, Hk = k.shape[0], k.shape[1]
    rep = H // Hk
    kk, vv = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    i = torch.arange(Sq, device=DEV)[:, None]
    j = torch.arange(Sk, device=DEV)[None, :]
    diag = i + Sk - Sq
    visible = torch.ones(Sq, Sk, dtype=torch.bool, device=DEV)
    if window[1] >= 0:
        visible &= j <= diag + window[1]
    if window[0] >= 0:
        visible &= j >= diag - window[0]

    def scores(qx, kx):
        s = torch.einsum("qhd,khd->hqk", qx, kx) * scale
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        if alibi_row is not None:
            s = s - alibi_row.to(s.dtype)[:, None, None] * (diag - j).abs().to(s.dtype)
        return s.masked_fill(~visible, float("-inf"))

    def finish(s, vx):
        lse = torch.logsumexp(s.double(), -1)
        prob = torch.softmax(s, -1).nan_to_num(0.0)
        dropped = prob
        if dropout_p > 0:
            dropped = prob * keep.to(prob.dtype) / (1 - dropout_p)
        out = torch.einsum("hqk,khd->qhd", dropped, vx)
        return out, lse, prob

    out64, lse64, prob64 = finish(scores(q.double(), kk.double()), vv.double())
    lse64 = torch.where(visible.any(-1)[None, :], lse64, torch.full_like(lse64, float("inf")))
    out_lp, lse_lp, _ = finish(scores(q, kk), vv)
    return out64, lse64, prob64, out_lp, lse_lp


# ---- one case ----------------------------------------------------------------------------------
FAILURES = []


def check_case(name, *, B=2, Sq=17, Sk=17, H=4, Hk=None, D=64, dtype=torch.bfloat16, window=(-1, -1),
               softcap=0.0, alibi=None, dropout_p=0.0, varlen=None, seqused=None, layout="contiguous",
               probs=False, scale=None, misalign=False):
    Hk = Hk or H
    if ONLY is not None and not any(o in name for o in ONLY):
        return
    torch.manual_seed(sum(map(ord, name)))
    if varlen is not None:
        lens_q, lens_k = varlen
        B = len(lens_q)
        tq, tk = sum(lens_q), sum(lens_k)
        q = torch.randn(tq, H, D, device=DEV, dtype=dtype)
        k = torch.randn(tk, Hk, D, device=DEV, dtype=dtype)
        v = torch.randn(tk, Hk, D, device=DEV, dtype=dtype)
        cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), device=DEV, dtype=torch.int32)
        cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), device=DEV, dtype=torch.int32)
        out = torch.full((tq, H, D), float("nan"), device=DEV, dtype=dtype)
        lse = torch.full((H, tq), float("nan"), device=DEV, dtype=torch.float32)
        max_q, max_k = max(lens_q), max(lens_k)
    else:
        if layout == "packed":  # q, k, v views into one (B, S, 3, H, D) tensor
            assert Sq == Sk and H == Hk
            qkv = torch.randn(B, Sq, 3, H, D, device=DEV, dtype=dtype)
            q, k, v = qkv.unbind(2)
        elif layout == "bhsd":  # (B, H, S, D) storage seen as (B, S, H, D)
            q = torch.randn(B, H, Sq, D, device=DEV, dtype=dtype).transpose(1, 2)
            k = torch.randn(B, Hk, Sk, D, device=DEV, dtype=dtype).transpose(1, 2)
            v = torch.randn(B, Hk, Sk, D, device=DEV, dtype=dtype).transpose(1, 2)
        else:
            q = torch.randn(B, Sq, H, D, device=DEV, dtype=dtype)
            k = torch.randn(B, Sk, Hk, D, device=DEV, dtype=dtype)
            v = torch.randn(B, Sk, Hk, D, device=DEV, dtype=dtype)
        if misalign:  # storage offset of one element: pointers not 16-byte aligned
            q = torch.randn(q.numel() + 1, device=DEV, dtype=dtype)[1:].view(q.shape)
        out = torch.full((B, Sq, H, D), float("nan"), device=DEV, dtype=dtype)
        lse = torch.full((B, H, Sq), float("nan"), device=DEV, dtype=torch.float32)
        cu_q = cu_k = None
        max_q, max_k = Sq, Sk
        lens_q, lens_k = [Sq] * B, [Sk] * B
    used_k = None
    if seqused is not None:
        used_k = torch.tensor(seqused, device=DEV, dtype=torch.int32)
        # Keys past seqused_k are never read: NaN there must not reach the output.
        start = 0
        for b, used in enumerate(seqused):
            rows = slice(start + used, start + lens_k[b]) if varlen is not None else (b, slice(used, None))
            k[rows] = float("nan")
            v[rows] = float("nan")
            start += lens_k[b] if varlen is not None else 0
    prob_t = None
    if probs:
        prob_t = torch.full((B, H, max_q, max_k), float("nan"), device=DEV, dtype=torch.float32)
    seed, offset = 1234567890123, 77
    rc, msg, arg = call_forward(q, k, v, out, lse, probs=prob_t, cu_q=cu_q, cu_k=cu_k, seqused_k=used_k,
                                max_q=max_q, max_k=max_k, scale=scale, window=window, softcap=softcap,
                                alibi=alibi, dropout_p=dropout_p, seed=seed, offset=offset)
    torch.cuda.synchronize()
    if rc != 0:
        FAILURES.append(name)
        print(f"FAIL {name}: rc={rc} {arg}: {msg}")
        return
    sc = scale if scale is not None else 1.0 / math.sqrt(D)
    worst = {"o": 0.0, "o_tol": 0.0, "lse": 0.0, "lse_tol": 0.0}
    ok = True
    qs = ks = 0
    for b in range(B):
        lq, lk = lens_q[b], lens_k[b]
        lk_used = seqused[b] if seqused is not None else lk
        if varlen is not None:
            qb, kb, vb = q[qs:qs + lq], k[ks:ks + lk_used], v[ks:ks + lk_used]
            ob, lb = out[qs:qs + lq], lse[:, qs:qs + lq]
        else:
            qb, kb, vb, ob, lb = q[b], k[b, :lk_used], v[b, :lk_used], out[b], lse[b]
        qs, ks = qs + lq, ks + lk
        if lq == 0:
            continue
        arow = None
        if alibi is not None:
            arow = alibi[b] if alibi.dim() == 2 else alibi
        keep = None
        if dropout_p > 0:
            keep = torch.stack([philox_keep(seed, offset, b, h, H, lq, lk_used, dropout_p) for h in range(H)])
        o64, l64, p64, olp, llp = reference(qb, kb, vb, scale=sc, window=window, softcap=softcap,
                                            alibi_row=arow, dropout_p=dropout_p, keep=keep, dtype=dtype)
        floor = 2 * (o64.to(dtype).double() + 0.3 - 0.3 - o64).abs().max().item() + 1e-5
        o_err = (ob.double() - o64).abs().max().item() if ob.numel() else 0.0
        o_tol = 2 * (olp.double() - o64).abs().max().item() + floor
        inf_rows = torch.isinf(l64)
        lb = lb.double()
        if not torch.equal(torch.isinf(lb) & (lb > 0), inf_rows):
            ok = False
            print(f"  {name} b={b}: +inf LSE rows differ from the rows with no visible key")
        fin = ~inf_rows
        l_err = (lb[fin] - l64[fin]).abs().max().item() if fin.any() else 0.0
        l_tol = 2 * (llp.double()[fin] - l64[fin]).abs().max().item() + 1e-3 if fin.any() else 1e-3
        if torch.isnan(ob).any() or torch.isnan(lb).any():
            ok = False
            print(f"  {name} b={b}: NaN left in the outputs")
        empty_rows = inf_rows.all(0)
        if empty_rows.any() and ob[empty_rows].abs().max().item() != 0:
            ok = False
            print(f"  {name} b={b}: rows with no visible key are not 0")
        ok &= o_err <= o_tol and l_err <= l_tol
        worst["o"], worst["o_tol"] = max(worst["o"], o_err), max(worst["o_tol"], o_tol)
        worst["lse"], worst["lse_tol"] = max(worst["lse"], l_err), max(worst["lse_tol"], l_tol)
        if probs:
            pb = prob_t[b, :, :lq, :lk_used].double()
            expect = p64 * (torch.where(keep, 1.0, -1.0) if keep is not None else 1.0)
            p_err = (pb - expect).abs().max().item() if pb.numel() else 0.0
            rest_zero = prob_t[b, :, lq:, :].abs().sum().item() == 0 and prob_t[b, :, :, lk_used:].abs().sum().item() == 0
            if p_err > 1e-4 or not rest_zero:
                ok = False
                print(f"  {name} b={b}: attn_probs err {p_err:.2e}, padding zero: {rest_zero}")
    status = "PASS" if ok else "FAIL"
    if not ok:
        FAILURES.append(name)
    print(f"{status} {name}: O err {worst['o']:.2e} <= tol {worst['o_tol']:.2e}; "
          f"LSE err {worst['lse']:.2e} <= tol {worst['lse_tol']:.2e}", flush=True)


def main():
    print("GPU:", torch.cuda.get_device_name(), "| struct", ctypes.sizeof(FwdParams), "bytes")
    bf, fp = torch.bfloat16, torch.float16
    check_case("seqlen 1", B=1, Sq=1, Sk=1, H=2, D=64)
    check_case("17x17 d64", Sq=17, Sk=17, D=64)
    for d in (40, 64, 72, 96, 128, 200, 256):
        check_case(f"d{d} 127x1000 gqa7", B=2, Sq=127, Sk=1000, H=7, Hk=1, D=d)
        check_case(f"d{d} 1000x127 causal", B=1, Sq=1000, Sk=127, H=2, Hk=2, D=d, window=(-1, 0))
    check_case("d32 bucket", B=2, Sq=300, Sk=300, H=3, D=32, window=(-1, 0))
    check_case("d160 -> 192 bucket", B=1, Sq=200, Sk=333, H=2, D=160)
    check_case("fp16 d128 causal", B=2, Sq=1000, Sk=1000, H=4, D=128, dtype=fp, window=(-1, 0))
    check_case("fp16 d64 127x1000", B=2, Sq=127, Sk=1000, H=4, D=64, dtype=fp)
    check_case("causal Sq<Sk", B=2, Sq=127, Sk=1000, H=4, D=128, window=(-1, 0))
    check_case("causal Sq>Sk (empty rows)", B=2, Sq=1000, Sk=127, H=4, D=64, window=(-1, 0))
    check_case("window (50, 10)", B=2, Sq=1000, Sk=1000, H=4, D=128, window=(50, 10))
    check_case("window left 200 only", B=1, Sq=700, Sk=900, H=2, D=64, window=(200, -1))
    check_case("window (0, 0)", B=1, Sq=300, Sk=300, H=2, D=64, window=(0, 0))
    check_case("window (5, 3) Sq>Sk", B=1, Sq=500, Sk=100, H=2, D=64, window=(5, 3))
    # End-aligned tiles under right-edged masks (sm90_tile_first_row): the first tile starts with one
    # or two 64-row padding consumers (d64's 192-row tiles at 512, 1000 and 1024 rows; 128-row tiles
    # at 300), in batch and varlen form, with dropout (rows keep their absolute Philox offsets).
    for sq, sk in ((512, 512), (1024, 1024), (1000, 1000), (1000, 700), (300, 1300)):
        check_case(f"d64 causal {sq}x{sk} end-aligned tiles", B=1, Sq=sq, Sk=sk, H=2, D=64, window=(-1, 0))
    check_case("d128 causal 300 end-aligned tiles", B=1, Sq=300, Sk=300, H=2, D=128, window=(-1, 0))
    check_case("d256 window (100, 40) 600x600", B=1, Sq=600, Sk=600, H=2, D=256, window=(100, 40))
    check_case("d64 varlen causal end-aligned", H=2, D=64, varlen=([512, 1000, 64, 129], [512, 1100, 64, 300]),
               window=(-1, 0))
    check_case("d64 dropout causal 512", B=1, Sq=512, Sk=512, H=2, D=64, dropout_p=0.2, window=(-1, 0))
    check_case("softcap 30", B=2, Sq=257, Sk=513, H=4, D=128, softcap=30.0, scale=0.5)
    check_case("softcap causal d256", B=1, Sq=300, Sk=300, H=2, D=256, softcap=5.0, window=(-1, 0))
    slopes = torch.rand(4, device=DEV) * 0.5
    check_case("alibi (H)", B=2, Sq=300, Sk=500, H=4, D=64, alibi=slopes)
    check_case("alibi (B,H) causal", B=2, Sq=500, Sk=300, H=4, D=128, alibi=torch.rand(2, 4, device=DEV),
               window=(-1, 0))
    check_case("negative scale", B=1, Sq=100, Sk=130, H=2, D=64, scale=-0.1)
    check_case("dropout 0.17", B=2, Sq=129, Sk=257, H=3, D=64, dropout_p=0.17)
    check_case("dropout causal d128 + probs", B=2, Sq=200, Sk=200, H=2, D=128, dropout_p=0.3,
               window=(-1, 0), probs=True)
    check_case("probs softcap alibi", B=2, Sq=65, Sk=97, H=2, D=64, softcap=20.0, alibi=slopes[:2], probs=True)
    check_case("varlen (0-length seq)", H=4, Hk=2, D=128, varlen=([5, 0, 300, 129], [7, 3, 0, 400]),
               window=(-1, 0))
    check_case("varlen plain d64", H=4, D=64, varlen=([1, 17, 1000, 2], [1000, 17, 1, 2]))
    check_case("varlen seqused_k + probs", H=2, D=64, varlen=([30, 200], [100, 300]), seqused=[50, 0],
               probs=True)
    check_case("batch seqused_k", B=3, Sq=100, Sk=300, H=2, D=64, seqused=[300, 1, 150], window=(-1, 0))
    check_case("packed qkv", B=2, Sq=333, Sk=333, H=4, D=128, layout="packed", window=(-1, 0))
    check_case("bhsd strides", B=2, Sq=200, Sk=300, H=4, Hk=2, D=64, layout="bhsd")
    check_case("misaligned q (fallback)", B=1, Sq=100, Sk=100, H=2, D=64, misalign=True, window=(-1, 0))
    check_case("d33 (fallback)", B=2, Sq=77, Sk=99, H=2, D=33, window=(20, 5))
    check_case("fallback + dropout", B=1, Sq=65, Sk=80, H=2, D=36, dropout_p=0.25)
    if not QUICK:
        check_case("4k causal d128", B=1, Sq=4096, Sk=4096, H=4, D=128, window=(-1, 0))
        check_case("2k d256", B=1, Sq=2048, Sk=2048, H=4, D=256)
    # A host pointer must be refused, not crash.
    qh = torch.randn(1, 8, 1, 64, dtype=bf)
    d = torch.randn(1, 8, 1, 64, device=DEV, dtype=bf)
    o = torch.empty_like(d)
    l = torch.empty(1, 1, 8, device=DEV)
    rc, msg, arg = call_forward(qh, d, d, o, l)
    print(("PASS" if rc != 0 else "FAIL") + f" host pointer refused: rc={rc} arg={arg!r} {msg}")
    if rc == 0:
        FAILURES.append("host pointer")
    print("FAILED:" if FAILURES else "ALL PASSED", ", ".join(FAILURES))
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
