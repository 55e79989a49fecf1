"""Ring attention's forward and backward (an autograd Function over the layouts of _layout.py).

Forward, on rank r of W: the K/V shard travels around the ring; at step i the rank holds the shard
of rank s = r - i (mod W), starts sending it on while it computes its queries against it, and
merges the partial output through the LSEs (_merge.py).

Backward (FA2's Algorithm 2 per step, with the final O and LSE): P = exp(S - LSE) and
D = rowsum(dO * O) of the merged result make each step's dQ, dK, dV exact partial sums.  dQ stays
on the rank; dK and dV of the K/V shard in hand are float32 accumulators that travel with it,
one step behind, and after W hops arrive back at the shard's owner.
"""

import torch

from ._exchange import Ring
from ._merge import as_kernel_lse, as_log_weight, merge
from ._layout import step_plan

_KV_TAG, _GRAD_TAG = 0, 1


def _forward(ring, rows, q, k, v, causal, scale, softcap):
    # Accumulators in the rows' layout: out (rows..., heads, dim), lse (rows..., heads).
    out_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse_acc = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
    kv = (k, v)
    for step in range(ring.size):
        transfer = ring.start(kv, _KV_TAG) if step + 1 < ring.size else None
        q_part, kv_part, step_causal = step_plan(ring.rank, (ring.rank - step) % ring.size, causal)
        rows.select(q_part, kv_part)
        out, lse = rows.forward(rows.take(q, q_part), rows.take(kv[0], kv_part),
                                rows.take(kv[1], kv_part), step_causal, scale, softcap)
        merged = merge(rows.take(out_acc, q_part), rows.take(lse_acc, q_part), out,
                       as_log_weight(rows.lse_to_rows(lse)))
        rows.put(out_acc, q_part, merged[0])
        rows.put(lse_acc, q_part, merged[1])
        if transfer is not None:
            kv = tuple(transfer.wait())
    return out_acc.to(q.dtype), as_kernel_lse(lse_acc)


def _backward(ring, rows, dout, q, k, v, out, lse, causal, scale, softcap, deterministic):
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    dkv = (torch.zeros(k.shape, dtype=torch.float32, device=k.device),
           torch.zeros(v.shape, dtype=torch.float32, device=v.device))
    kv, grads_in_flight = (k, v), None
    for step in range(ring.size):
        transfer = ring.start(kv, _KV_TAG) if step + 1 < ring.size else None
        q_part, kv_part, step_causal = step_plan(ring.rank, (ring.rank - step) % ring.size, causal)
        rows.select(q_part, kv_part)
        dq_part, dk_part, dv_part = rows.backward(
            rows.take(dout, q_part), rows.take(q, q_part), rows.take(kv[0], kv_part),
            rows.take(kv[1], kv_part), rows.take(out, q_part), rows.take_lse(lse, q_part),
            step_causal, scale, softcap, deterministic)
        rows.add(dq, q_part, dq_part.float())
        if grads_in_flight is not None:
            dkv = tuple(grads_in_flight.wait())
        rows.add(dkv[0], kv_part, dk_part.float())
        rows.add(dkv[1], kv_part, dv_part.float())
        if ring.size > 1:
            grads_in_flight = ring.start(dkv, _GRAD_TAG)
        if transfer is not None:
            kv = tuple(transfer.wait())
    if grads_in_flight is not None:
        dkv = tuple(grads_in_flight.wait())
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)


def _working(tensors):
    """The tensors each ring step computes on.  Every step's partial output and gradients are
    summed over the W steps, so a partial rounded to 16 bits adds a rounding per step: with W = 3
    the bf16 dV error already reaches FA's 2 x naive bound.  The CPU backend computes in float32
    whatever its inputs (16-bit inputs are converted once per call), so there the steps take
    float32 inputs and hand back unrounded partials at no extra cost.  The CUDA kernels write
    gradients in the inputs' dtype only; a float32 gradient output for them is still to come."""
    if tensors[0].device.type != "cpu":
        return tensors
    return tuple(t.float() for t in tensors)


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring, rows, causal, scale, softcap, deterministic):
        out, lse = _forward(ring, rows, *_working((q, k, v)), causal, scale, softcap)
        out, lse = out.to(q.dtype), rows.rows_to_lse(lse)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = (ring, rows, causal, scale, softcap, deterministic)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        ring, rows, causal, scale, softcap, deterministic = ctx.options
        dout, wq, wk, wv, out = _working((dout.contiguous(), q, k, v, out))
        dq, dk, dv = _backward(ring, rows, dout, wq, wk, wv, out, lse, causal, scale, softcap,
                               deterministic)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None, None
