"""Ring attention (context parallelism) over torch.distributed.

    out = ring_flash_attn_func(q, k, v, group, causal=True)

Each rank of `group` holds a shard of the sequence: q (batch, seqlen_local, nheads, headdim) and
k, v (batch, seqlen_local, nheads_k, headdim), every rank's shards of one shape.  The K/V shards
travel around the ring with send/recv (NCCL on GPUs, gloo on CPUs), each hop overlapped with the
local attention, and partial outputs merge through their log-sum-exps.  With causal=True the
shards must be zigzag shards (zigzag_shard / zigzag_shard_varlen), which give every rank the same
work at every step; without causal any sharding works.  The backward rotates dK/dV back to their
owners.  out equals attention over the whole sequence, sharded the same way.
"""

import torch
import torch.distributed as dist

from .._checks import Checker
from .._ffi import InvalidArgumentError
from ._attention import RingAttention
from ._exchange import Ring
from ._layout import BatchRows, PackedRows
from ._shards import zigzag_shard, zigzag_shard_varlen, zigzag_unshard, zigzag_unshard_varlen

__all__ = ["ring_flash_attn_func", "ring_flash_attn_varlen_func", "zigzag_shard",
           "zigzag_unshard", "zigzag_shard_varlen", "zigzag_unshard_varlen"]


def _common(function, q, k, v, group, dropout_p, softmax_scale, window_size, softcap,
            alibi_slopes, seq_dim):
    """Checks what both forms share; returns (checker, ring, softmax_scale, softcap)."""
    check = Checker(function)
    names = ("q", "k", "v")
    layout = ("(batch, seqlen_local, nheads, headdim)" if seq_dim == 1
              else "(total_local, nheads, headdim)")
    for name, x in zip(names, (q, k, v)):
        check.dims(x, name, 4 if seq_dim == 1 else 3, layout)
    if not dist.is_available() or not dist.is_initialized():
        check.fail(InvalidArgumentError, "group",
                   "torch.distributed is not initialized (call init_process_group first)")
    check.dtype_and_device(list(zip(names, (q, k, v))))
    check.heads(q, k, v, names, seq_dim=seq_dim)
    if dropout_p != 0.0:
        check.fail(InvalidArgumentError, "dropout_p", "dropout is not supported by ring attention")
    if tuple(window_size) != (-1, -1):
        check.fail(InvalidArgumentError, "window_size",
                   "sliding windows are not supported by ring attention")
    if alibi_slopes is not None:
        check.fail(InvalidArgumentError, "alibi_slopes", "ALiBi is not supported by ring attention")
    _, scale, _, _, softcap = check.options(0.0, softmax_scale, (-1, -1), softcap, q.shape[-1])
    return check, Ring(group), scale, softcap


def ring_flash_attn_func(q, k, v, group=None, dropout_p=0.0, softmax_scale=None, causal=False,
                         window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                         deterministic=False, return_softmax_lse=False):
    """Attention over a sequence sharded across the ranks of `group` (None: the default group).
    Returns out (this rank's rows), and with return_softmax_lse=True (out, lse (batch, nheads,
    seqlen_local))."""
    check, ring, scale, softcap = _common("ring_flash_attn_func", q, k, v, group, dropout_p,
                                          softmax_scale, window_size, softcap, alibi_slopes,
                                          seq_dim=1)
    if causal and (k.shape[1] != q.shape[1] or q.shape[1] % 2 != 0):
        check.fail(InvalidArgumentError, "k" if k.shape[1] != q.shape[1] else "q",
                   "causal ring attention needs zigzag shards: q and k of one even local length, "
                   f"got {q.shape[1]} and {k.shape[1]}")
    out, lse = RingAttention.apply(q, k, v, ring, BatchRows(q.shape[1]), bool(causal), scale,
                                   softcap, bool(deterministic))
    return (out, lse) if return_softmax_lse else out


def ring_flash_attn_varlen_func(q, k, v, cu_seqlens, max_seqlen, group=None, dropout_p=0.0,
                                softmax_scale=None, causal=False, window_size=(-1, -1),
                                softcap=0.0, alibi_slopes=None, deterministic=False,
                                return_softmax_lse=False):
    """The packed form: q (total_local, nheads, headdim), k/v (total_local, nheads_k, headdim),
    every sequence sharded across the ranks (zigzag_shard_varlen), cu_seqlens (batch + 1,) int32
    the local prefix sums (the same on every rank).  Returns out, and (out, lse (nheads,
    total_local)) with return_softmax_lse=True."""
    check, ring, scale, softcap = _common("ring_flash_attn_varlen_func", q, k, v, group,
                                          dropout_p, softmax_scale, window_size, softcap,
                                          alibi_slopes, seq_dim=0)
    cu_seqlens = check.cu_seqlens(cu_seqlens, "cu_seqlens", q.device)
    check.seqlen(max_seqlen, "max_seqlen")
    bounds = cu_seqlens.tolist()
    lengths = [b - a for a, b in zip(bounds, bounds[1:])]
    if bounds[0] != 0 or min(lengths) < 0 or bounds[-1] != q.shape[0] or k.shape[0] != q.shape[0]:
        check.fail(InvalidArgumentError, "cu_seqlens",
                   f"must rise from 0 to the {q.shape[0]} rows of q (and of k), got {bounds}")
    if causal and any(n % 2 for n in lengths):
        check.fail(InvalidArgumentError, "cu_seqlens",
                   f"causal ring attention needs zigzag shards of even length, got {lengths}")
    out, lse = RingAttention.apply(q, k, v, ring, PackedRows(cu_seqlens), bool(causal), scale,
                                   softcap, bool(deterministic))
    return (out, lse) if return_softmax_lse else out
