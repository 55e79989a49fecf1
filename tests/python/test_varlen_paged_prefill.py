"""Paged varlen calls with many query rows a sequence (a chunked prefill over a paged cache), no
gradient.  On Hopper they run through the kvcache call on the forward kernels, which read the pages
in place (_paged_varlen_kvcache.forward_route_exists, src/cuda/decode/kvcache_forward_route.h); on
other devices they gather the pages (_paged_varlen.py).  Each sequence's rows against float64 (FA's
rule) with NaN in every page slot no sequence owns and garbage block-table entries past each
sequence's pages; on Hopper the route's kernels seen by the profiler; bad contents there."""

import pytest
import torch

from test_kvcache_many_rows import cuda_kernel_names
from test_varlen import cu
from test_varlen_paged_decode import kvcache_path_only, run_decode  # noqa: F401 (a fixture)
from tileattn import _paged_varlen_kvcache, flash_attn_varlen_func


def hopper():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


# (query rows, keys) a sequence: chunks of a prefill after earlier chunks, a sequence with no
# query row, one whose rows are all its keys.
CHUNKS = {
    "chunks": ([64, 200, 0, 128], [600, 200, 50, 1000]),
    "ragged": ([70, 1, 127, 64], [70, 300, 129, 64]),
}


@pytest.mark.parametrize("page_size", [16, 48, 256])
@pytest.mark.parametrize("chunk", list(CHUNKS))
@pytest.mark.parametrize("mask", ["none", "causal", "window"])
def test_paged_prefill_masks(device, page_size, chunk, mask):
    options = dict(causal=mask == "causal", window_size=(100, 0) if mask == "window" else (-1, -1))
    run_decode(device, torch.bfloat16, *CHUNKS[chunk], page_size, head_dim=128, **options)


@pytest.mark.parametrize("option", ["gqa7", "seqused_k", "softcap_alibi", "d256", "fp16"])
def test_paged_prefill_options(device, option):
    seqlens_q, seqlens_k = [64, 100, 0, 80], [300, 100, 40, 513]
    kwargs, dtype = dict(causal=True), torch.bfloat16
    if option == "gqa7":
        kwargs.update(num_heads=14, num_heads_k=2)
    elif option == "seqused_k":
        kwargs.update(seqused_k=torch.tensor([200, 100, 0, 500], dtype=torch.int32, device=device))
    elif option == "softcap_alibi":
        kwargs.update(softcap=2.0, alibi_slopes=torch.rand(8, device=device) * 0.3)
    elif option == "d256":
        kwargs.update(head_dim=256)
    else:
        dtype = torch.float16
    run_decode(device, dtype, seqlens_q, seqlens_k, 16, **kwargs)


@pytest.mark.skipif(not hopper(), reason="the forward route: compute capability 9.0")
@pytest.mark.parametrize("page_size", [16, 256])
def test_paged_prefill_takes_the_forward_route(page_size, monkeypatch, kvcache_path_only):
    """Under auto a chunk of 48 rows a sequence (3 x 2 KV heads x 12 chunks of 16 group rows:
    past the 32 decode streams the rule leaves on the decode kernels) runs the route's lengths
    kernel and the sm90 forward, over pages read box by box (16) or a key block at a time (256),
    with no gather (kvcache_path_only fails a gathered call)."""
    monkeypatch.setenv("TILEATTN_KVCACHE_FORWARD", "auto")
    monkeypatch.setenv("TILEATTN_FORWARD_FAMILY", "auto")  # the GPU suite also forces sm80
    rows = 48
    assert _paged_varlen_kvcache.forward_route_exists(torch.empty(0, device="cuda"))
    names = cuda_kernel_names(lambda: run_decode("cuda", torch.bfloat16, [rows, rows, rows], [300, rows, 700],
                                                 page_size, head_dim=128, causal=True))
    assert any("route_lengths_kernel" in name for name in names), names
    assert any("fwd_kernel_sm90" in name for name in names), names


@pytest.mark.skipif(not hopper(), reason="the forward route: compute capability 9.0")
@pytest.mark.parametrize("case", ["page out of range", "seqused_k past its keys", "rows past q"])
def test_paged_prefill_bad_contents_give_nan(case, kvcache_path_only):
    """On the forward route nothing is read on the host: a sequence whose keys break a rule, or that
    reads a block-table entry that is not a page, gets NaN rows while the others are computed; bad
    cu_seqlens_q make every row NaN."""
    device = "cuda"
    q = torch.randn(128, 8, 128, dtype=torch.bfloat16, device=device)
    pages = torch.randn(40, 16, 2, 128, dtype=torch.bfloat16, device=device)
    table = torch.arange(40, dtype=torch.int32, device=device).view(2, 20)
    cu_q, cu_k, seqused_k = cu([64, 64], device), cu([300, 200], device), None
    if case == "page out of range":
        table[1, 3] = 1 << 20  # keys 48-63 of sequence 1
    elif case == "seqused_k past its keys":
        seqused_k = torch.tensor([300, 201], dtype=torch.int32, device=device)
    else:
        cu_q = cu([64, 1 << 20], device)
    out = flash_attn_varlen_func(q, pages, pages, cu_q, cu_k, 64, 300, block_table=table, seqused_k=seqused_k)
    torch.cuda.synchronize()
    if case == "rows past q":
        assert torch.isnan(out).all()
    else:  # sequence 1 (rows 64-127) is at fault, sequence 0 (rows 0-63) is not
        assert torch.isnan(out[64:]).all() and not torch.isnan(out[:64]).any()
