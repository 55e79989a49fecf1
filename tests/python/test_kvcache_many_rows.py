"""flash_attn_with_kvcache with many query rows a sequence (a chunked prefill through the KV-cache
call), on every device.  On CUDA these calls run on the forward kernels where nothing asks for the
decode kernels (src/cuda/decode/kvcache_forward_route.h; TILEATTN_KVCACHE_FORWARD = auto | on |
off): a contiguous cache, and on compute capability 9.0 cache_batch_idx and pages of any size too
(pages not holding whole key blocks box by box); new tokens appended first, each sequence's keys its
cache length after the append, masks bottom-right over them.  Checked against float64 with FA's
rule, the appended entries inside the cache, NaN in every slot a sequence does not own."""

import re

import pytest
import torch

import tileattn
from tileattn import _ffi, _kvcache_ops
from test_kvcache import DEFAULTS, check_against_reference, make_problem

# (options, capacity): the cache lengths are 0, 17 and capacity - seqlen_new - 5 (make_problem).
CASES = {
    # 64 new tokens appended and attended causally, 4 query heads a KV head: 256 rows a group.
    "append64_causal_gqa4": (dict(heads=16, heads_k=4, dim=128, seqlen_new=64, causal=True), 512),
    # 7 query heads a KV head, 17 rows over the cache alone, non-causal.
    "rows17_gqa7_no_append": (dict(heads=14, heads_k=2, dim=64, seqlen_new=0, seqlen_q=17), 512),
    # More query rows than new tokens: rows 0-99 see the cache's keys up to their own position.
    "rows127_window_softcap_alibi": (dict(heads=8, heads_k=2, dim=64, seqlen_new=27, seqlen_q=127, causal=True,
                                          window=(100, 0), softcap=15.0, alibi=True), 512),
    "d256_rows32_append": (dict(heads=8, heads_k=2, dim=256, seqlen_new=32, causal=True), 512),
    "mha_rows1000_long_cache": (dict(heads=2, heads_k=2, dim=128, seqlen_new=1000, causal=True), 2048),
    "d72_rows40_right_window": (dict(heads=8, heads_k=4, dim=72, seqlen_new=8, seqlen_q=40, window=(-1, 5)), 512),
    # Cache entries through cache_batch_idx, and pages: on CUDA (compute capability 9.0) the forward
    # reads them in place, pages of a multiple of the key block (128 keys at d64 and d128, 64 at
    # d256) a block at a time, other pages in boxes of gcd(block, page) rows from several pages.
    "batch_idx_rows32": (dict(heads=8, heads_k=2, dim=64, seqlen_new=0, seqlen_q=32, batch_idx=True), 512),
    "paged256_batch_idx_append64": (dict(heads=16, heads_k=4, dim=128, seqlen_new=64, causal=True, page_size=256,
                                         batch_idx=True), 1024),
    "paged128_d256_rows32": (dict(heads=8, heads_k=2, dim=256, seqlen_new=16, seqlen_q=32, causal=True,
                                  page_size=128), 512),
    "paged16_rows64": (dict(heads=16, heads_k=4, dim=128, seqlen_new=0, seqlen_q=64, page_size=16), 512),
    # Pages read box by box, causal over a ragged cache.
    "paged16_rows32_causal": (dict(heads=16, heads_k=4, dim=128, seqlen_new=8, seqlen_q=32, causal=True,
                                   page_size=16), 512),
    # Boxes of 16 rows, 8 a key block; 7 query heads a KV head; the new tokens appended into pages.
    "paged48_gqa7_append64": (dict(heads=14, heads_k=2, dim=128, seqlen_new=64, causal=True, page_size=48), 480),
    "paged144_d64_batch_idx": (dict(heads=8, heads_k=2, dim=64, seqlen_new=16, seqlen_q=80, page_size=144,
                                    batch_idx=True), 576),
    # d256's 64-key blocks: four boxes of 16 rows x four column slabs (on the route under auto).
    "paged16_d256_append64": (dict(heads=8, heads_k=2, dim=256, seqlen_new=64, causal=True, page_size=16), 256),
    # d64 causal over few keys: the short-walk kernel's 64-key blocks, boxes of gcd(64, 96) = 32 rows.
    "paged96_d64_short_walk": (dict(heads=8, heads_k=2, dim=64, seqlen_new=64, causal=True, page_size=96), 384),
    # Rotary: the new keys rotated by the append kernel, q (on the forward route: a rotated copy of
    # it) at cache_seqlens + i when causal or windowed, at cache_seqlens otherwise.
    "rotary_causal_append64": (dict(heads=16, heads_k=4, dim=128, seqlen_new=64, causal=True, rotary_dim=128), 512),
    "rotary_halves_rows40_paged16": (dict(heads=8, heads_k=2, dim=64, seqlen_new=8, seqlen_q=40, rotary_dim=32,
                                          interleaved=False, page_size=16), 512),
    "rotary_window_batch_idx_d256": (dict(heads=8, heads_k=2, dim=256, seqlen_new=16, seqlen_q=32, window=(50, 0),
                                          rotary_dim=64, batch_idx=True), 512),
    # The route's rotation through 16-byte vectors needs rotary_dim a multiple of 8 interleaved (40:
    # 5 items of 4 pairs a head) and of 16 in halves; 24 in halves takes the element-wise kernel.
    "rotary_dim40_interleaved": (dict(heads=8, heads_k=2, dim=128, seqlen_new=8, seqlen_q=24, rotary_dim=40), 512),
    "rotary_dim24_halves": (dict(heads=8, heads_k=2, dim=128, seqlen_new=8, seqlen_q=24, rotary_dim=24,
                                 interleaved=False, causal=True), 512),
    # Both window edges and a softcap, 60 rows: packed 4 heads a token (240 rows), the tiles' rows
    # end inside a token's heads.
    "rows60_two_edged_window_softcap": (dict(heads=16, heads_k=4, dim=128, seqlen_new=12, seqlen_q=60, window=(70, 3),
                                             softcap=20.0), 512),
}

# Calls whose query heads share KV heads, without ALiBi: on compute capability 9.0 the route can
# pack each KV group's query heads into the forward's rows (TILEATTN_KVCACHE_PACK_GQA).
PACKABLE = [case for case, (options, _) in CASES.items()
            if options["heads"] != options["heads_k"] and not options.get("alibi")]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kvcache_many_rows(case, dtype, device):
    options, capacity = CASES[case]
    opts = dict(DEFAULTS, **options)
    args, slot, first = make_problem(opts, dtype, device, capacity=capacity)
    out, lse = tileattn.flash_attn_with_kvcache(**args)
    check_against_reference(opts, dtype, args, slot, first, out, lse)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the forward route is the CUDA backend's")
@pytest.mark.parametrize("route", ["on", "off"])
@pytest.mark.parametrize("case", ["append64_causal_gqa4", "rows127_window_softcap_alibi",
                                  "paged256_batch_idx_append64", "paged48_gqa7_append64",
                                  "rotary_halves_rows40_paged16", "rotary_window_batch_idx_d256",
                                  "rotary_dim40_interleaved", "rotary_dim24_halves"])
def test_both_kernel_paths(case, route, monkeypatch):
    """The same calls forced onto the forward kernels and onto the decode kernels."""
    monkeypatch.setenv("TILEATTN_KVCACHE_FORWARD", route)
    options, capacity = CASES[case]
    opts = dict(DEFAULTS, **options)
    args, slot, first = make_problem(opts, torch.bfloat16, "cuda", capacity=capacity)
    out, lse = tileattn.flash_attn_with_kvcache(**args)
    check_against_reference(opts, torch.bfloat16, args, slot, first, out, lse)


def device_family(monkeypatch):
    """The forward family the device takes by default (sm90 on compute capability 9.0): the route's
    packed heads and pages are sm90 kernels, and the GPU suite also runs this file with
    TILEATTN_FORWARD_FAMILY=sm80, where such calls take the decode kernels instead."""
    monkeypatch.setenv("TILEATTN_FORWARD_FAMILY", "auto")


sm90_only = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                               reason="packed heads on the forward route: the sm90 forward family")


@sm90_only
@pytest.mark.parametrize("case", PACKABLE)
def test_packed_heads(case, monkeypatch):
    """The route with each KV group's query heads packed into the forward's rows (row r of KV head h
    is token r // g's query head g h + r % g; sm90/packed_heads_sm90.h): q copied (and rotated) in
    that order, the masks reading a row's token, out and LSE copied back."""
    device_family(monkeypatch)
    monkeypatch.setenv("TILEATTN_KVCACHE_FORWARD", "on")
    monkeypatch.setenv("TILEATTN_KVCACHE_PACK_GQA", "on")
    options, capacity = CASES[case]
    opts = dict(DEFAULTS, **options)
    for dtype in (torch.bfloat16, torch.float16):
        args, slot, first = make_problem(opts, dtype, "cuda", capacity=capacity)
        result = []
        names = cuda_kernel_names(lambda: result.append(tileattn.flash_attn_with_kvcache(**args)))
        assert any("route_unpack_kernel" in name for name in names), names
        check_against_reference(opts, dtype, args, slot, first, *result[0])


@sm90_only
def test_auto_packs_heads_where_the_tiles_take_fewer_rounds(monkeypatch):
    """Under auto the route packs a call's heads when its packed tiles need fewer rounds of the
    SMs (128-row tiles at d128, 132 SMs): 40 sequences x 32 query heads of 16 rows are 1280 tiles
    unpacked, 320 packed, and of 64 rows 1280 against 640 (two tiles a group); 4 sequences are 128
    and 32, one round either way, and 40 of 128 rows 1280 either way: those stay unpacked."""
    device_family(monkeypatch)
    monkeypatch.setenv("TILEATTN_KVCACHE_FORWARD", "auto")
    for batch, rows, packs in ((40, 16, True), (40, 64, True), (4, 16, False), (40, 128, False)):
        opts = dict(DEFAULTS, heads=32, heads_k=8, dim=128, seqlen_new=0, seqlen_q=rows, causal=True)
        lengths = torch.tensor([(37 * b) % 250 + 1 for b in range(batch)], dtype=torch.int32)
        args, slot, first = make_problem(opts, torch.bfloat16, "cuda", batch=batch, capacity=256,
                                         cache_seqlens=lengths)
        result = []
        names = cuda_kernel_names(lambda: result.append(tileattn.flash_attn_with_kvcache(**args)))
        assert any("route_lengths_kernel" in name for name in names), names
        assert any("route_unpack_kernel" in name for name in names) == packs, (batch, rows, names)
        check_against_reference(opts, torch.bfloat16, args, slot, first, *result[0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="read by the CUDA backend")
def test_pack_choice_is_checked(monkeypatch):
    monkeypatch.setenv("TILEATTN_KVCACHE_FORWARD", "on")
    monkeypatch.setenv("TILEATTN_KVCACHE_PACK_GQA", "yes")
    opts = dict(DEFAULTS, heads=16, heads_k=4, dim=64, seqlen_new=0, seqlen_q=32)
    args, _, _ = make_problem(opts, torch.bfloat16, "cuda")
    with pytest.raises(Exception, match="TILEATTN_KVCACHE_PACK_GQA must be auto, on or off"):
        tileattn.flash_attn_with_kvcache(**args)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the forward route is the CUDA backend's")
@pytest.mark.parametrize("pack", ["off", "on"])
@pytest.mark.parametrize("seqlen_new", [0, 24])
def test_bad_cache_seqlens_give_nan_rows(seqlen_new, pack, monkeypatch):
    """The CUDA backend reads no index array on the host.  On the forward route, as on the decode
    kernels, a sequence whose cache_seqlens is out of range (negative, or past the cache with its
    new tokens) gets NaN out and LSE and no append; the others are right (with packed heads too:
    the copy back leaves the refused sequences' NaN)."""
    monkeypatch.setenv("TILEATTN_KVCACHE_PACK_GQA", pack)
    opts = dict(DEFAULTS, heads=16, heads_k=4, dim=64, seqlen_new=seqlen_new, seqlen_q=24, causal=True)
    seqlens = torch.tensor([20, 128 - seqlen_new + 1, 60, -3], dtype=torch.int32)
    good = torch.tensor([20, 40, 60, 10], dtype=torch.int32)
    args, slot, first = make_problem(opts, torch.bfloat16, "cuda", batch=4, capacity=128, cache_seqlens=good)
    args["cache_seqlens"].copy_(seqlens.cuda())
    before = args["k_cache"].clone()
    out, lse = tileattn.flash_attn_with_kvcache(**args)
    torch.cuda.synchronize()
    for b in (1, 3):
        assert out[b].isnan().all() and lse[b].isnan().all(), f"sequence {b}"
    for b in (0, 2):
        assert not out[b].isnan().any() and not lse[b].isnan().any(), f"sequence {b}"
    after, filled = args["k_cache"], ~before.isnan()
    assert torch.equal(after[filled], before[filled]), "a valid cache entry changed"
    written = int((after.isnan() != before.isnan()).sum())
    assert written == 2 * seqlen_new * opts["heads_k"] * opts["dim"], "only sequences 0 and 2 may append"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the forward route is the CUDA backend's")
@pytest.mark.parametrize("pack", ["off", "on"])
@pytest.mark.parametrize("page", [256, 16])
def test_bad_page_gives_nan_rows(page, pack, monkeypatch):
    """A block-table entry that is not a page, among the pages a sequence reads, makes that
    sequence's rows NaN (all of them on the forward route; on the decode kernels the rows that read
    it, here every row: no mask); an entry past its last page is never read (-1 there is fine, also
    inside the key block holding the sequence's last keys, where pages of 16 come box by box)."""
    monkeypatch.setenv("TILEATTN_KVCACHE_PACK_GQA", pack)
    opts = dict(DEFAULTS, heads=16, heads_k=4, dim=128, seqlen_new=0, seqlen_q=32, page_size=page)
    seqlens = torch.tensor([300, 100, 400], dtype=torch.int32)
    args, slot, first = make_problem(opts, torch.bfloat16, "cuda", batch=3, capacity=512, cache_seqlens=seqlens)
    args["block_table"][0, 280 // page] = 10**6  # sequence 0's keys 256-299 (pages of 256), 272-287 (16)
    args["block_table"][1, 100 // page + 1:] = -1  # past sequence 1's keys
    out, lse = tileattn.flash_attn_with_kvcache(**args)
    torch.cuda.synchronize()
    assert out[0].isnan().all() and lse[0].isnan().all()
    for b in (1, 2):
        assert not out[b].isnan().any() and not lse[b].isnan().any(), f"sequence {b}"


def cuda_kernel_names(call):
    """The CUDA kernels `call` launches, by name (torch.profiler)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return [event.name for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="pages on the forward route: the sm90 forward family")
@pytest.mark.parametrize("case", ["paged16_rows64", "paged16_rows32_causal", "paged48_gqa7_append64",
                                  "paged256_batch_idx_append64", "rotary_halves_rows40_paged16"])
def test_pages_take_the_route(case, monkeypatch):
    """Under auto, many-row calls over pages of any size run on the forward kernels (the route's
    lengths kernel, with rotary its q rotation, then the sm90 forward), not on the decode kernels;
    their results are right."""
    device_family(monkeypatch)
    monkeypatch.setenv("TILEATTN_KVCACHE_FORWARD", "auto")
    options, capacity = CASES[case]
    opts = dict(DEFAULTS, **options)
    # 4 sequences: every case's decode streams past the rule's 32 (rows40: 4 x 2 KV heads x 10 chunks).
    fill = capacity - opts["seqlen_new"]
    lengths = torch.tensor([0, 17, fill - 5, fill // 2], dtype=torch.int32)
    args, slot, first = make_problem(opts, torch.bfloat16, "cuda", batch=4, capacity=capacity, cache_seqlens=lengths)
    result = []
    names = cuda_kernel_names(lambda: result.append(tileattn.flash_attn_with_kvcache(**args)))
    assert any("route_lengths_kernel" in name for name in names), names
    assert any("fwd_kernel_sm90" in name for name in names), names
    assert any("route_copy_q" in name for name in names) == bool(opts["rotary_dim"]), names
    check_against_reference(opts, torch.bfloat16, args, slot, first, *result[0])


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="pages on the forward route: the sm90 forward family")
def test_route_threshold_over_small_pages_and_contiguous(monkeypatch):
    """Under auto the forward takes a call from 16 rows a sequence and 48 a KV group (the rule in
    kvcache_forward_route.cu), over pages of 16, which it reads box by box, as over a contiguous
    cache: with 5 query heads a KV head 15 rows stay on the decode kernels and 16 go, with 2 heads
    16 rows (32 a group) stay and 24 (48) go.  8 sequences, so that the decode kernels' streams
    (8 x 4 KV heads x 3-5 chunks of 16 group rows) are past the rule's 32."""
    device_family(monkeypatch)
    monkeypatch.setenv("TILEATTN_KVCACHE_FORWARD", "auto")
    cases = [(page, heads, rows, routed) for page in (16, 0)
             for heads, rows, routed in ((20, 15, False), (20, 16, True), (8, 16, False), (8, 24, True))]
    lengths = torch.tensor([(97 * b) % 480 for b in range(8)], dtype=torch.int32)
    for page, heads, rows, routed in cases:
        opts = dict(DEFAULTS, heads=heads, heads_k=4, dim=128, seqlen_new=0, seqlen_q=rows, page_size=page)
        args, slot, first = make_problem(opts, torch.bfloat16, "cuda", batch=8, cache_seqlens=lengths)
        result = []
        names = cuda_kernel_names(lambda: result.append(tileattn.flash_attn_with_kvcache(**args)))
        assert any("route_lengths_kernel" in name for name in names) == routed, (page, heads, rows, names)
        check_against_reference(opts, torch.bfloat16, args, slot, first, *result[0])


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="the rule as measured on Hopper")
def test_few_sequences_stay_on_the_decode_kernels(monkeypatch):
    """Under auto a call whose decode kernels run at most 32 streams of the cache (sequences x KV
    heads x 16-row chunks of a group) stays on them, where the route would run one round of few
    tiles (H100, 1 x 4k, 32/8 heads, 16 rows: 22 us against 25): 1 sequence x 8 KV heads of 16
    rows (4 chunks) stays, 32 rows (8 chunks) goes, and 2 sequences of 16 rows go."""
    monkeypatch.setenv("TILEATTN_KVCACHE_FORWARD", "auto")
    for batch, rows, routed in ((1, 16, False), (1, 32, True), (1, 64, True), (2, 16, True)):
        opts = dict(DEFAULTS, heads=32, heads_k=8, dim=128, seqlen_new=0, seqlen_q=rows, causal=True)
        args, slot, first = make_problem(opts, torch.bfloat16, "cuda", batch=batch, capacity=256,
                                         cache_seqlens=torch.tensor([200, 37][:batch], dtype=torch.int32))
        result = []
        names = cuda_kernel_names(lambda: result.append(tileattn.flash_attn_with_kvcache(**args)))
        assert any("route_lengths_kernel" in name for name in names) == routed, (batch, rows, names)
        check_against_reference(opts, torch.bfloat16, args, slot, first, *result[0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="read by the CUDA backend")
def test_route_choice_is_checked(monkeypatch):
    monkeypatch.setenv("TILEATTN_KVCACHE_FORWARD", "always")
    opts = dict(DEFAULTS, heads=16, heads_k=4, dim=64, seqlen_new=0, seqlen_q=32)
    args, _, _ = make_problem(opts, torch.bfloat16, "cuda")
    with pytest.raises(Exception, match="TILEATTN_KVCACHE_FORWARD must be auto, on or off"):
        tileattn.flash_attn_with_kvcache(**args)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs")
@pytest.mark.parametrize("pack", ["off", "on"])
def test_many_rows_in_a_cuda_graph(pack, monkeypatch):
    """A prefill chunk captured once and replayed with new cache lengths: the route's key counts
    come from cache_seqlens on the device at every replay (packed heads: so do the copies')."""
    monkeypatch.setenv("TILEATTN_KVCACHE_PACK_GQA", pack)
    opts = dict(DEFAULTS, heads=16, heads_k=4, dim=128, seqlen_new=32, causal=True)
    args, slot, first = make_problem(opts, torch.bfloat16, "cuda", batch=3, capacity=256,
                                     cache_seqlens=torch.tensor([0, 17, 200], dtype=torch.int32))
    pristine = (args["k_cache"].clone(), args["v_cache"].clone())
    static = dict(args)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        tileattn.flash_attn_with_kvcache(**static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = tileattn.flash_attn_with_kvcache(**static)
    for seqlens in ([5, 100, 224], [224, 0, 64]):
        static["k_cache"].copy_(pristine[0])
        static["v_cache"].copy_(pristine[1])
        lengths = torch.tensor(seqlens, dtype=torch.int32)
        fresh, slot, first = make_problem(opts, torch.bfloat16, "cpu", batch=3, capacity=256, cache_seqlens=lengths)
        for name in ("q", "k_cache", "v_cache", "k", "v", "cache_seqlens"):
            static[name].copy_(fresh[name])
        graph.replay()
        torch.cuda.synchronize()
        check_against_reference(opts, torch.bfloat16, static, slot, first, out, lse)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the forward route is the CUDA backend's")
def test_route_workspace_is_checked_before_anything_runs(monkeypatch):
    """The route keeps each sequence's key count in the workspace (4 bytes a sequence, in 256-byte
    units), and where it may pack heads (compute capability 9.0) the copies of q, out and the LSE;
    the size query covers them, and a workspace too small is refused naming it before the new
    tokens are appended."""
    device_family(monkeypatch)
    monkeypatch.setenv("TILEATTN_KVCACHE_FORWARD", "on")
    q = torch.randn(70, 32, 4, 64, dtype=torch.bfloat16, device="cuda")
    k_cache = torch.randn(70, 256, 2, 64, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.randn_like(k_cache)
    k, v = torch.randn(2, 70, 32, 2, 64, dtype=torch.bfloat16, device="cuda")
    seqlens = torch.full((70,), 100, dtype=torch.int32, device="cuda")
    params, out, lse, copies = _kvcache_ops.kvcache_params(
        q, k_cache, v_cache, k, v, None, None, seqlens, None, None, None, 64 ** -0.5, -1, -1, 0.0,
        True, None, 0)
    assert not copies
    needed = _ffi.library().kvcache_workspace_size(params)
    # 70 sequences: 280 bytes of key counts; q's copy and the packed out (2 bytes an element), the
    # packed LSE (4 bytes a row and head).  The size query returns the most either path may take.
    packing = 2 * q.numel() * 2 + 70 * 32 * 4 * 4 if torch.cuda.get_device_capability() == (9, 0) else 0
    route = 512 + packing
    assert needed >= route and needed % 256 == 0, needed
    small = torch.empty(256, dtype=torch.uint8, device="cuda")
    params.workspace, params.workspace_bytes = small.data_ptr(), 256
    before = k_cache[:, 100].clone()
    with pytest.raises(_ffi.InvalidArgumentError) as info:
        _ffi.library().forward_kvcache(params)
    assert info.value.argument == "workspace"
    assert re.search(rf"needs {route} bytes of workspace, got 256", str(info.value)), str(info.value)
    torch.cuda.synchronize()
    assert torch.equal(k_cache[:, 100], before)
