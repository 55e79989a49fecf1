"""flash_attn_func and flash_attn_varlen_func calls shaped like a decode step (a model that passes
its whole K/V each step, as Hugging Face's flash-attention path does, padded batches through the
varlen call) run on CUDA as flash_attn_with_kvcache calls: the batch form's k and v as a full
contiguous cache, the varlen form's packed k and v as a cache whose entries are all k (a batch
stride of 0), each sequence reading it from its cu_seqlens_k start (cache_leftpad the start,
cache_seqlens the end) with its query rows packed (cu_seqlens_q).

The forward kernels give each (sequence, query head) CTAs of 64 or more query rows: with one row a
sequence they multiply rows of padding and read a KV head's keys once per query head of its
group.  The decode kernels put a KV group's query heads in one tile, read K/V once per group
and split the keys over CTAs when sequences x KV heads cannot fill the GPU.  bottom-right
alignment, windows, softcap and ALiBi mean the same in both calls (flash_attn_with_kvcache aligns
its masks to the end of the cache, which is here the end of k), so the route changes only which
kernels run.  Not taken when a gradient is wanted (the decode kernels have no backward), with
dropout or attn_probs, or where a KV group has more than ROW_LIMIT query rows.  On the CPU the
library makes this choice itself (src/cpu/kv_group_rows.cpp), for the C API too.

Bad varlen index contents keep the forward's contract on the route: a sequence whose cu_seqlens_k
entries are out of order, or whose seqused_k is negative or past its keys, gets NaN outputs (the
kvcache call's rule cache_leftpad <= cache_seqlens, and a length of -1 where seqused_k exceeds the
keys; without the latter the sequence would read its neighbour's keys).  max_seqlen_k is not read:
a sequence longer than it gets its attention, where the forward kernels give NaN.  With
TILEATTN_CHECK_CONTENTS=on the route is not taken, so the forward's host checks raise naming the
argument.
"""

import torch

from . import _host_contents, _kvcache_plan

# Query rows of one KV group (seqlen_q x nheads / nheads_k) up to which the route is taken: one
# tensor-core tile of the decode kernels, which then read K and V once (the paged varlen route's
# rule, _paged_varlen_kvcache.py, where 16 is its measured-safe part).
ROW_LIMIT = 16

# Devices the route serves.  The CPU backend's own rule covers the CPU; the tests add "cpu" to
# exercise this module on CI.
DEVICES = ("cuda",)


def _served(q, k, v, dropout_p, return_attn_probs):
    """What both forms need: a device the route serves, no dropout or attn_probs, no gradient
    wanted (the decode kernels have no backward), and rows whose last dim is contiguous
    (flash_attn_with_kvcache takes the caches' rows in place, never a copy)."""
    if q.device.type not in DEVICES or dropout_p != 0 or return_attn_probs:
        return False
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return False
    return q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1


def applies(q, k, v, dropout_p, return_attn_probs):
    """Whether a checked flash_attn_func call runs as a kvcache call."""
    if not _served(q, k, v, dropout_p, return_attn_probs):
        return False
    seqlen_q, heads, seqlen_k, heads_k = q.shape[1], q.shape[2], k.shape[1], k.shape[2]
    return seqlen_k > 0 and seqlen_q * (heads // heads_k) <= ROW_LIMIT


def varlen_applies(q, k, v, dropout_p, return_attn_probs, max_seqlen_q):
    """Whether a checked flash_attn_varlen_func call without pages runs as a kvcache call."""
    if not _served(q, k, v, dropout_p, return_attn_probs) or not isinstance(max_seqlen_q, int) or k.shape[0] == 0:
        return False
    if q.device.type != "cpu" and _host_contents.read_on_host(q.device):
        return False  # the forward path's host checks name cu_seqlens_k, seqused_k, max_seqlen_k
    return max_seqlen_q * (q.shape[1] // k.shape[1]) <= ROW_LIMIT


class _Address:
    """Where a KV-cache plan's call reads a tensor's data_ptr(): a view of an argument
    (cu_seqlens_k[1:], k expanded over the batch) without making the view, a torch op of ~2 us on
    the CI host and up to ~10 on a busy GPU host."""

    __slots__ = ("address",)

    def __init__(self, address):
        self.address = address

    def data_ptr(self):
        return self.address


class _KvcacheCall:
    """A route's flash_attn_with_kvcache call that keeps the signature of its first call, so that
    later calls of the same shapes go to that call's plan (_kvcache_plan.run) without building the
    signature again.  Every keyword is given (none left to flash_attn_with_kvcache's defaults), and
    the signature is built from the same ones, so it is the key the call stored its plan under."""

    def __init__(self, flash_attn_with_kvcache):
        self.function = flash_attn_with_kvcache
        self.key = None

    def first(self, q, k_cache, v_cache, cache_seqlens, cache_leftpad, scale, window_left, window_right,
              softcap, alibi_slopes, cu_seqlens_q=None, max_seqlen_q=None, keep_key=True):
        """The call through flash_attn_with_kvcache; keep_key=False for calls that again() never
        serves (the varlen form with seqused_k), which then skip building a signature (~3-5 us)."""
        args = dict(k=None, v=None, rotary_cos=None, rotary_sin=None, cache_seqlens=cache_seqlens,
                    cache_batch_idx=None, cache_leftpad=cache_leftpad, block_table=None, softmax_scale=scale,
                    causal=False, window_size=(window_left, window_right), softcap=softcap,
                    rotary_interleaved=True, alibi_slopes=alibi_slopes, num_splits=0,
                    cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q)
        out = self.function(q, k_cache, v_cache, **args)
        if keep_key:
            self.key = _kvcache_plan.signature(q, k_cache, v_cache, **args)
        return out

    def again(self, q, k_cache, v_cache, cache_seqlens, cache_leftpad, alibi_slopes, cu_seqlens_q=None):
        """out from the first call's plan, or None where there is none (first() then runs)."""
        if self.key is None:
            return None
        outputs = _kvcache_plan.run(self.key, q, k_cache, v_cache, None, None, None, None, cache_seqlens, None,
                                    cache_leftpad, None, alibi_slopes, cu_seqlens_q)
        return None if outputs is None else outputs[0]


def batch_call(scale, window_left, window_right, softcap, flash_attn_with_kvcache):
    """A flash_attn_func call that applies() admits, for its resolved options, as a function of
    its tensors: call(q, k, v, alibi_slopes) -> out.  The repeat-call plan keeps it
    (_fwd_plan.store_rerouted), so a decode loop's later calls skip flash_attn_func's checks and
    the KV-cache call's signature; it returns None, sending such a call down the full path, where
    the route no longer applies (the signature fixes the tensors' shapes, strides and grad mode,
    not DEVICES)."""
    kvcache = _KvcacheCall(flash_attn_with_kvcache)

    def call(q, k, v, alibi_slopes):
        if not applies(q, k, v, 0.0, False):
            return None
        out = kvcache.again(q, k, v, k.shape[1], None, alibi_slopes)
        if out is None:
            out = kvcache.first(q, k, v, k.shape[1], None, scale, window_left, window_right, softcap, alibi_slopes)
        return out
    return call


def varlen_call(max_seqlen_q, scale, window_left, window_right, softcap, flash_attn_with_kvcache):
    """batch_call's counterpart for flash_attn_varlen_func: call(q, k, v, cu_seqlens_q,
    cu_seqlens_k, seqused_k, alibi_slopes) -> out, or None where varlen_applies no longer holds
    (DEVICES, or TILEATTN_CHECK_CONTENTS switched on since).  Without seqused_k a repeated call
    makes no torch op: its cache lengths and starts are addresses in cu_seqlens_k (contiguous, or
    the checks' copy would have kept the call from the plan) and the cache is k's address."""
    kvcache = _KvcacheCall(flash_attn_with_kvcache)

    def call(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes):
        if not varlen_applies(q, k, v, 0.0, False, max_seqlen_q):
            return None
        if seqused_k is None:
            starts = cu_seqlens_k.data_ptr()
            out = kvcache.again(q, _Address(k.data_ptr()), _Address(v.data_ptr()), _Address(starts + 4),
                                _Address(starts), alibi_slopes, cu_seqlens_q)
            if out is not None:
                return out
        return varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, scale,
                                window_left, window_right, softcap, alibi_slopes, kvcache)
    return call


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, scale, window_left,
                     window_right, softcap, alibi_slopes, kvcache):
    """The varlen call's output through flash_attn_with_kvcache (`kvcache`, a _KvcacheCall of
    interface.py's), for arguments that passed its checks and varlen_applies.  Index arithmetic is
    torch ops on q's device: nothing is read back to the host."""
    starts = cu_seqlens_k[:-1]
    ends = cu_seqlens_k[1:]
    if seqused_k is not None:
        # Three more small kernels, for calls that give seqused_k only.  A negative end, the -1 or a
        # sum near 2^31 that wrapped, is a negative cache length, which the decode kernels refuse
        # (decode_args.h sequence_keys); a negative seqused_k ends before its start (cache_leftpad).
        used_ends = starts + seqused_k
        ends = torch.where(used_ends <= ends, used_ends, -1)
    # Every sequence's cache entry is k itself: a batch stride of 0, not a cache_batch_idx of
    # zeros, which took one more kernel a call (1 us, 8% of a 1 x 2k step in a CUDA graph on an
    # H100; the same bits).
    batch = starts.shape[0]
    k_cache, v_cache = k[None].expand(batch, -1, -1, -1), v[None].expand(batch, -1, -1, -1)
    return kvcache.first(q, k_cache, v_cache, ends, starts, scale, window_left, window_right, softcap, alibi_slopes,
                         cu_seqlens_q, max_seqlen_q, keep_key=seqused_k is None)
