"""Paged varlen calls with few query rows a KV group and no gradient run on the KV-cache kernels
(_paged_varlen_kvcache.py): each sequence's rows against a float64 reference (FA's rule), with NaN
in every page slot no sequence owns and garbage block-table entries past each sequence's pages;
which calls take that path; the same bits as flash_attn_with_kvcache; bad contents on CUDA
(the CUDA-graph replay is test_varlen_paged.py's)."""

import pytest
import torch

import attn_reference as ref
from conftest import FLOOR, assert_fa_close, dtypes_for
from test_varlen import cu
from test_varlen_paged import paged_copy
from tileattn import (_kvcache_plan, _paged_varlen, _paged_varlen_kvcache, flash_attn_varlen_func,
                      flash_attn_with_kvcache)


@pytest.fixture
def kvcache_path_only(monkeypatch):
    """Fails the test if a call is gathered instead of run on the KV-cache kernels."""
    def gathered(*args):
        raise AssertionError("the call was gathered, not run on the KV-cache kernels")
    monkeypatch.setattr(_paged_varlen, "gather_paged_keys", gathered)


def run_decode(device, dtype, seqlens_q, seqlens_k, page_size, num_heads=8, num_heads_k=2,
               head_dim=64, *, seqused_k=None, max_seqlen_q=None, causal=False,
               window_size=(-1, -1), softcap=0.0, alibi_slopes=None):
    q = torch.randn(sum(seqlens_q), num_heads, head_dim, dtype=dtype, device=device)
    k = torch.randn(sum(seqlens_k), num_heads_k, head_dim, dtype=dtype, device=device)
    v = torch.randn_like(k)
    (k_pages, v_pages), block_table, _ = paged_copy((k, v), seqlens_k, page_size, device)
    cu_q, cu_k = cu(seqlens_q, device), cu(seqlens_k, device)
    out = flash_attn_varlen_func(
        q, k_pages.detach(), v_pages.detach(), cu_q, cu_k, max_seqlen_q or max(max(seqlens_q), 1),
        max(max(seqlens_k), 1), causal=causal, window_size=window_size, softcap=softcap,
        alibi_slopes=alibi_slopes, block_table=block_table, seqused_k=seqused_k)
    assert out.shape == q.shape
    options = dict(window_left=window_size[0], window_right=0 if causal else window_size[1],
                   softcap=softcap)
    for b, (len_q, len_k) in enumerate(zip(seqlens_q, seqlens_k)):
        rows = slice(int(cu_q[b]), int(cu_q[b]) + len_q)
        used = slice(int(cu_k[b]), int(cu_k[b]) + (len_k if seqused_k is None else int(seqused_k[b])))
        slopes = None
        if alibi_slopes is not None:
            slopes = alibi_slopes if alibi_slopes.dim() == 1 else alibi_slopes[b]
        args = (q[rows].unsqueeze(0), k[used].unsqueeze(0), v[used].unsqueeze(0))
        truth = ref.attention(*args, dtype=torch.float64, alibi_slopes=slopes, **options)
        naive = ref.attention(*args, dtype=dtype, alibi_slopes=slopes, **options)
        assert_fa_close(f"sequence {b} ({len_q}x{used.stop - used.start}) out", out[rows].unsqueeze(0),
                        naive["out"], truth["out"], FLOOR[dtype])


# (query rows, keys) a sequence: decode steps, speculative tokens, sequences with no query row or
# no key, one sequence.
STEPS = {
    "decode": ([1, 1, 1, 1], [127, 17, 1, 1000]),
    "ragged": ([3, 0, 4, 2], [40, 9, 0, 300]),
    "one sequence": ([5], [1000]),
}


@pytest.mark.parametrize("page_size", [16, 64, 256])
@pytest.mark.parametrize("step", list(STEPS))
@pytest.mark.parametrize("mask", ["none", "causal", "window"])
def test_paged_decode_masks(device, page_size, step, mask, kvcache_path_only):
    options = dict(causal=mask == "causal", window_size=(13, 2) if mask == "window" else (-1, -1))
    for dtype in dtypes_for(device):
        run_decode(device, dtype, *STEPS[step], page_size, **options)


@pytest.mark.parametrize("option", ["gqa7", "seqused_k", "softcap_alibi", "alibi_per_sequence",
                                    "loose_max_seqlen_q"])
def test_paged_decode_options(device, option, kvcache_path_only):
    seqlens_q, seqlens_k = [2, 1, 3, 0], [127, 17, 1, 40]
    kwargs = {}
    if option == "gqa7":  # 9 rows x 7 query heads a KV head: 63, the last size under the limit
        kwargs = dict(num_heads=7, num_heads_k=1, max_seqlen_q=9, causal=True)
    elif option == "seqused_k":
        kwargs = dict(seqused_k=torch.tensor([100, 3, 0, 40], dtype=torch.int32, device=device),
                      causal=True)
    elif option == "softcap_alibi":
        kwargs = dict(softcap=2.0, alibi_slopes=torch.rand(8, device=device) * 0.3, causal=True)
    elif option == "alibi_per_sequence":
        kwargs = dict(alibi_slopes=torch.rand(4, 8, device=device) * 0.3, window_size=(20, 0))
    else:  # max_seqlen_q above every sequence's rows: more leading slots, the same rows
        kwargs = dict(max_seqlen_q=8, causal=True)
    for dtype in dtypes_for(device):
        run_decode(device, dtype, seqlens_q, seqlens_k, 16, **kwargs)


def test_which_paged_calls_take_the_kvcache_kernels(device, monkeypatch, no_plans):
    """No gradient wanted, no dropout, no attn_probs and at most ROW_LIMIT query rows a KV group
    (or on Hopper a prefill chunk): the kvcache call; anything else: the gather."""
    taken = []
    attention = _paged_varlen_kvcache.attention
    monkeypatch.setattr(_paged_varlen_kvcache, "attention",
                        lambda *args: taken.append(True) or attention(*args))
    pages = torch.randn(4, 16, 2, 32, dtype=torch.bfloat16, device=device)
    block_table = torch.tensor([[1, 3], [0, 2]], dtype=torch.int32, device=device)
    cu_k = cu([20, 31], device)

    def call(rows, heads=8, grad=False, **options):
        q = torch.randn(2 * rows, heads, 32, dtype=torch.bfloat16, device=device, requires_grad=grad)
        taken.clear()
        flash_attn_varlen_func(q, pages, pages, cu([rows, rows], device), cu_k, rows, 31,
                               block_table=block_table, **options)
        return bool(taken)

    limit = _paged_varlen_kvcache.ROW_LIMIT
    assert call(1) and call(limit // 4) and call(limit, heads=2)
    # Past the limit, on Hopper the library takes the call too and picks its kernels: the forward
    # from 16 rows a sequence (test_varlen_paged_prefill.py); elsewhere the pages are gathered.
    hopper = _paged_varlen_kvcache.forward_route_exists(pages)
    assert call(limit // 4 + 1) == hopper
    assert call(limit + 1, heads=2) == hopper
    assert not call(1, grad=True)
    with torch.no_grad():
        assert call(1, grad=True)
    assert not call(1, dropout_p=0.1)
    assert not call(1, return_attn_probs=True)


def test_repeated_decode_step_runs_from_its_plan(device, kvcache_path_only, no_plans):
    """The second call with a signature skips the checks (_paged_varlen_kvcache.run) and gives,
    from its own q, pages and block table, the bits the full path gives; a bad block-table entry
    there still raises on the CPU (the library checks every call) and is NaN on CUDA."""
    pages = torch.randn(12, 16, 2, 32, dtype=torch.bfloat16, device=device)
    cu_q, cu_k = cu([1, 2, 1], device), cu([20, 31, 5], device)

    def step(seed):
        torch.manual_seed(seed)
        q = torch.randn(4, 4, 32, dtype=torch.bfloat16, device=device)
        table = torch.randperm(12, dtype=torch.int32)[:6].view(3, 2).to(device)
        return q, table, lambda: flash_attn_varlen_func(q, pages, pages, cu_q, cu_k, 2, 32, causal=True,
                                                        block_table=table)

    step(1)[2]()
    hits = _kvcache_plan.hits
    q, table, call = step(2)
    from_plan = call()
    assert _kvcache_plan.hits == hits + 1
    _kvcache_plan._plans.clear()
    assert torch.equal(from_plan, call())
    assert _kvcache_plan.hits == hits + 1
    table[1, 1] = -1  # sequence 1 reads 31 keys: both of its pages
    if device == "cpu":
        with pytest.raises(ValueError) as raised:
            call()
        assert raised.value.argument == "block_table", str(raised.value)
    else:
        out = call()
        assert _kvcache_plan.hits == hits + 2
        assert torch.isnan(out[1:3]).all() and not torch.isnan(out[0]).any() and not torch.isnan(out[3]).any()


def test_copied_index_tensors_store_no_plan(device, kvcache_path_only, no_plans):
    """cu_seqlens_q as a strided view is copied for the library: its parameters would point at the
    copy, so no plan is kept (every such call takes the full path)."""
    pages = torch.randn(4, 16, 2, 32, dtype=torch.bfloat16, device=device)
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=device)
    cu_q = torch.tensor([0, 9, 1, 9, 2], dtype=torch.int32, device=device)[::2]
    q = torch.randn(2, 4, 32, dtype=torch.bfloat16, device=device)
    first = flash_attn_varlen_func(q, pages, pages, cu_q, cu([20, 31], device), 1, 32, block_table=table)
    assert len(_kvcache_plan._plans) == 0
    second = flash_attn_varlen_func(q, pages, pages, cu_q.contiguous(), cu([20, 31], device), 1, 32,
                                    block_table=table)
    assert len(_kvcache_plan._plans) == 1 and torch.equal(first, second)


def test_decode_step_is_flash_attn_with_kvcache(device, kvcache_path_only, monkeypatch):
    """One query row a sequence: the kvcache call over the same pages, bit for bit.  Both on the
    decode kernels: with TILEATTN_KVCACHE_FORWARD=on either call could take the forward kernels on
    Hopper, and the two forms' results would then not be compared on the same kernels."""
    monkeypatch.setenv("TILEATTN_KVCACHE_FORWARD", "off")
    batch, page, max_blocks = 5, 16, 6
    pages = torch.randn(batch * max_blocks, page, 2, 64, dtype=torch.bfloat16, device=device)
    block_table = torch.randperm(batch * max_blocks, dtype=torch.int32).view(batch, -1).to(device)
    lengths = torch.tensor([1, 96, 50, 0, 17], dtype=torch.int32, device=device)
    q = torch.randn(batch, 1, 8, 64, dtype=torch.bfloat16, device=device)
    cu_k = torch.cat([lengths.new_zeros(1), lengths.cumsum(0, dtype=torch.int32)])
    paged = flash_attn_varlen_func(q.flatten(0, 1), pages, pages, cu([1] * batch, device), cu_k, 1, 96,
                                   causal=True, block_table=block_table)
    cached = flash_attn_with_kvcache(q, pages, pages, cache_seqlens=lengths, block_table=block_table,
                                     causal=True)
    assert torch.equal(paged, cached.flatten(0, 1))


def test_paged_decode_compiles_fullgraph(device):
    """The row mapping is torch ops and the kvcache call a custom op: no graph break."""
    q = torch.randn(3, 4, 32, dtype=torch.bfloat16, device=device)
    pages = torch.randn(3, 16, 2, 32, dtype=torch.bfloat16, device=device)
    block_table = torch.tensor([[2, 0], [1, 0], [0, 2]], dtype=torch.int32, device=device)
    cu_q, cu_k = cu([1, 2, 0], device), cu([20, 9, 32], device)

    def call(q, pages, block_table):
        return flash_attn_varlen_func(q, pages, pages, cu_q, cu_k, 2, 32, causal=True,
                                      block_table=block_table)

    compiled = torch.compile(call, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(q, pages, block_table), call(q, pages, block_table),
                               rtol=0, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("case", ["page out of range", "sequence past max_seqlen_k", "seqused_k past its keys",
                                  "rows past q", "sequence past max_seqlen_q"])
def test_cuda_paged_decode_bad_contents_give_nan(case, kvcache_path_only):
    """On CUDA nothing is read on the host and nothing out of bounds (a later call still runs): a
    sequence whose keys break a rule, or that reads a block-table entry that is not a page, gets NaN
    rows while the others are computed; bad cu_seqlens_q make every row NaN."""
    device = "cuda"
    q = torch.randn(3, 4, 64, dtype=torch.bfloat16, device=device)
    pages = torch.randn(3, 16, 2, 64, dtype=torch.bfloat16, device=device)
    table, cu_q, cu_k = torch.tensor([[2], [0]], dtype=torch.int32, device=device), cu([1, 2], device), cu([5, 9], device)
    good = (table, cu_q, cu_k)
    seqused_k = None
    if case == "page out of range":
        table = torch.tensor([[2], [1 << 20]], dtype=torch.int32, device=device)
    elif case == "sequence past max_seqlen_k":
        cu_k = cu([5, 15], device)
    elif case == "seqused_k past its keys":
        seqused_k = torch.tensor([5, 10], dtype=torch.int32, device=device)
    elif case == "rows past q":
        cu_q = cu([1, 1 << 20], device)
    else:
        cu_q = cu([3, 0], device)
    out = flash_attn_varlen_func(q, pages, pages, cu_q, cu_k, 2, 9, block_table=table, seqused_k=seqused_k)
    if case.startswith("rows") or case.endswith("max_seqlen_q"):
        assert torch.isnan(out).all()
    else:  # sequence 1 (rows 1-2) is at fault, sequence 0 (row 0) is not
        assert torch.isnan(out[1:]).all() and not torch.isnan(out[:1]).any()
    table, cu_q, cu_k = good
    good_out = flash_attn_varlen_func(q, pages, pages, cu_q, cu_k, 2, 9, block_table=table)
    torch.cuda.synchronize()
    assert not torch.isnan(good_out).any()
