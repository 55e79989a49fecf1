"""flash_attn_varlen_func with block_table and few query rows (or, on Hopper, any number), run
through flash_attn_with_kvcache's library call.

On compute capability 9.0 the library runs that call with many query rows on its forward kernels,
which read the pages in place (src/cuda/decode/kvcache_forward_route.h; its rule: from 16 rows a
sequence and 48 a KV group), and with few on the decode kernels, where the gather (_paged_varlen.py)
would copy every visible key first: there every call that wants no gradient goes to the library,
which alone decides between its kernels (forward_route_exists).

A serving engine batches decode steps (one query row a sequence, or a few speculative ones) as a
paged varlen call.  That is the call flash_attn_with_kvcache's kernels are built for: they read K
and V where they lie in the pages, once per KV group (the group's query rows share one 16-row
tensor-core tile), and split long caches over the SMs; on the H200 they stream pages of 16 at
0.91-0.96 of cuDNN's rate (docs/cuda-decode.md).  The gather (_paged_varlen.py) instead copies
every visible key and value and then runs a forward kernel built for 128-row query tiles.  So a
paged call that wants no gradient, no dropout and no attn_probs, and whose KV groups have at most
ROW_LIMIT query rows (max_seqlen_q x nheads / nheads_k), runs as a kvcache call without an append,
with the packed query rows as they are (cu_seqlens_q, max_seqlen_q: flash_attn_with_kvcache's
packed form, which aligns each sequence's rows to the bottom right of its keys as the varlen call
does) and the key lengths as the varlen call gives them: the library takes cu_seqlens_k,
seqused_k and max_seqlen_k in place of cache_seqlens (include/tileattn/tileattn.h), so this path
adds no torch op to the call.  A decode loop repeats one signature per layer and step: from its
second call a signature runs from the parameters the first one stored (_plans.py's scheme, in
flash_attn_with_kvcache's store of plans, _kvcache_plan.py), skipping the varlen call's Python
checks.

Nothing is read on the host (CUDA-graph capturable, traced by torch.compile).  Bad contents are
the library's to find: the CPU backend (and CUDA with TILEATTN_CHECK_CONTENTS=on) raises naming
cu_seqlens_q, max_seqlen_q, cu_seqlens_k, seqused_k or block_table; otherwise on CUDA a sequence
whose key count or seqused_k breaks a rule gets NaN rows, a block-table entry that is not a page
makes the rows that read it NaN, and a bad cu_seqlens_q makes every output NaN (the gather path
NaNs every output for any of them).
"""

import functools

import torch

from . import _fwd_plan, _kvcache_ops, _kvcache_plan
from ._plans import tensor_key

# Query rows of one KV group (max_seqlen_q x nheads / nheads_k) up to which the kvcache kernels
# take the call.  Up to 16 they are one tensor-core tile and K/V are read once: always ahead of
# the gather, which reads and writes every visible key before the forward reads them again.  Up
# to 64 (four tiles, each reading K/V, the later ones mostly from L2) they are predicted to stay
# ahead; the crossover is not measured yet (docs/perf-log.md, session 52).
ROW_LIMIT = 64


_CAPABILITY = {}  # device index -> compute capability (a plain dict: torch.compile warns on lru_cache)


def _hopper(device_index):
    if device_index not in _CAPABILITY:
        _CAPABILITY[device_index] = torch.cuda.get_device_capability(device_index)
    return _CAPABILITY[device_index] == (9, 0)


def forward_route_exists(q):
    """Whether the library can run a packed kvcache call over pages on its forward kernels (the
    sm90 family, compute capability 9.0), so a call of any number of rows is served well there:
    many rows on the forward kernels, few on the decode kernels, by the library's own rule."""
    return q.device.type == "cuda" and _hopper(q.device.index if q.device.index is not None else 0)


def applies(q, k, v, dropout_p, return_attn_probs, max_seqlen_q):
    """Whether a checked paged varlen call runs as a kvcache call: few rows a KV group (the decode
    kernels), or on Hopper any number of rows (the library picks its kernels)."""
    wants_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if wants_grad or dropout_p != 0 or return_attn_probs or not isinstance(max_seqlen_q, int):
        return False
    if k.stride(-1) != 1 or v.stride(-1) != 1:
        return False
    return max_seqlen_q * (q.shape[1] // k.shape[2]) <= ROW_LIMIT or forward_route_exists(q)


def attention(q, k, v, block_table, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k,
              scale, window_left, window_right, softcap, alibi_slopes, plan=None):
    """The paged varlen call's output, for arguments that passed
    _paged_varlen.check_paged_call and applies(); scale, windows and softcap resolved.  `plan`:
    the call's signature, under which its parameters are kept when the library accepts them."""
    if block_table.stride(1) != 1:
        block_table, plan = block_table.contiguous(), None
    out, _ = _kvcache_ops.call_kvcache_fwd(
        q, k, v, None, None, None, None, None, None, None, block_table, scale, window_left, window_right,
        softcap, False, alibi_slopes, 0, cu_seqlens_q, max_seqlen_q, cu_seqlens_k, seqused_k, max_seqlen_k,
        on_success=None if plan is None else functools.partial(_kvcache_plan.store, plan))
    return out


def signature(q, k, v, block_table, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
              softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
              seqused_k):
    """A paged varlen call's signature for the repeat-call fast path (_plans.py), or None when it
    cannot have a plan.  Only calls this module served store one, and everything applies() looks
    at (grad mode, the tensors' requires_grad and strides, dropout, attn_probs, max_seqlen_q, the
    head counts) is in the signature, so a plan never serves a call the gather path should take."""
    options = _fwd_plan.options_key(dropout_p, softmax_scale, causal, window_size, softcap, deterministic,
                                    return_attn_probs)
    if options is None:
        return None
    try:
        return ("paged decode", tensor_key(q), tensor_key(k), tensor_key(v), tensor_key(block_table),
                tensor_key(cu_seqlens_q), tensor_key(cu_seqlens_k), tensor_key(seqused_k),
                tensor_key(alibi_slopes), type(max_seqlen_q), max_seqlen_q, type(max_seqlen_k),
                max_seqlen_k) + options
    except AttributeError:
        return None


def run(key, q, k, v, block_table, cu_seqlens_q, cu_seqlens_k, seqused_k, alibi_slopes):
    """The output from the plan of `key` (_kvcache_plan.run), or None when the full path must run."""
    outputs = _kvcache_plan.run(key, q, k, v, None, None, None, None, None, None, None, block_table, alibi_slopes,
                                cu_seqlens_q, cu_seqlens_k, seqused_k)
    return None if outputs is None else outputs[0]
