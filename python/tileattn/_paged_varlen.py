"""flash_attn_varlen_func with block_table: keys and values in pages, read through a gather.

flash-attn 2.x's paged varlen call takes k and v as (num_blocks, page_size, nheads_k, headdim)
and block_table (batch, max_blocks) int32: sequence b's key j lives in page
block_table[b, j // page_size], slot j % page_size, for j < cu_seqlens_k[b + 1] - cu_seqlens_k[b]
(seqused_k[b] when given).  cu_seqlens_k's entries then only give lengths, not rows.

Calls with few query rows and no gradient run on the KV-cache kernels, which read the pages in
place (_paged_varlen_kvcache.py).  For the others (training, dropout, attn_probs, long prefill
chunks), until the forward kernels read pages themselves, the pages are gathered into one padded
(batch * max_seqlen_k, nheads_k, headdim) tensor and the ordinary varlen call runs on it, with
each sequence's length as seqused_k.  The gather is torch ops (index arithmetic on the
(batch, max_seqlen_k) positions, then one index_select of rows), so it syncs nothing, is captured
by CUDA graphs, traces under torch.compile, and is differentiable: dk and dv come back in the
pages' shape (a page two sequences share gets both gradients).  Its cost is a copy of the visible
keys and values, batch x max_seqlen_k x nheads_k x headdim elements each, written once and read
by the attention, and the host time of ~20 small ops (~0.2 ms eagerly on the CPU host here).

Bad contents are handled like the varlen call's own index arrays: on the CPU the lengths and the
block-table entries a sequence reads are checked on the host and raise naming the argument; on CUDA
nothing is read on the host (unless TILEATTN_CHECK_CONTENTS=on, _host_contents.py), and a sequence
whose length or used pages are out of range gets the length -1, which the kernels' bounds check
turns into NaN over every output of the call.
"""

import torch

from . import _host_contents
from ._ffi import InvalidArgumentError

PAGED_LAYOUT = "(num_blocks, page_size, nheads_k, headdim) with block_table"


def check_paged_keys(check, k, v, block_table, batch, max_seqlen_k, device):
    """Shape rules of the paged form (no values read)."""
    for name, x in (("k", k), ("v", v)):
        check.dims(x, name, 4, PAGED_LAYOUT)
    check.int32_tensor(block_table, "block_table", device)
    if block_table.dim() != 2 or block_table.shape[0] != batch:
        check.fail(InvalidArgumentError, "block_table",
                   f"must be (batch_size, max_blocks) = ({batch}, ...), batch_size being cu_seqlens_q's "
                   f"{batch + 1} entries less one; got {tuple(block_table.shape)}")
    if k.shape[0] == 0:
        check.fail(InvalidArgumentError, "k", f"has no pages (shape {tuple(k.shape)})")
    page_size = k.shape[1]
    # The rule flash_attn_with_kvcache's paged caches follow (flash-attn 2 asks for 256).
    if page_size < 16 or page_size % 16 != 0:
        check.fail(InvalidArgumentError, "k", f"the page size (dim 1 of {tuple(k.shape)}) is {page_size}; "
                   "it must be a positive multiple of 16")
    if block_table.shape[1] * page_size < max_seqlen_k:
        check.fail(InvalidArgumentError, "block_table",
                   f"{block_table.shape[1]} pages of {page_size} keys hold fewer than max_seqlen_k = "
                   f"{max_seqlen_k} keys")


def sequence_faults(keys, lengths, block_table, max_seqlen_k, num_blocks, page_size):
    """The content rules of a paged call's keys: ((batch,) masks of the sequences with a key count
    outside [0, max_seqlen_k], with a seqused_k outside [0, keys] (`lengths` is seqused_k, else the
    key counts), and that read a block-table entry that is not a page), and the (batch, max_blocks)
    mask of those entries.  Torch ops, no host read."""
    pages_read = (lengths.clamp(min=0) + page_size - 1) // page_size
    read = torch.arange(block_table.shape[1], device=block_table.device) < pages_read[:, None]
    bad_entry = read & ((block_table < 0) | (block_table >= num_blocks))
    bad_keys, bad_length = (keys < 0) | (keys > max_seqlen_k), (lengths < 0) | (lengths > keys)
    return (bad_keys, bad_length, bad_entry.any(1)), bad_entry


def raise_for_contents(check, faults, bad_entry, keys, lengths, block_table, max_seqlen_k, num_blocks):
    """Raises naming the argument and the first entry at fault, given sequence_faults' masks, where
    _host_contents.read_on_host (the CPU; CUDA calls turn them into NaN instead, unless
    TILEATTN_CHECK_CONTENTS=on)."""
    bad_keys, bad_length, bad_page = faults
    b = int((bad_keys | bad_length | bad_page).nonzero()[0, 0])
    if bad_keys[b]:
        check.fail(InvalidArgumentError, "cu_seqlens_k",
                   f"sequence {b} has {int(keys[b])} keys; it must be in [0, max_seqlen_k = {max_seqlen_k}]")
    if bad_length[b]:
        check.fail(InvalidArgumentError, "seqused_k",
                   f"seqused_k[{b}] = {int(lengths[b])} must be in [0, {int(keys[b])}] (sequence {b}'s keys)")
    j = int(bad_entry[b].nonzero()[0, 0])
    check.fail(InvalidArgumentError, "block_table",
               f"block_table[{b}, {j}] = {int(block_table[b, j])} is not a page of k "
               f"(num_blocks = {num_blocks}); sequence {b} reads it")


def _rows_of(pages, index, deterministic):
    """pages (num_blocks, page_size, heads, d) at flat slot indices, as (len(index), heads, d)."""
    if pages.stride(0) != pages.shape[1] * pages.stride(1):  # pages not evenly spaced: no row view
        return pages[index // pages.shape[1], index % pages.shape[1]]
    rows = pages.flatten(0, 1)
    # index_select copies whole rows (2x faster than indexing on the CPU); its backward,
    # index_add, adds a slot's gradients in no fixed order where three or more sequences share a
    # page.  Indexing's backward (index_put with accumulate) sorts them first: deterministic.
    return rows[index] if deterministic else rows.index_select(0, index)


def gather_paged_keys(check, k, v, block_table, cu_seqlens_k, seqused_k, max_seqlen_k, deterministic):
    """Returns (k_rows, v_rows, cu_seqlens_k, seqused_k) for the ordinary varlen call: each
    sequence's keys at rows [b * max_seqlen_k, b * max_seqlen_k + length)."""
    batch = block_table.shape[0]
    num_blocks, page_size = k.shape[0], k.shape[1]
    device = k.device
    keys = cu_seqlens_k[1:] - cu_seqlens_k[:-1]
    lengths = keys if seqused_k is None else seqused_k
    faults, bad_entry = sequence_faults(keys, lengths, block_table, max_seqlen_k, num_blocks, page_size)
    bad = faults[0] | faults[1] | faults[2]
    if _host_contents.read_on_host(device) and bool(bad.any()):
        raise_for_contents(check, faults, bad_entry, keys, lengths, block_table, max_seqlen_k, num_blocks)
    position = torch.arange(max_seqlen_k, device=device)
    read = position < lengths[:, None]  # (batch, max_seqlen_k)
    # A row past a sequence's length repeats its first key.  The kernels mask such rows out of
    # the scores, but a tile may still load them, and a probability of 0 times a NaN value is NaN:
    # unwritten page slots (torch.empty pages) must never be the source.  An out-of-range entry of
    # a bad sequence (all of whose outputs become NaN) or the unread first entry of an empty one
    # reads a valid page instead.
    source = position * read
    pages = block_table.gather(1, source // page_size).clamp(0, num_blocks - 1)
    lengths = torch.where(bad, -1, lengths)
    index = (pages.long() * page_size + source % page_size).flatten()
    starts = torch.arange(0, (batch + 1) * max_seqlen_k, max_seqlen_k, dtype=torch.int32, device=device)
    return _rows_of(k, index, deterministic), _rows_of(v, index, deterministic), starts, lengths


def check_paged_call(check, q, k, v, block_table, cu_seqlens_q, cu_seqlens_k, max_seqlen_k, seqused_k):
    """Checks a paged varlen call's arguments (shapes only); returns (cu_seqlens_q, cu_seqlens_k,
    max_seqlen_k, seqused_k) as the rest of the call takes them."""
    check.dims(q, "q", 3, "(total_q, nheads, headdim)")
    cu_seqlens_q = check.cu_seqlens(cu_seqlens_q, "cu_seqlens_q", q.device)
    batch = cu_seqlens_q.shape[0] - 1
    max_seqlen_k = check.seqlen(max_seqlen_k, "max_seqlen_k")
    check_paged_keys(check, k, v, block_table, batch, max_seqlen_k, q.device)
    check.dtype_and_device([("q", q), ("k", k), ("v", v)])
    check.heads(q, k, v, ("q", "k", "v"), seq_dim=0)
    cu_seqlens_k = check.cu_seqlens(cu_seqlens_k, "cu_seqlens_k", q.device, batch, "cu_seqlens_q")
    seqused_k = check.seqused_k(seqused_k, batch, q.device)
    return cu_seqlens_q, cu_seqlens_k, max_seqlen_k, seqused_k
