"""flash-attn's padding helpers (`flash_attn.bert_padding`) under the same names and returns.

A padded batch (batch, seqlen, ...) with an attention mask becomes the packed form the varlen
functions take, and the packed output goes back into the padded shape:

    q_packed, indices, cu_seqlens, max_seqlen, used = unpad_input(q, mask)
    out = flash_attn_varlen_func(q_packed, k_packed, v_packed, cu_seqlens, cu_seqlens,
                                 max_seqlen, max_seqlen)
    out = pad_input(out, indices, batch, seqlen)   # zeros at the padded positions

Every function is differentiable.  `unpad_input` reads the mask's counts on the host (the packed
size and max_seqlen are host values), so it syncs with the device once, as flash-attn's does.
"""

import torch


def index_first_axis(x, indices):
    """x[indices] along the first axis (the rows the mask keeps, in order)."""
    return x.index_select(0, indices)


def index_put_first_axis(values, indices, first_axis_dim):
    """A (first_axis_dim, ...) tensor of zeros with values' rows at indices."""
    zeros = values.new_zeros((first_axis_dim,) + tuple(values.shape[1:]))
    return zeros.index_copy(0, indices, values)


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """hidden_states (batch, seqlen, ...) and attention_mask (batch, seqlen), nonzero where a
    token is real.  unused_mask (batch, seqlen), optional: tokens that take a place in the packed
    tensor without being attended to (seqused_k marks where they start, so they must follow each
    sequence's used tokens).

    Returns (packed (total, ...), indices (total,) int64 positions in the flattened batch,
    cu_seqlens (batch + 1,) int32, max_seqlen (int), seqused (batch,) int32 counts of the
    attention_mask's tokens alone)."""
    used = attention_mask.bool()
    kept = used if unused_mask is None else used | unused_mask.bool()
    seqlens = kept.sum(-1, dtype=torch.int32)
    indices = kept.flatten().nonzero().flatten()
    cu_seqlens = torch.cat([seqlens.new_zeros(1), seqlens.cumsum(0, dtype=torch.int32)])
    max_seqlen = int(seqlens.max()) if seqlens.numel() > 0 else 0
    packed = index_first_axis(hidden_states.flatten(0, 1), indices)
    return packed, indices, cu_seqlens, max_seqlen, used.sum(-1, dtype=torch.int32)


def pad_input(hidden_states, indices, batch, seqlen):
    """The packed (total, ...) rows back at their places in a (batch, seqlen, ...) tensor of zeros."""
    padded = index_put_first_axis(hidden_states, indices, batch * seqlen)
    return padded.view((batch, seqlen) + tuple(hidden_states.shape[1:]))
