"""tileattn's main job: one realistic training step of attention, forward and backward.

B=2, S=2048, H=16, D=64, causal, on the GPU in bf16 when tileattn has a CUDA backend and a GPU
is present, else on the CPU backend in float32.  It checks a slice of the output and of dQ against
a float64 reference and prints time and throughput by FlashAttention's FLOP count
(4 B H S^2 D / 2 for causal; backward 2.5x the forward).
"""

import argparse
import time

import torch

import tileattn


def reference_rows(q, k, v, dout, rows, causal):
    """float64 out and dq for query rows `rows` of batch 0, head 0..1 (dq of a row needs only it)."""
    qs = q[0, rows, :2].double().detach().requires_grad_()
    ks, vs = k[0, :, :2].double(), v[0, :, :2].double()
    scores = torch.einsum("ihd,jhd->hij", qs, ks) / q.shape[-1] ** 0.5
    if causal:
        seqlen_q, seqlen_k = q.shape[1], k.shape[1]
        i = torch.arange(seqlen_q)[rows].unsqueeze(1)
        j = torch.arange(seqlen_k).unsqueeze(0)
        scores = scores.masked_fill(j > i + seqlen_k - seqlen_q, float("-inf"))
    out = torch.einsum("hij,jhd->ihd", scores.softmax(-1), vs)
    out.backward(dout[0, rows, :2].double())
    return out.detach(), qs.grad


def timed(fn, device, repeats):
    fn()  # warm-up
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seqlen", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--headdim", type=int, default=64)
    parser.add_argument("--no-causal", dest="causal", action="store_false")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    args = parser.parse_args()

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() and tileattn.has_cuda() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    repeats = 20 if device == "cuda" else 2
    torch.manual_seed(0)
    shape = (args.batch, args.seqlen, args.heads, args.headdim)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    dout = torch.randn(shape, device=device, dtype=dtype)

    out = tileattn.flash_attn_func(q, k, v, causal=args.causal)
    out.backward(dout)
    rows = slice(args.seqlen - 64, args.seqlen)
    ref_out, ref_dq = reference_rows(q.cpu(), k.cpu(), v.cpu(), dout.cpu(), rows, args.causal)
    out_err = (out[0, rows, :2].double().cpu() - ref_out).abs().max().item()
    dq_err = (q.grad[0, rows, :2].double().cpu() - ref_dq).abs().max().item()
    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-4
    status = "ok" if max(out_err, dq_err) < tolerance else "MISMATCH"

    def forward():
        return tileattn.flash_attn_func(q, k, v, causal=args.causal)

    def forward_backward():
        q.grad = k.grad = v.grad = None
        forward().backward(dout)

    t_fwd = timed(forward, device, repeats)
    t_both = timed(forward_backward, device, repeats)
    flops = 4 * args.batch * args.heads * args.seqlen**2 * args.headdim / (2 if args.causal else 1)
    unit, scale = ("TFLOP/s", 1e12) if device == "cuda" else ("GFLOP/s", 1e9)
    print(f"tileattn {tileattn.__version__} on {device} ({dtype}), library {tileattn.library_path()}")
    print(f"shape B={args.batch} S={args.seqlen} H={args.heads} D={args.headdim} causal={args.causal}")
    print(f"check vs float64 on a slice: out err {out_err:.2e}, dq err {dq_err:.2e} -> {status}")
    print(f"forward          {t_fwd * 1e3:9.2f} ms  {flops / t_fwd / scale:8.1f} {unit}")
    print(f"forward+backward {t_both * 1e3:9.2f} ms  {3.5 * flops / t_both / scale:8.1f} {unit}")
    if status != "ok":
        raise SystemExit(1)


if __name__ == "__main__":
    main()
