"""TILEATTN_CHECK_CONTENTS=on: CUDA calls read their index tensors on the host and raise for a bad
entry naming the argument, as CPU calls always do, where otherwise the kernels give NaN outputs:
varlen cu_seqlens and seqused_k (forward and backward), the KV cache's cache_seqlens, block_table
and colliding appends, paged varlen keys on both of their paths (packed query rows:
test_kvcache_packed_q.py).  Good calls give the same bits with it on; it refuses CUDA-graph
capture and values other than off/on."""

import pytest
import torch

from conftest import capture_cuda_graph
from test_varlen import cu
from test_varlen_paged import paged_copy
from tileattn import flash_attn_varlen_func, flash_attn_with_kvcache

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA only: CPU calls always read contents")
DEVICE = "cuda"
SEQLENS_Q, SEQLENS_K = [3, 5, 1], [7, 2, 9]


@pytest.fixture
def check_contents(monkeypatch):
    monkeypatch.setenv("TILEATTN_CHECK_CONTENTS", "on")


def varlen_args(requires_grad=False):
    q = torch.randn(sum(SEQLENS_Q), 4, 32, dtype=torch.bfloat16, device=DEVICE, requires_grad=requires_grad)
    k = torch.randn(sum(SEQLENS_K), 2, 32, dtype=torch.bfloat16, device=DEVICE, requires_grad=requires_grad)
    v = torch.randn(sum(SEQLENS_K), 2, 32, dtype=torch.bfloat16, device=DEVICE, requires_grad=requires_grad)
    return dict(q=q, k=k, v=v, cu_seqlens_q=cu(SEQLENS_Q, DEVICE), cu_seqlens_k=cu(SEQLENS_K, DEVICE),
                max_seqlen_q=max(SEQLENS_Q), max_seqlen_k=max(SEQLENS_K), causal=True)


def assert_raises_naming(argument, call, error=ValueError):
    with pytest.raises(error) as raised:
        call()
    assert raised.value.argument == argument, str(raised.value)
    torch.cuda.synchronize()  # nothing was launched on bad indices, or the GPU would report it here


BAD_VARLEN = {
    "rows past q": (dict(cu_seqlens_q=torch.tensor([0, 3, 8, 10], dtype=torch.int32)), "cu_seqlens_q"),
    "keys out of order": (dict(cu_seqlens_k=torch.tensor([0, 7, 5, 18], dtype=torch.int32)), "cu_seqlens_k"),
    "longer than max_seqlen_k": (dict(max_seqlen_k=8), "max_seqlen_k"),
    "seqused_k past the keys": (dict(seqused_k=torch.tensor([7, 3, 0], dtype=torch.int32)), "seqused_k"),
}


@pytest.mark.parametrize("case", list(BAD_VARLEN))
def test_bad_varlen_contents_raise(check_contents, case):
    changes, argument = BAD_VARLEN[case]
    args = varlen_args()
    args.update({name: x.to(DEVICE) if isinstance(x, torch.Tensor) else x for name, x in changes.items()})
    assert_raises_naming(argument, lambda: flash_attn_varlen_func(**args))


def test_bad_varlen_contents_raise_in_the_backward(monkeypatch):
    """The backward checks too: a forward run without the setting (NaN outputs), then its
    backward with it."""
    args = varlen_args(requires_grad=True)
    args["cu_seqlens_q"] = torch.tensor([-1, 3, 8, 9], dtype=torch.int32, device=DEVICE)
    out = flash_attn_varlen_func(**args)
    assert torch.isnan(out).all()
    monkeypatch.setenv("TILEATTN_CHECK_CONTENTS", "on")
    assert_raises_naming("cu_seqlens_q", lambda: out.sum().backward())


def test_good_calls_give_the_same_bits(monkeypatch):
    args = dict(varlen_args(requires_grad=True), deterministic=True)  # dq without atomics' order
    results = []
    for setting in ("off", "on"):
        monkeypatch.setenv("TILEATTN_CHECK_CONTENTS", setting)
        out = flash_attn_varlen_func(**args)
        grads = torch.autograd.grad(out.float().square().sum(), (args["q"], args["k"], args["v"]))
        results.append((out,) + grads)
    for off, on in zip(*results):
        assert torch.equal(off, on)


def kvcache_args(paged):
    cache = torch.randn(3, 64, 2, 32, dtype=torch.bfloat16, device=DEVICE)
    args = dict(q=torch.randn(2, 1, 4, 32, dtype=torch.bfloat16, device=DEVICE), k_cache=cache,
                v_cache=cache.clone(), cache_seqlens=torch.tensor([5, 40], dtype=torch.int32, device=DEVICE))
    if paged:
        args["k_cache"], args["v_cache"] = (c.view(12, 16, 2, 32) for c in (args["k_cache"], args["v_cache"]))
        args["block_table"] = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]], dtype=torch.int32, device=DEVICE)
    return args


def test_bad_kvcache_contents_raise(check_contents):
    args = kvcache_args(paged=False)
    args["cache_seqlens"] = torch.tensor([5, 65], dtype=torch.int32, device=DEVICE)
    assert_raises_naming("cache_seqlens", lambda: flash_attn_with_kvcache(**args))
    args = kvcache_args(paged=True)
    args["block_table"][1, 2] = 12
    assert_raises_naming("block_table", lambda: flash_attn_with_kvcache(**args))


def test_colliding_appends_raise(check_contents):
    """The check the kernels do not make: two sequences appending into one cache entry."""
    args = kvcache_args(paged=False)
    new = torch.randn(2, 1, 2, 32, dtype=torch.bfloat16, device=DEVICE)
    args.update(k=new, v=new.clone(), cache_batch_idx=torch.tensor([1, 1], dtype=torch.int32, device=DEVICE))
    assert_raises_naming("cache_batch_idx", lambda: flash_attn_with_kvcache(**args))


@pytest.mark.parametrize("path", ["kvcache kernels", "gather"])
def test_bad_paged_varlen_keys_raise(check_contents, path):
    k = torch.randn(sum(SEQLENS_K), 2, 32, dtype=torch.bfloat16, device=DEVICE)
    (k_pages, v_pages), block_table, _ = paged_copy((k, k.clone()), SEQLENS_K, 16, DEVICE)
    block_table[2, 0] = k_pages.shape[0]
    rows = [1, 1, 1] if path == "kvcache kernels" else [40, 1, 1]  # 40 x 2 rows a KV group: gathered
    q = torch.randn(sum(rows), 4, 32, dtype=torch.bfloat16, device=DEVICE)
    assert_raises_naming("block_table", lambda: flash_attn_varlen_func(
        q, k_pages, v_pages, cu(rows, DEVICE), cu(SEQLENS_K, DEVICE), max(rows), max(SEQLENS_K),
        block_table=block_table))


def test_capture_is_refused(check_contents):
    args = varlen_args()
    flash_attn_varlen_func(**args)
    with pytest.raises(RuntimeError) as raised:
        capture_cuda_graph(lambda: flash_attn_varlen_func(**args), warm_up=lambda: None)
    assert raised.value.argument == "TILEATTN_CHECK_CONTENTS", str(raised.value)


def test_other_values_are_refused(monkeypatch):
    monkeypatch.setenv("TILEATTN_CHECK_CONTENTS", "1")
    assert_raises_naming("TILEATTN_CHECK_CONTENTS", lambda: flash_attn_varlen_func(**varlen_args()))
