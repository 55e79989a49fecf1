"""flash_attn_varlen_func with block_table: keys and values in shuffled pages must give what the
same keys packed give (float64 reference, FA's rule), with NaN in every page slot no sequence
owns, garbage block-table entries past each sequence's pages, and gradients back in the pages."""

import math

import pytest
import torch

from test_varlen import LENGTHS, check_sequences, cu
from conftest import capture_cuda_graph, dtypes_for
from tileattn import flash_attn_varlen_func


def paged_copy(packed, seqlens_k, page_size, device):
    """Scatters packed key (and value) rows into shuffled pages plus spare ones, with NaN in the
    slots no sequence owns.  `packed`: tensors of the same shape, laid out by one block table.
    Returns (pages of each, block_table, rows): rows = (page, slot) of each packed row."""
    owned = [math.ceil(n / page_size) for n in seqlens_k]
    num_pages = sum(owned) + 3
    order = torch.randperm(num_pages).tolist()
    max_blocks = max(max(owned), 1) + 1  # a column no sequence uses
    # Entries past a sequence's pages are garbage: never to be read, on any device.
    block_table = torch.randint(-5, 10 * num_pages, (len(seqlens_k), max_blocks), dtype=torch.int32)
    page_of_row, slot_of_row = [], []
    for b, n in enumerate(seqlens_k):
        for j in range(owned[b]):
            block_table[b, j] = order.pop()
        page_of_row += [int(block_table[b, j // page_size]) for j in range(n)]
        slot_of_row += [j % page_size for j in range(n)]
    rows = (torch.tensor(page_of_row, dtype=torch.long), torch.tensor(slot_of_row, dtype=torch.long))
    all_pages = []
    for x in packed:
        pages = torch.full((num_pages, page_size) + tuple(x.shape[1:]), float("nan"), dtype=x.dtype,
                           device=device)
        pages[rows] = x
        all_pages.append(pages.requires_grad_())
    return all_pages, block_table.to(device), rows


def run_paged(device, dtype, seqlens_q, seqlens_k, page_size, num_heads=6, num_heads_k=2,
              head_dim=48, *, seqused_k=None, **options):
    q = torch.randn(sum(seqlens_q), num_heads, head_dim, dtype=dtype, device=device, requires_grad=True)
    k = torch.randn(sum(seqlens_k), num_heads_k, head_dim, dtype=dtype, device=device)
    v = torch.randn_like(k)
    dout = torch.randn_like(q)
    (k_pages, v_pages), block_table, rows = paged_copy((k, v), seqlens_k, page_size, device)
    cu_q, cu_k = cu(seqlens_q, device), cu(seqlens_k, device)
    max_q, max_k = max(max(seqlens_q), 1), max(max(seqlens_k), 1)
    out, lse, probs = flash_attn_varlen_func(
        q, k_pages, v_pages, cu_q, cu_k, max_q, max_k, return_attn_probs=True,
        block_table=block_table, seqused_k=seqused_k, **options)
    out.backward(dout)
    assert out.shape == q.shape and k_pages.grad.shape == k_pages.shape
    check_sequences(q, k, v, dout, out, lse, probs, q.grad, k_pages.grad[rows], v_pages.grad[rows],
                    cu_q, cu_k, seqlens_q, seqlens_k, seqused_k=seqused_k, **options)
    unowned = torch.ones(k_pages.shape[:2], dtype=torch.bool)
    unowned[rows] = False
    for name, grad in (("dk", k_pages.grad), ("dv", v_pages.grad)):
        assert torch.all(grad[unowned.to(device)] == 0), f"{name}: page slots no sequence owns"


@pytest.mark.parametrize("page_size", [16, 64, 256])
@pytest.mark.parametrize("lengths", LENGTHS, ids=lambda l: "-".join(map(str, l[0])))
@pytest.mark.parametrize("mask", ["none", "causal", "window"])
def test_paged_varlen_masks(device, page_size, lengths, mask):
    options = dict(causal=mask == "causal", window_size=(13, 2) if mask == "window" else (-1, -1))
    for dtype in dtypes_for(device):
        run_paged(device, dtype, *lengths, page_size, **options)


@pytest.mark.parametrize("option", ["gqa7", "seqused_k", "softcap_alibi"])
def test_paged_varlen_options(device, option):
    seqlens_q, seqlens_k = [17, 1, 127, 5], [127, 17, 1, 40]
    kwargs = {}
    if option == "gqa7":
        kwargs = dict(num_heads=7, num_heads_k=1, head_dim=64)
    elif option == "seqused_k":
        kwargs = dict(seqused_k=torch.tensor([100, 3, 0, 40], dtype=torch.int32, device=device),
                      causal=True)
    else:
        kwargs = dict(softcap=2.0, alibi_slopes=torch.rand(6, device=device) * 0.3, causal=True)
    for dtype in dtypes_for(device):
        run_paged(device, dtype, seqlens_q, seqlens_k, 16, **kwargs)


def test_paged_varlen_shared_prefix_pages(device):
    """Two sequences reading the same first pages (prefix caching): each gets what its own
    packed keys give, and a shared page's gradient is the sum of both sequences' gradients."""
    page, dtype = 16, torch.bfloat16
    q = torch.randn(2 * 9, 4, 32, dtype=dtype, device=device)
    pages = torch.randn(5, page, 2, 32, dtype=dtype, device=device)
    block_table = torch.tensor([[3, 0, 1], [3, 0, 4]], dtype=torch.int32, device=device)
    seqlens_k = [40, 37]
    cu_q, cu_k = cu([9, 9], device), cu(seqlens_k, device)
    index = [(block_table[b, torch.arange(n) // page].long(), torch.arange(n) % page)
             for b, n in enumerate(seqlens_k)]
    packed_k = torch.cat([pages[i] for i in index]).requires_grad_()
    packed_v = torch.cat([pages.flip(0)[i] for i in index]).requires_grad_()
    k_pages, v_pages = pages.clone().requires_grad_(), pages.flip(0).clone().requires_grad_()
    dout = torch.randn_like(q)
    paged_out = flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, 9, 40, causal=True,
                                       block_table=block_table)
    packed_out = flash_attn_varlen_func(q, packed_k, packed_v, cu_q, cu_k, 9, 40, causal=True)
    paged_out.backward(dout)
    packed_out.backward(dout)
    torch.testing.assert_close(paged_out, packed_out)
    for grad, packed_grad in ((k_pages.grad, packed_k.grad), (v_pages.grad, packed_v.grad)):
        expected = torch.zeros(pages.shape, dtype=torch.float32, device=device)
        for (page_index, slot), rows in zip(index, packed_grad.float().split(seqlens_k)):
            expected.index_put_((page_index.to(device), slot.to(device)), rows, accumulate=True)
        torch.testing.assert_close(grad.float(), expected, rtol=2e-2, atol=2e-2)


def test_paged_varlen_pages_inside_a_larger_buffer(device):
    """Pages that are a slice of wider ones (page stride != page_size x slot stride) cannot be seen
    as rows; they are read slot by slot and give what the same pages copied contiguous give."""
    wide = torch.randn(6, 32 + 16, 2, 32, dtype=torch.bfloat16, device=device)
    pages = wide[:, :32]
    q = torch.randn(2 * 7, 4, 32, dtype=torch.bfloat16, device=device)
    block_table = torch.tensor([[5, 1], [0, 3]], dtype=torch.int32, device=device)
    args = (cu([7, 7], device), cu([50, 33], device), 7, 50)
    strided = flash_attn_varlen_func(q, pages, pages, *args, block_table=block_table, causal=True)
    contiguous = flash_attn_varlen_func(q, pages.contiguous(), pages.contiguous(), *args,
                                        block_table=block_table, causal=True)
    assert torch.equal(strided, contiguous)


def test_paged_varlen_deterministic_backward_with_shared_pages(device):
    """deterministic=True: gradients of a page three sequences share are bitwise the same from
    run to run (the gather's backward sorts its indices)."""
    q = torch.randn(3 * 5, 4, 32, dtype=torch.float16, device=device)
    pages = torch.randn(4, 16, 2, 32, dtype=torch.float16, device=device)
    block_table = torch.tensor([[2, 0], [2, 1], [2, 3]], dtype=torch.int32, device=device)
    dout = torch.randn_like(q)
    grads = []
    for _ in range(2):
        k_pages, v_pages = pages.clone().requires_grad_(), pages.clone().requires_grad_()
        out = flash_attn_varlen_func(q, k_pages, v_pages, cu([5, 5, 5], device), cu([20, 30, 17], device),
                                     5, 30, block_table=block_table, deterministic=True)
        out.backward(dout)
        grads.append((k_pages.grad, v_pages.grad))
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_paged_varlen_compiles_fullgraph(device):
    """The gather is torch indexing: a paged call traces without a graph break."""
    q = torch.randn(12, 4, 32, dtype=torch.bfloat16, device=device)
    pages = torch.randn(3, 16, 2, 32, dtype=torch.bfloat16, device=device)
    block_table = torch.tensor([[2, 0], [1, 0]], dtype=torch.int32, device=device)
    cu_q, cu_k = cu([5, 7], device), cu([20, 9], device)

    def call(q, pages, block_table):
        return flash_attn_varlen_func(q, pages, pages, cu_q, cu_k, 7, 20, block_table=block_table)

    compiled = torch.compile(call, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(q, pages, block_table), call(q, pages, block_table),
                               rtol=0, atol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("case", ["page out of range", "sequence past max_seqlen_k"])
def test_cuda_paged_bad_contents_give_nan(case):
    """On CUDA nothing is read on the host: a block-table entry a sequence reads that is not a page,
    or a sequence longer than max_seqlen_k, makes every output NaN, with nothing read out of
    bounds (a later call still runs)."""
    device = "cuda"
    q = torch.randn(12, 4, 64, dtype=torch.bfloat16, device=device, requires_grad=True)
    pages = torch.randn(3, 16, 2, 64, dtype=torch.bfloat16, device=device, requires_grad=True)
    good_table = torch.tensor([[2], [0]], dtype=torch.int32, device=device)
    table, cu_k = good_table, cu([5, 9], device)
    if case == "page out of range":
        table = torch.tensor([[2], [1 << 20]], dtype=torch.int32, device=device)
    else:
        cu_k = cu([5, 15], device)
    out = flash_attn_varlen_func(q, pages, pages, cu([5, 7], device), cu_k, 7, 9, block_table=table)
    out.backward(torch.randn_like(out))
    assert torch.isnan(out).all() and torch.isnan(q.grad).all()
    good = flash_attn_varlen_func(q, pages, pages, cu([5, 7], device), cu([5, 9], device), 7, 9,
                                  block_table=good_table)
    torch.cuda.synchronize()
    assert not torch.isnan(good).any()


# Query rows a sequence in each replay: chunks of up to 40 rows (40 x 4 heads a KV group, past
# the KV-cache kernels' limit: the gather), and decode steps of 0-1 rows (the KV-cache kernels).
REPLAYED_ROWS = {
    "prefill chunks": (40, ([40, 40, 40], [17, 40, 3], [1, 0, 40], [40, 33, 2])),
    "decode steps": (1, ([1, 1, 1], [1, 1, 1], [1, 0, 1], [0, 1, 1])),
}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("kind", list(REPLAYED_ROWS))
def test_cuda_paged_varlen_replays_in_a_cuda_graph(kind):
    """A serving step over paged keys reads nothing on the host: one capture replays as the query
    rows, the key lengths and the block table change, equal to the eager call bit for bit."""
    device, dtype, page, batch, max_blocks = "cuda", torch.bfloat16, 16, 3, 8
    max_rows, replays = REPLAYED_ROWS[kind]
    pages = torch.randn(batch * max_blocks + 2, page, 2, 64, dtype=dtype, device=device)
    q = torch.randn(batch * max_rows, 8, 64, dtype=dtype, device=device)
    cu_q = torch.empty(batch + 1, dtype=torch.int32, device=device)
    cu_k = torch.empty(batch + 1, dtype=torch.int32, device=device)
    block_table = torch.empty(batch, max_blocks, dtype=torch.int32, device=device)

    def fill(rows, lengths):
        cu_q.copy_(cu(rows, "cpu"))
        cu_k.copy_(cu(lengths, "cpu"))
        block_table.copy_(torch.randperm(pages.shape[0], dtype=torch.int32)[:batch * max_blocks].view(batch, -1))
        q.normal_()

    def step():
        return flash_attn_varlen_func(q, pages, pages, cu_q, cu_k, max_rows, page * max_blocks, causal=True,
                                      block_table=block_table)

    fill(replays[0], [40, 4, 128])
    graph, graph_out = capture_cuda_graph(step)
    for rows, lengths in zip(replays[1:], ([17, 100, 5], [128, 0, 64], [4, 33, 127])):
        fill(rows, lengths)
        expected = step()
        graph.replay()
        torch.cuda.synchronize()
        used = slice(0, sum(rows))
        assert not expected[used].isnan().any()
        assert torch.equal(graph_out[used], expected[used]), f"replayed output differs for {rows}, {lengths}"


def test_paged_varlen_dropout_is_the_packed_calls(device):
    """Dropout's mask is drawn by (sequence, head, row, key) inside each sequence, so a paged call
    keeps exactly the probabilities the packed call with the same seed keeps."""
    seqlens_q, seqlens_k, page = [9, 1, 30], [40, 17, 33], 16
    q = torch.randn(sum(seqlens_q), 4, 32, dtype=torch.bfloat16, device=device)
    k = torch.randn(sum(seqlens_k), 2, 32, dtype=torch.bfloat16, device=device)
    v = torch.randn_like(k)
    (k_pages, v_pages), block_table, _ = paged_copy((k, v), seqlens_k, page, device)
    cu_q, cu_k = cu(seqlens_q, device), cu(seqlens_k, device)
    results = []
    for keys, values, table in ((k, v, None), (k_pages, v_pages, block_table)):
        torch.manual_seed(1234)
        results.append(flash_attn_varlen_func(q, keys, values, cu_q, cu_k, 30, 40, dropout_p=0.3,
                                              return_attn_probs=True, block_table=table))
    (packed_out, _, packed_probs), (paged_out, _, paged_probs) = results
    assert torch.equal(packed_probs < 0, paged_probs < 0), "a different dropout mask"
    torch.testing.assert_close(paged_out, packed_out)
