"""A decode step captured in a CUDA graph: flash_attn_with_kvcache does no host sync on CUDA and its
split count depends on shapes only, so one capture replays correctly as cache_seqlens, q and the
new k/v change between replays.  Each replay must equal the eager call bit for bit, in the output
and in the appended cache entries."""

import math

import pytest
import torch

import tileattn
from conftest import DEVICES, capture_cuda_graph

pytestmark = pytest.mark.skipif("cuda" not in DEVICES, reason="needs the CUDA backend")


@pytest.mark.parametrize("num_splits", [0, 1])
def test_decode_step_replays_in_a_cuda_graph(num_splits):
    batch, heads, heads_k, dim, page, max_blocks = 4, 16, 4, 128, 16, 24
    num_blocks = batch * max_blocks + 5
    device, dtype = "cuda", torch.bfloat16
    k_cache = torch.full((num_blocks, page, heads_k, dim), math.nan, dtype=dtype, device=device)
    v_cache = k_cache.clone()
    block_table = torch.randperm(num_blocks, dtype=torch.int32, device=device)[:batch * max_blocks]
    block_table = block_table.view(batch, max_blocks)
    # Static inputs of the captured step; each replay writes new contents into them.
    q = torch.empty(batch, 1, heads, dim, dtype=dtype, device=device)
    k = torch.empty(batch, 1, heads_k, dim, dtype=dtype, device=device)
    v = torch.empty_like(k)
    seqlens = torch.zeros(batch, dtype=torch.int32, device=device)
    cos = torch.randn(page * max_blocks, 32, dtype=dtype, device=device)
    sin = torch.randn_like(cos)

    def step(k_cache, v_cache):
        return tileattn.flash_attn_with_kvcache(
            q, k_cache, v_cache, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens,
            block_table=block_table, causal=True, num_splits=num_splits, return_softmax_lse=True)

    def fill(lengths):
        """Fresh inputs, and cache contents for positions [0, length) of every sequence."""
        q.normal_(), k.normal_(), v.normal_()
        seqlens.copy_(torch.tensor(lengths, dtype=torch.int32))
        for b, length in enumerate(lengths):
            for page_index in range((length + page - 1) // page):
                block = block_table[b, page_index]
                k_cache[block].normal_()
                v_cache[block].normal_()

    fill([5, 0, 100, 300])
    graph, (graph_out, graph_lse) = capture_cuda_graph(
        lambda: step(k_cache, v_cache), warm_up=lambda: step(k_cache.clone(), v_cache.clone()))

    for lengths in ([7, 0, 150, 330], [1, 200, 16, 47], [370, 31, 0, 64]):
        fill(lengths)
        eager_k, eager_v = k_cache.clone(), v_cache.clone()
        expect_out, expect_lse = step(eager_k, eager_v)
        graph.replay()
        torch.cuda.synchronize()
        assert not expect_out.isnan().any(), f"NaN in the eager output for {lengths}"
        assert torch.equal(graph_out, expect_out), f"replayed output differs for {lengths}"
        assert torch.equal(graph_lse, expect_lse), f"replayed lse differs for {lengths}"
        assert torch.equal(k_cache.isnan(), eager_k.isnan())
        filled = ~eager_k.isnan()
        assert torch.equal(k_cache[filled], eager_k[filled]), "replayed append differs"
        assert torch.equal(v_cache[filled], eager_v[filled]), "replayed append differs"
