"""Every bad input raises ValueError / TypeError / RuntimeError naming the argument, before
anything runs; the SDPA (B, H, S, D) layout mistake is called out where shapes reveal it."""

import itertools

import pytest
import torch

import tileattn
from tileattn import _paged_varlen, _paged_varlen_kvcache
from tileattn import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                      flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                      flash_attn_varlen_qkvpacked_func)


def t(*shape, dtype=torch.float16, device="cpu"):
    return torch.randn(*shape, device=device).to(dtype)


def i32(*values, device="cpu"):
    return torch.tensor(values, dtype=torch.int32, device=device)


q, k, v = t(2, 9, 4, 16), t(2, 11, 2, 16), t(2, 11, 2, 16)
vq, vk = t(20, 4, 16), t(15, 2, 16)
cu_q, cu_k = i32(0, 8, 20), i32(0, 5, 15)


def pages_of(*rows):
    """A (len(rows), 1) block table: one page a sequence."""
    return torch.tensor([[r] for r in rows], dtype=torch.int32)


def paged(**changes):
    args = dict(q=vq, k=t(4, 16, 2, 16), v=t(4, 16, 2, 16), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                max_seqlen_q=12, max_seqlen_k=10, block_table=pages_of(2, 0))
    args.update(changes)
    return flash_attn_varlen_func(**args)

CASES = {
    # name: (call, exception, argument named in the message)
    "q not a tensor": (lambda: flash_attn_func(q.tolist(), k, v), TypeError, "q"),
    "q 3-D": (lambda: flash_attn_func(q[0], k, v), ValueError, "q"),
    "k 5-D": (lambda: flash_attn_func(q, k[None], v), ValueError, "k"),
    "int dtype": (lambda: flash_attn_func(q.int(), k.int(), v.int()), TypeError, "q"),
    "float64": (lambda: flash_attn_func(q.double(), k.double(), v.double()), TypeError, "q"),
    "mixed dtypes": (lambda: flash_attn_func(q, k.bfloat16(), v), TypeError, "k"),
    "batch mismatch": (lambda: flash_attn_func(q, k[:1], v[:1]), ValueError, "k"),
    "head dim mismatch": (lambda: flash_attn_func(q, t(2, 11, 2, 8), v), ValueError, "k"),
    "v shape": (lambda: flash_attn_func(q, k, t(2, 12, 2, 16)), ValueError, "v"),
    "heads do not divide": (lambda: flash_attn_func(q, t(2, 11, 3, 16), t(2, 11, 3, 16)),
                            ValueError, "k"),
    "head dim 300": (lambda: flash_attn_func(t(1, 2, 1, 300), t(1, 2, 1, 300), t(1, 2, 1, 300)),
                     ValueError, "q"),
    "head dim 0": (lambda: flash_attn_func(t(1, 2, 1, 0), t(1, 2, 1, 0), t(1, 2, 1, 0)),
                   ValueError, "q"),
    "dropout 1": (lambda: flash_attn_func(q, k, v, dropout_p=1.0), ValueError, "dropout_p"),
    "dropout negative": (lambda: flash_attn_func(q, k, v, dropout_p=-0.1), ValueError, "dropout_p"),
    # Options that are not numbers: the library's own range rules would never see them.
    "dropout a string": (lambda: flash_attn_func(q, k, v, dropout_p="0.1"), ValueError, "dropout_p"),
    "scale 0": (lambda: flash_attn_func(q, k, v, softmax_scale=0.0), ValueError, "softmax_scale"),
    "scale inf": (lambda: flash_attn_func(q, k, v, softmax_scale=float("inf")), ValueError,
                  "softmax_scale"),
    "window -2": (lambda: flash_attn_func(q, k, v, window_size=(-2, 0)), ValueError, "window_size"),
    "window 1 entry": (lambda: flash_attn_func(q, k, v, window_size=(3,)), ValueError,
                       "window_size"),
    "window float": (lambda: flash_attn_func(q, k, v, window_size=(3.0, 1)), ValueError,
                     "window_size"),
    "softcap negative": (lambda: flash_attn_func(q, k, v, softcap=-1.0), ValueError, "softcap"),
    # float32 holds these: 1e-46 would reach the library as 0 (softcap off, the default scale).
    "softcap underflows float32": (lambda: flash_attn_func(q, k, v, softcap=1e-46), ValueError, "softcap"),
    "scale underflows float32": (lambda: flash_attn_func(q, k, v, softmax_scale=1e-46), ValueError,
                                 "softmax_scale"),
    "scale overflows float32": (lambda: flash_attn_func(q, k, v, softmax_scale=1e39), ValueError,
                                "softmax_scale"),
    "softcap nan": (lambda: flash_attn_func(q, k, v, softcap=float("nan")), ValueError, "softcap"),
    "softcap a string": (lambda: flash_attn_func(q, k, v, softcap="3"), ValueError, "softcap"),
    "qkv head dim 264": (lambda: flash_attn_qkvpacked_func(t(1, 4, 3, 1, 264)), ValueError, "qkv"),
    "q 0 heads with alibi": (lambda: flash_attn_func(t(2, 9, 0, 16), k, v, alibi_slopes=torch.ones(0)),
                             ValueError, "q"),
    "alibi float16": (lambda: flash_attn_func(q, k, v, alibi_slopes=torch.ones(4).half()),
                      TypeError, "alibi_slopes"),
    "alibi shape": (lambda: flash_attn_func(q, k, v, alibi_slopes=torch.ones(3)), ValueError,
                    "alibi_slopes"),
    "alibi batch": (lambda: flash_attn_func(q, k, v, alibi_slopes=torch.ones(3, 4)), ValueError,
                    "alibi_slopes"),
    "qkv 4-D": (lambda: flash_attn_qkvpacked_func(t(2, 9, 12, 16)), ValueError, "qkv"),
    "qkv not 3": (lambda: flash_attn_qkvpacked_func(t(2, 9, 2, 4, 16)), ValueError, "qkv"),
    "kv not 2": (lambda: flash_attn_kvpacked_func(q, t(2, 11, 3, 2, 16)), ValueError, "kv"),
    "kv heads": (lambda: flash_attn_kvpacked_func(q, t(2, 11, 2, 3, 16)), ValueError, "kv"),
    "varlen q 4-D": (lambda: flash_attn_varlen_func(q, vk, vk, cu_q, cu_k, 12, 10), ValueError,
                     "q"),
    "cu_seqlens int64": (lambda: flash_attn_varlen_func(vq, vk, vk, cu_q.long(), cu_k, 12, 10),
                         TypeError, "cu_seqlens_q"),
    "cu_seqlens 2-D": (lambda: flash_attn_varlen_func(vq, vk, vk, cu_q[None], cu_k, 12, 10),
                       ValueError, "cu_seqlens_q"),
    "cu_seqlens_k length": (lambda: flash_attn_varlen_func(vq, vk, vk, cu_q, i32(0, 15), 12, 10),
                            ValueError, "cu_seqlens_k"),
    "max_seqlen 0": (lambda: flash_attn_varlen_func(vq, vk, vk, cu_q, cu_k, 0, 10), ValueError,
                     "max_seqlen_q"),
    "max_seqlen past int32": (lambda: flash_attn_varlen_func(vq, vk, vk, cu_q, cu_k, 12, 2**32),
                              ValueError, "max_seqlen_k"),
    "max_seqlen float": (lambda: flash_attn_varlen_func(vq, vk, vk, cu_q, cu_k, 12, 10.0),
                         ValueError, "max_seqlen_k"),
    # Checked by the library (device-side contents), surfaced with its argument name.
    "cu_seqlens not monotone": (lambda: flash_attn_varlen_func(vq, vk, vk, i32(0, 12, 8), cu_k,
                                                               12, 10), ValueError, "cu_seqlens_q"),
    "cu_seqlens past total": (lambda: flash_attn_varlen_func(vq, vk, vk, cu_q, i32(0, 5, 16), 12,
                                                             11), ValueError, "cu_seqlens_k"),
    "max_seqlen too small": (lambda: flash_attn_varlen_func(vq, vk, vk, cu_q, cu_k, 11, 10),
                             ValueError, "max_seqlen_q"),
    "seqused_k too long": (lambda: flash_attn_varlen_func(vq, vk, vk, cu_q, cu_k, 12, 10,
                                                          seqused_k=i32(6, 1)),
                           ValueError, "seqused_k"),
    "seqused_k shape": (lambda: flash_attn_varlen_func(vq, vk, vk, cu_q, cu_k, 12, 10,
                                                       seqused_k=i32(1)), ValueError, "seqused_k"),
    "varlen qkv not 3": (lambda: flash_attn_varlen_qkvpacked_func(t(20, 2, 4, 16), cu_q, 12),
                         ValueError, "qkv"),
    "varlen cu_seqlens int64": (lambda: flash_attn_varlen_qkvpacked_func(t(20, 3, 4, 16),
                                                                         cu_q.long(), 12),
                                TypeError, "cu_seqlens"),
    "varlen kv heads": (lambda: flash_attn_varlen_kvpacked_func(vq, t(15, 2, 3, 16), cu_q, cu_k,
                                                                12, 10), ValueError, "kv"),
    "varlen alibi": (lambda: flash_attn_varlen_func(vq, vk, vk, cu_q, cu_k, 12, 10,
                                                    alibi_slopes=torch.ones(3, 4)),
                     ValueError, "alibi_slopes"),
    # Paged keys: pages (4, 16, 2, 16), block_table (2, 1); sequences of 5 and 10 keys.
    "paged block_table int64": (lambda: paged(block_table=pages_of(0, 1).long()), TypeError,
                                "block_table"),
    "paged block_table rows": (lambda: paged(block_table=pages_of(0)), ValueError, "block_table"),
    "paged block_table 1-D": (lambda: paged(block_table=i32(0, 1)), ValueError, "block_table"),
    "paged too few pages": (lambda: paged(max_seqlen_k=17), ValueError, "block_table"),
    "paged page size 8": (lambda: paged(k=t(4, 8, 2, 16), v=t(4, 8, 2, 16)), ValueError, "k"),
    "paged k 3-D": (lambda: paged(k=vk), ValueError, "k"),
    "paged no pages": (lambda: paged(k=t(0, 16, 2, 16), v=t(0, 16, 2, 16)), ValueError, "k"),
    "paged v shape": (lambda: paged(v=t(4, 32, 2, 16)), ValueError, "v"),
    "paged head dim": (lambda: paged(k=t(4, 16, 2, 8), v=t(4, 16, 2, 8)), ValueError, "k"),
    # Contents, checked on the host for CPU tensors (on CUDA: NaN outputs, test_varlen_paged.py).
    "paged entry out of range": (lambda: paged(block_table=pages_of(0, 4)), ValueError,
                                 "block_table"),
    "paged negative entry": (lambda: paged(block_table=pages_of(-1, 1)), ValueError, "block_table"),
    "paged sequence past max_seqlen_k": (lambda: paged(cu_seqlens_k=i32(0, 5, 17)), ValueError,
                                         "cu_seqlens_k"),
    "paged keys not monotone": (lambda: paged(cu_seqlens_k=i32(0, 5, 3)), ValueError,
                                "cu_seqlens_k"),
    "paged seqused_k too long": (lambda: paged(seqused_k=i32(6, 1)), ValueError, "seqused_k"),
    "paged rows past q": (lambda: paged(cu_seqlens_q=i32(0, 9, 21)), ValueError, "cu_seqlens_q"),
    "paged rows not monotone": (lambda: paged(cu_seqlens_q=i32(0, 8, 5)), ValueError, "cu_seqlens_q"),
    "paged rows start below 0": (lambda: paged(cu_seqlens_q=i32(-1, 8, 20)), ValueError, "cu_seqlens_q"),
    "paged sequence past max_seqlen_q": (lambda: paged(max_seqlen_q=11), ValueError, "max_seqlen_q"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_names_the_argument(case):
    call, error, argument = CASES[case]
    with pytest.raises(error) as raised:
        call()
    assert raised.value.argument == argument, str(raised.value)
    assert argument in str(raised.value)


def test_sdpa_layout_mistake_is_called_out():
    # SDPA layout: q (B, H=8, Sq=100, D), k/v (B, Hk=2, Sk=300, D).  Read as flash-attn's
    # (B, S, H, D) the "heads" 100 and 300 do not divide; read as SDPA's they do.
    q_sdpa, kv_sdpa = t(1, 8, 100, 16), t(1, 2, 300, 16)
    with pytest.raises(ValueError, match=r"SDPA.*\(batch, seqlen, nheads, headdim\)"):
        flash_attn_func(q_sdpa, kv_sdpa, kv_sdpa)
    # The same tensors in flash-attn's layout work.
    flash_attn_func(q_sdpa.transpose(1, 2), kv_sdpa.transpose(1, 2), kv_sdpa.transpose(1, 2))
    # ALiBi slopes sized for the SDPA heads dim.
    with pytest.raises(ValueError, match="SDPA"):
        flash_attn_func(t(1, 8, 100, 16), t(1, 8, 100, 16), t(1, 8, 100, 16),
                        alibi_slopes=torch.ones(8))


def test_device_mismatch():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device to mix devices")
    with pytest.raises(ValueError) as raised:
        flash_attn_func(q, k.cuda(), v)
    assert raised.value.argument == "k"


# Tensors a call takes beside q, k and v: name -> the call family that takes it.
_SIDE_TENSORS = {"alibi_slopes": "dense", "cu_seqlens_q": "varlen", "cu_seqlens_k": "varlen",
                 "seqused_k": "varlen", "block_table": "paged", "cache_seqlens": "kvcache",
                 "cache_batch_idx": "kvcache", "cache_leftpad": "kvcache"}


def _gpu_call(family, left_on_cpu=None):
    """A valid call of `family` with every tensor on the GPU, except `left_on_cpu`."""
    place = lambda x, name: x if name == left_on_cpu else x.cuda()
    gq, gvq, gvk = q.cuda(), vq.cuda(), vk.cuda()
    if family == "dense":
        return flash_attn_func(gq, k.cuda(), v.cuda(),
                               alibi_slopes=place(torch.ones(4), "alibi_slopes"))
    if family == "varlen":
        return flash_attn_varlen_func(gvq, gvk, gvk, place(cu_q, "cu_seqlens_q"),
                                      place(cu_k, "cu_seqlens_k"), 12, 10,
                                      seqused_k=place(i32(5, 10), "seqused_k"))
    if family == "paged":
        return paged(q=gvq, k=t(4, 16, 2, 16).cuda(), v=t(4, 16, 2, 16).cuda(),
                     cu_seqlens_q=cu_q.cuda(), cu_seqlens_k=cu_k.cuda(),
                     block_table=place(pages_of(2, 0), "block_table"))
    cache = t(2, 16, 2, 16).cuda()
    index = {"cache_seqlens": i32(3, 5), "cache_batch_idx": i32(1, 0), "cache_leftpad": i32(0, 1)}
    return tileattn.flash_attn_with_kvcache(
        gq[:, :1], cache, cache.clone(), **{name: place(x, name) for name, x in index.items()})


@pytest.mark.parametrize("name", list(_SIDE_TENSORS))
def test_side_tensor_on_another_device(name):
    """Index tensors and ALiBi slopes must be on q's device too: a CPU pointer read by a GPU kernel
    would be a crash or garbage, so the check names the tensor first."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device to mix devices")
    with pytest.raises(ValueError) as raised:
        _gpu_call(_SIDE_TENSORS[name], left_on_cpu=name)
    assert raised.value.argument == name
    assert "is on cpu but q is on cuda" in str(raised.value)


@pytest.mark.parametrize("family", sorted(set(_SIDE_TENSORS.values())))
def test_side_tensor_calls_run_all_on_the_gpu(family):
    """The calls above are valid but for the one tensor left behind."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    assert _gpu_call(family).is_cuda


def test_paged_call_of_the_cases_runs(monkeypatch):
    """The paged cases above start from a call that works, and it runs on the KV-cache kernels
    (no gradient, 12 query rows x 2 heads a KV group)."""
    gathered = []
    monkeypatch.setattr(_paged_varlen, "gather_paged_keys", lambda *args: gathered.append(args))
    assert paged().shape == vq.shape and not gathered


@pytest.mark.parametrize("case", [name for name in CASES if name.startswith("paged")])
def test_paged_cases_raise_alike_through_the_gather(case, monkeypatch):
    """A paged call that wants a gradient is gathered instead (_paged_varlen.py): the same bad
    input names the same argument there."""
    monkeypatch.setattr(_paged_varlen_kvcache, "applies", lambda *args: False)
    test_bad_input_names_the_argument(case)


def test_nothing_runs_on_bad_input():
    """A rejected call leaves no trace: the generator is not advanced and no gradient graph is
    built."""
    state = torch.get_rng_state()
    leaf = q.clone().requires_grad_()
    with pytest.raises(ValueError):
        flash_attn_func(leaf, k, v, dropout_p=0.5, window_size=(-5, 0))
    assert torch.equal(state, torch.get_rng_state())
    assert leaf.grad is None


def test_unknown_forward_family_is_an_error(monkeypatch):
    """TILEATTN_FORWARD_FAMILY is read by the CUDA forward on every call; a typo must not silently
    pick a kernel family."""
    if not (torch.cuda.is_available() and tileattn.has_cuda()):
        pytest.skip("the forward family is chosen by the CUDA backend")
    monkeypatch.setenv("TILEATTN_FORWARD_FAMILY", "sm91")
    x = torch.randn(1, 64, 2, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError) as raised:
        flash_attn_func(x, x, x)
    assert raised.value.argument == "TILEATTN_FORWARD_FAMILY"
    monkeypatch.setenv("TILEATTN_FORWARD_FAMILY", "sm80")
    torch.testing.assert_close(flash_attn_func(x, x, x), tileattn_auto_family(x), rtol=0, atol=1e-2)


def _sm90_forward_choice_results(monkeypatch, variable, head_dim, cases, choices):
    """Skips unless the GPU runs the sm90 forward; checks that a typo in `variable` raises naming
    it; returns, for each case (sq, sk, causal, window), each choice's output and LSE."""
    if not (torch.cuda.is_available() and tileattn.has_cuda()
            and torch.cuda.get_device_capability() == (9, 0)):
        pytest.skip(f"{variable} picks among the sm90 forward's kernels")
    # The suite also runs with the sm80 family forced, which never reads the variable.
    monkeypatch.setenv("TILEATTN_FORWARD_FAMILY", "sm90")
    monkeypatch.setenv(variable, "yes")
    x = torch.randn(1, 256, 2, head_dim, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError) as raised:
        flash_attn_func(x, x, x, causal=True)
    assert raised.value.argument == variable
    per_case = []
    for sq, sk, causal, window in cases:
        q = torch.randn(2, sq, 4, head_dim, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(2, sk, 2, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        results = {}
        for choice in choices:
            monkeypatch.setenv(variable, choice)
            out, lse, _ = flash_attn_func(q, k, v, causal=causal, window_size=window, return_attn_probs=True)
            results[choice] = (out, lse)
        per_case.append(results)
    return per_case


def test_kv_multicast_choice(monkeypatch):
    """TILEATTN_FORWARD_KV_MULTICAST picks the Hopper forward whose K/V loads two CTAs share: a typo
    raises naming it, and on and off give bitwise the same output and LSE (the same products in
    the same order), at an even count of query blocks and at one block (whose cluster's second
    CTA has no rows), without a mask, causal (the first tile of a cluster walks its peer's extra
    block without products) and with a right window only."""
    cases = [(256, 300, False, (-1, -1)), (17, 1000, False, (-1, -1)), (256, 300, True, (-1, -1)),
             (1000, 700, True, (-1, -1)), (384, 384, False, (-1, 77))]
    for results in _sm90_forward_choice_results(monkeypatch, "TILEATTN_FORWARD_KV_MULTICAST", 128, cases,
                                                ("on", "off")):
        assert torch.equal(results["on"][0], results["off"][0]) and torch.equal(results["on"][1], results["off"][1])


def test_short_walk_choice(monkeypatch):
    """TILEATTN_FORWARD_SHORT_WALK picks the Hopper d64 forward on 64-key blocks: a typo raises
    naming it; auto runs it (bitwise the same output and LSE as on) for causal or right-windowed
    calls of at most 1536 keys, and the 128-key kernel (the same bits as off) otherwise; on and off
    agree to bf16 rounding."""
    cases = [(512, 512, True, (-1, -1)), (1000, 700, True, (-1, -1)), (384, 384, False, (-1, 77)),
             (300, 1536, True, (-1, -1)), (300, 1537, True, (-1, -1)), (17, 1000, False, (-1, -1))]
    auto_takes_it = [True, True, True, True, False, False]
    per_case = _sm90_forward_choice_results(monkeypatch, "TILEATTN_FORWARD_SHORT_WALK", 64, cases,
                                            ("on", "off", "auto"))
    for results, expected in zip(per_case, auto_takes_it):
        # The two kernels sum over different blocks, so equal bits would mean one kernel ran twice.
        assert not torch.equal(results["on"][0], results["off"][0])
        chosen = results["on" if expected else "off"]
        assert torch.equal(results["auto"][0], chosen[0]) and torch.equal(results["auto"][1], chosen[1])
        torch.testing.assert_close(results["on"][0], results["off"][0], rtol=0, atol=2e-2)
        torch.testing.assert_close(results["on"][1], results["off"][1], rtol=0, atol=1e-4)


def _assert_tile_orders_agree(monkeypatch, variable, cases):
    """For each head dim and case (sq, sk, causal, window) over 8 sequences x 16 query heads over 4,
    `variable` = on, off and auto give bitwise the same output and LSE: a tile order only moves
    tiles between CTAs, and one run twice or skipped would leave rows that differ."""
    for head_dim in (64, 128, 256):
        for sq, sk, causal, window in cases:
            q = torch.randn(8, sq, 16, head_dim, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(8, sk, 4, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            results = {}
            for choice in ("on", "off", "auto"):
                monkeypatch.setenv(variable, choice)
                out, lse, _ = flash_attn_func(q, k, v, causal=causal, window_size=window, return_attn_probs=True)
                results[choice] = (out, lse)
            for choice in ("off", "auto"):
                assert torch.equal(results["on"][0], results[choice][0]), (head_dim, sq, sk, window, choice)
                assert torch.equal(results["on"][1], results[choice][1]), (head_dim, sq, sk, window, choice)
            assert torch.isfinite(results["on"][0]).all()


def test_stagger_choice(monkeypatch):
    """TILEATTN_FORWARD_STAGGER orders the sm90 forward's short causal or windowed tiles in staggered
    halves (src/cuda/sm90/tile_scheduler.h): a typo raises naming it, and the order only moves
    tiles between CTAs, so on, off and auto give bitwise the same output and LSE.  The shapes have
    enough (batch, head) pairs for the order to apply on 132 SMs (128 pairs over half-groups of 33
    at 128-row tiles, 44 at d64's 192-row ones) and partial last half-groups; a tile run twice or
    skipped would leave rows that differ."""
    # The typo check (and the skip off Hopper); the cases below need more pairs than it makes.
    _sm90_forward_choice_results(monkeypatch, "TILEATTN_FORWARD_STAGGER", 128, [], ())
    _assert_tile_orders_agree(monkeypatch, "TILEATTN_FORWARD_STAGGER",
                              [(512, 512, True, (-1, -1)), (500, 512, True, (-1, -1)), (512, 512, False, (256, 0))])


def test_pair_major_choice(monkeypatch):
    """TILEATTN_FORWARD_PAIR_MAJOR runs the sm90 forward's two-round groups of causal or windowed
    tiles (batch, head) pair by pair (src/cuda/sm90/tile_scheduler.h): a typo raises naming it,
    and the order only moves tiles between CTAs, so on, off and auto give bitwise the same output
    and LSE.  On takes the short calls' order (their groups fit the L2), auto takes it for the
    query rows a few blocks long over 8k keys (132 pairs x 1 MB of K/V a group on 132 SMs); odd
    rows leave a partial last tile."""
    _sm90_forward_choice_results(monkeypatch, "TILEATTN_FORWARD_PAIR_MAJOR", 128, [], ())
    _assert_tile_orders_agree(monkeypatch, "TILEATTN_FORWARD_PAIR_MAJOR",
                              [(512, 512, True, (-1, -1)), (500, 512, True, (-1, -1)), (512, 512, False, (256, 0)),
                               (256, 8192, True, (-1, -1)), (250, 8192, True, (-1, -1))])


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_key_split_of_sequence_bounds_calls(monkeypatch, head_dim):
    """The sequence-bounds kernels (varlen, seqused_k) cut a call of few tiles into key shares on
    the device (the key split, src/cuda/sm90/tail_split.h) under TILEATTN_FORWARD_TAIL_SPLIT: on
    agrees with off to bf16 rounding, causal and windowed too, with sequences of no key and no query
    row among them, gives the same bits on every run (the shares merge in part order), and auto
    takes it for two sequences of 6k keys and 100 query rows (one tile a head); on leaves a call of
    more tiles than slots whole."""
    if not (torch.cuda.is_available() and tileattn.has_cuda()
            and torch.cuda.get_device_capability() == (9, 0)):
        pytest.skip("the key split is the sm90 forward's")
    monkeypatch.setenv("TILEATTN_FORWARD_FAMILY", "sm90")
    monkeypatch.setenv("TILEATTN_FORWARD_SHORT_WALK", "off")
    heads, heads_k = 4, 2
    cases = [([100, 37], [6000, 5000], False, (-1, -1)), ([100, 0, 70], [300, 900, 0], True, (-1, -1)),
             ([129, 5], [2000, 2000], False, (300, 0)), ([1, 17], [1, 1000], True, (-1, -1))]
    for seqlens_q, seqlens_k, causal, window in cases:
        q = torch.randn(sum(seqlens_q), heads, head_dim, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(sum(seqlens_k), heads_k, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        cu_q = torch.tensor([0] + list(itertools.accumulate(seqlens_q)), device="cuda", dtype=torch.int32)
        cu_k = torch.tensor([0] + list(itertools.accumulate(seqlens_k)), device="cuda", dtype=torch.int32)
        results = {}
        for choice in ("on", "off", "auto", "on again"):
            monkeypatch.setenv("TILEATTN_FORWARD_TAIL_SPLIT", choice.split()[0])
            out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(seqlens_q), max(seqlens_k), causal=causal,
                                                 window_size=window, return_attn_probs=True)
            results[choice] = (out.clone(), lse.clone())
        on, off, auto, again = results["on"], results["off"], results["auto"], results["on again"]
        assert torch.equal(on[0], again[0]) and torch.equal(on[1], again[1])
        torch.testing.assert_close(on[0], off[0], rtol=0, atol=2e-2)
        finite = torch.isfinite(off[1])
        assert torch.equal(finite, torch.isfinite(on[1]))
        torch.testing.assert_close(on[1][finite], off[1][finite], rtol=0, atol=1e-4)
        if seqlens_k[0] >= 5000:
            # Equal LSE bits would mean nothing was cut.  Auto cuts into fewer shares than on (at
            # least 4 key blocks a share, on takes every slot), so its bits are its own.
            assert not torch.equal(on[1], off[1]) and not torch.equal(auto[1], off[1])
            torch.testing.assert_close(auto[0], off[0], rtol=0, atol=2e-2)
            torch.testing.assert_close(auto[1], off[1], rtol=0, atol=1e-4)
    # On leaves a call of more tiles than CTA slots whole (the partials' workspace bound,
    # tail_split_choice.h): 100 sequences x 4 heads = 400 tiles, off's bits.
    q = torch.randn(100 * 128, heads, head_dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(100 * 1024, heads_k, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    cu_q, cu_k = (torch.arange(0, 101 * n, n, device="cuda", dtype=torch.int32) for n in (128, 1024))
    bits = []
    for choice in ("on", "off"):
        monkeypatch.setenv("TILEATTN_FORWARD_TAIL_SPLIT", choice)
        bits.append(flash_attn_varlen_func(q, k, v, cu_q, cu_k, 128, 1024, return_attn_probs=True)[:2])
    assert torch.equal(bits[0][0], bits[1][0]) and torch.equal(bits[0][1], bits[1][1])


@pytest.mark.parametrize("head_dim, multicast", [(64, "off"), (128, "off"), (128, "on"), (256, "on")])
def test_tail_split_choice(monkeypatch, head_dim, multicast):
    """TILEATTN_FORWARD_TAIL_SPLIT cuts the sm90 forward's last tiles along their keys (stream-K,
    src/cuda/sm90/tail_split.h): a typo raises naming it; on agrees with off to bf16 rounding where
    tiles are cut (in two to eight pieces here: 3 and 8 key blocks over fewer tiles than SMs) with
    or without the cluster kernel, and gives the same bits on every run (the pieces merge in CTA
    order, not arrival order); calls with a causal or window mask never split (on and off the same
    bits); auto takes it for one head of 8k keys (64 tiles on 132 SMs) and gives on's bits."""
    if not (torch.cuda.is_available() and tileattn.has_cuda()
            and torch.cuda.get_device_capability() == (9, 0)):
        pytest.skip("TILEATTN_FORWARD_TAIL_SPLIT changes the sm90 forward's walk")
    monkeypatch.setenv("TILEATTN_FORWARD_FAMILY", "sm90")  # the suite also forces sm80
    monkeypatch.setenv("TILEATTN_FORWARD_KV_MULTICAST", multicast)
    # The d64 short-walk kernel never splits (it serves masked calls under auto); the suite forces it on.
    monkeypatch.setenv("TILEATTN_FORWARD_SHORT_WALK", "off")
    monkeypatch.setenv("TILEATTN_FORWARD_TAIL_SPLIT", "yes")
    x = torch.randn(1, 256, 2, head_dim, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError) as raised:
        flash_attn_func(x, x, x, causal=True)  # read at every call, where no split could run too
    assert raised.value.argument == "TILEATTN_FORWARD_TAIL_SPLIT"
    cases = [(256, 300, False, (-1, -1), 4), (17, 1000, False, (-1, -1), 4), (1000, 700, True, (-1, -1), 4),
             (384, 384, False, (-1, 77), 4), (8192, 8192, False, (-1, -1), 1)]
    per_case = []
    for sq, sk, causal, window, heads in cases:
        q = torch.randn(1, sq, heads, head_dim, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(1, sk, max(heads // 2, 1), head_dim, device="cuda", dtype=torch.bfloat16)
                for _ in range(2))
        results = {}
        for choice in ("on", "off", "auto", "on again"):
            monkeypatch.setenv("TILEATTN_FORWARD_TAIL_SPLIT", choice.split()[0])
            out, lse, _ = flash_attn_func(q, k, v, causal=causal, window_size=window, return_attn_probs=True)
            results[choice] = (out, lse)
        per_case.append(results)
    for (sq, sk, causal, window, heads), results in zip(cases, per_case):
        on, off, auto, again = results["on"], results["off"], results["auto"], results["on again"]
        assert torch.equal(on[0], again[0]) and torch.equal(on[1], again[1])
        if causal or window != (-1, -1):
            assert torch.equal(on[0], off[0]) and torch.equal(on[1], off[1])
            continue
        # Cut tiles sum their pieces in another order: equal LSE bits would mean nothing was cut.
        assert not torch.equal(on[1], off[1])
        torch.testing.assert_close(on[0], off[0], rtol=0, atol=2e-2)
        torch.testing.assert_close(on[1], off[1], rtol=0, atol=1e-4)
        same_as = {name: torch.equal(auto[0], r[0]) and torch.equal(auto[1], r[1])
                   for name, r in (("on", on), ("off", off))}
        assert same_as["on"] if sq == 8192 else same_as["on"] or same_as["off"]


# TILEATTN_BACKWARD_FAMILY picks the backward's products (wgmma on Hopper, else mma.sync);
# TILEATTN_BACKWARD_WS the warp-specialized Hopper kernel (auto, 0 or 1; auto picks by head dim and length).
@pytest.mark.parametrize("variable, typo, choices, head_dim", [
    ("TILEATTN_BACKWARD_FAMILY", "sm91", ("sm80", "auto"), 64),
    ("TILEATTN_BACKWARD_WS", "yes", ("0", "1"), 128),
])
def test_unknown_backward_choice_is_an_error(monkeypatch, variable, typo, choices, head_dim):
    """A typo in a backward kernel choice raises naming the variable; the valid choices give the
    same gradients to bf16 rounding."""
    if not (torch.cuda.is_available() and tileattn.has_cuda()):
        pytest.skip("the backward kernel is chosen by the CUDA backend")
    x = torch.randn(1, 64, 2, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out = flash_attn_func(x, x, x)
    monkeypatch.setenv(variable, typo)
    with pytest.raises(ValueError) as raised:
        out.backward(torch.ones_like(out), retain_graph=True)
    assert raised.value.argument == variable
    grads = []
    for choice in choices:
        monkeypatch.setenv(variable, choice)
        x.grad = None
        out.backward(torch.ones_like(out), retain_graph=True)
        grads.append(x.grad.clone())
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=2e-2)


def tileattn_auto_family(x):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TILEATTN_FORWARD_FAMILY", "auto")
        return flash_attn_func(x, x, x)


@pytest.mark.skipif(not (torch.cuda.is_available() and tileattn.has_cuda()),
                    reason="needs the CUDA backend")
@pytest.mark.parametrize("heads_k", [4, 2])
def test_cuda_backward_refuses_a_short_workspace(monkeypatch, heads_k):
    """The package takes the backward's scratch from torch at the size the library asks for; a
    workspace shorter than that is refused naming it (GQA needs the expanded dK/dV too)."""
    from tileattn import _ffi
    lib = _ffi.library()
    real, sizes = lib.backward_workspace_size, []
    monkeypatch.setattr(lib, "backward_workspace_size", lambda p: sizes.append(real(p)) or 256)
    qc = t(1, 64, 4, 64, dtype=torch.bfloat16, device="cuda").requires_grad_()
    kc, vc = (t(1, 64, heads_k, 64, dtype=torch.bfloat16, device="cuda").requires_grad_()
              for _ in range(2))
    out = flash_attn_func(qc, kc, vc, causal=True)
    with pytest.raises(_ffi.InvalidArgumentError) as info:
        out.sum().backward()
    assert info.value.argument == "workspace" and sizes[0] > 256
