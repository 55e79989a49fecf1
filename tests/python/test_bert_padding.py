"""tileattn.bert_padding (flash-attn's unpad_input / pad_input): a padded batch through the
varlen call must give each sequence what the batch call on that sequence alone gives, and the
helpers' counts, indices and gradients must match the mask."""

import torch

from tileattn import flash_attn_func, flash_attn_varlen_func
from tileattn.bert_padding import index_first_axis, pad_input, unpad_input


def mask_of(lengths, seqlen, device):
    return torch.arange(seqlen, device=device)[None, :] < torch.tensor(lengths, device=device)[:, None]


def test_unpad_counts_and_round_trip(device):
    batch, seqlen = 4, 19
    mask = torch.rand(batch, seqlen, device=device) < 0.6
    mask[1] = False  # a sequence with no token
    mask[2] = True
    x = torch.randn(batch, seqlen, 3, 5, device=device)
    packed, indices, cu_seqlens, max_seqlen, used = unpad_input(x, mask.int())
    counts = mask.sum(-1)
    assert packed.shape == (int(counts.sum()), 3, 5)
    assert cu_seqlens.dtype == torch.int32 and used.dtype == torch.int32
    assert cu_seqlens.tolist() == [0] + counts.cumsum(0).tolist()
    assert max_seqlen == int(counts.max()) and used.tolist() == counts.tolist()
    assert torch.equal(indices, mask.flatten().nonzero().flatten())
    assert torch.equal(packed, x[mask])
    assert torch.equal(pad_input(packed, indices, batch, seqlen), x * mask[..., None, None])


def test_unused_tokens_are_packed_but_not_counted_as_used(device):
    lengths, unused = [5, 0, 9], [2, 3, 0]
    attention = mask_of(lengths, 16, device)
    allocated = mask_of([n + u for n, u in zip(lengths, unused)], 16, device)
    x = torch.randn(3, 16, 4, device=device)
    packed, _, cu_seqlens, max_seqlen, used = unpad_input(x, attention, allocated & ~attention)
    assert cu_seqlens.tolist() == [0, 7, 10, 19] and max_seqlen == 9
    assert used.tolist() == lengths
    assert torch.equal(packed, x[allocated])


def test_padded_batch_through_varlen_matches_each_sequence_alone(device):
    batch, seqlen, heads, heads_k, dim = 3, 40, 4, 2, 32
    lengths = [40, 1, 23]
    mask = mask_of(lengths, seqlen, device)
    q = torch.randn(batch, seqlen, heads, dim, dtype=torch.bfloat16, device=device, requires_grad=True)
    k = torch.randn(batch, seqlen, heads_k, dim, dtype=torch.bfloat16, device=device, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    q_packed, indices, cu_seqlens, max_seqlen, _ = unpad_input(q, mask)
    k_packed, v_packed = (index_first_axis(x.flatten(0, 1), indices) for x in (k, v))
    out = flash_attn_varlen_func(q_packed, k_packed, v_packed, cu_seqlens, cu_seqlens, max_seqlen,
                                 max_seqlen, causal=True)
    out = pad_input(out, indices, batch, seqlen)
    out.sum().backward()
    for b, n in enumerate(lengths):
        alone = flash_attn_func(q[b:b + 1, :n].detach(), k[b:b + 1, :n].detach(), v[b:b + 1, :n].detach(),
                                causal=True)
        # The two calls may take different product paths on the CPU (the packed call's 80 rows a KV
        # head round P to bf16 on AMX or AVX512-BF16, a lone short sequence's few rows keep it float32),
        # so they agree to a few bf16 steps of the outputs (|out| < 2: steps of 2^-7 at most), not bit
        # for bit; a row or sequence taken from the wrong place differs by the outputs' own size.
        torch.testing.assert_close(out[b:b + 1, :n], alone, atol=3e-2, rtol=2e-2)
        assert torch.all(out[b, n:] == 0)
        for name, x in (("q", q), ("k", k), ("v", v)):
            assert torch.all(x.grad[b, n:] == 0), f"{name}: padded positions got a gradient"
            # (A one-token sequence has dq = dk = 0 exactly: its one probability is 1.)
            assert n == 1 or x.grad[b, :n].abs().sum() > 0, f"{name}: real positions got no gradient"
