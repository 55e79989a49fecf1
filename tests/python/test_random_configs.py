"""flash_attn_func, flash_attn_varlen_func and flash_attn_with_kvcache on random configurations
against the float64 reference, with FlashAttention's rule (test_attention.run_and_compare and
test_varlen.run_varlen: out, lse, attention probabilities, dq, dk, dv;
test_kvcache.check_against_reference: the appended entries inside the cache, out, lse).

The hand-picked tests name each option on a few shapes; here every draw combines them: lengths on
and off the kernels' tiles (Sq != Sk both ways), 1-7 query heads per KV head, head dims from 8 to
256 (odd ones included, which take the unaligned paths), masks, windows, softcap, ALiBi, the
scale, the deterministic backward and the dtype; packed batches of 1-5 sequences (empty ones
included) with seqused_k and rows past the last sequence, and the same with the keys in pages
(block_table), and in pages with a serving step's few query rows; for the KV cache also page sizes, cache lengths
(empty ones included), cache_batch_idx, cache_leftpad, rotary (any even rotary_dim, interleaved
or not), new tokens appended and split counts.  The draws follow the test's seed
(TILEATTN_TEST_SEED, conftest.py), so a failure names its configurations and replays with the seed.
TILEATTN_RANDOM_CONFIGS=N sets the draws a device (default: 20 on the CPU, whose CI runs the suite,
and 60 on CUDA).
"""

import os
import random

import torch

import tileattn
from test_attention import run_and_compare
from test_kvcache import DEFAULTS, check_against_reference, make_problem
from test_varlen import run_varlen
from test_varlen_paged import run_paged
from test_varlen_paged_decode import run_decode
from tileattn import _paged_varlen_kvcache

LENGTHS = [1, 2, 15, 17, 63, 64, 65, 127, 128, 129, 191, 255, 300, 513, 777, 1000, 1100]
HEAD_DIMS = [8, 16, 20, 32, 33, 40, 48, 64, 72, 80, 96, 112, 128, 144, 160, 192, 200, 224, 256]
# The CPU backend's draws stay small: CI runs them on two cores.
CPU_MAX_LENGTH, CPU_MAX_HEAD_DIM = 300, 128


def run_draws(device, draw):
    """Draws TILEATTN_RANDOM_CONFIGS configurations (default 20 on the CPU, 60 on CUDA) with
    draw(rng, device), each a description and a call that checks it; one assertion at the end
    names every draw that failed and how."""
    count = int(os.environ.get("TILEATTN_RANDOM_CONFIGS", 20 if device == "cpu" else 60))
    rng = random.Random(torch.initial_seed())
    failures = []
    for index in range(count):
        description, check = draw(rng, device)
        try:
            check()
        except AssertionError as error:
            failures.append(f"draw {index}: {description}: {str(error).splitlines()[0]}")
    assert not failures, f"{len(failures)} of {count} draws failed:\n" + "\n".join(failures)


def draw_dtype(rng, device):
    return rng.choice([torch.bfloat16, torch.float16] + ([torch.float32] if device == "cpu" else []))


def draw_slopes(rng, options, heads, batch, device):
    """ALiBi for a quarter of the draws: slopes of shape (heads,) or (batch, heads); the
    description's part."""
    if rng.random() >= 0.25:
        return ""
    shape = (heads,) if rng.random() < 0.5 else (batch, heads)
    options["alibi_slopes"] = torch.rand(shape, device=device) * 0.3
    return f", alibi_slopes {shape}"


def draw_config(rng, device):
    """One flash_attn_func configuration, checked by test_attention.run_and_compare."""
    on_cpu = device == "cpu"
    lengths = [n for n in LENGTHS if not on_cpu or n <= CPU_MAX_LENGTH]
    head_dims = [d for d in HEAD_DIMS if not on_cpu or d <= CPU_MAX_HEAD_DIM]
    seqlen_q = rng.choice(lengths)
    seqlen_k = seqlen_q if rng.random() < 0.3 else rng.choice(lengths)
    num_heads_k = rng.choice([1, 2, 3])
    num_heads = num_heads_k * rng.choice([1, 2, 3, 4, 7])
    batch = rng.choice([1, 2, 3])
    shape = (batch, seqlen_q, seqlen_k, num_heads, num_heads_k, rng.choice(head_dims))
    options = {}
    mask = rng.choice(["none", "causal", "window", "causal_window"])
    if mask in ("causal", "causal_window"):
        options["causal"] = True
    if mask in ("window", "causal_window"):
        window_left = rng.choice([0, 1, 7, 64, 130, 2000])
        window_right = -1 if mask == "causal_window" else rng.choice([-1, 0, 5, 128, 700])
        options["window_size"] = (window_left, window_right)
    if rng.random() < 0.3:
        options["softmax_scale"] = rng.uniform(0.05, 1.0)
    if rng.random() < 0.25:
        options["softcap"] = rng.choice([1.5, 5.0, 30.0])
    options["deterministic"] = rng.random() < 0.3
    dtype = draw_dtype(rng, device)
    description = f"shape {shape}, {dtype}, {options}"
    description += draw_slopes(rng, options, num_heads, batch, device)
    return description, lambda: run_and_compare(device, dtype, shape, **options)


def test_random_configurations(device):
    run_draws(device, draw_config)


# Cache capacity 768: a multiple of every page size drawn.
KV_CAPACITY = 768
KV_PAGE_SIZES = [0, 0, 16, 48, 64, 128, 256]
KV_HEAD_DIMS = [16, 20, 32, 64, 72, 96, 128, 256]


def draw_kvcache_config(rng, device):
    """One flash_attn_with_kvcache configuration (test_kvcache's options, the batch and the cache
    lengths), checked by test_kvcache.check_against_reference."""
    on_cpu = device == "cpu"
    dim = rng.choice([d for d in KV_HEAD_DIMS if not on_cpu or d <= CPU_MAX_HEAD_DIM])
    heads_k = rng.choice([1, 2, 3])
    opts = dict(DEFAULTS, dim=dim, heads_k=heads_k, heads=heads_k * rng.choice([1, 2, 4, 7, 8]),
                page_size=rng.choice(KV_PAGE_SIZES), batch_idx=rng.random() < 0.3,
                leftpad=rng.random() < 0.3, causal=rng.random() < 0.5,
                seqlen_new=rng.choice([0, 0, 1, 1, 2, 5]), seqlen_q=rng.choice([None, None, 1, 2, 4]),
                interleaved=rng.random() < 0.5, splits=rng.choice([0, 0, 1, 2, 3, 7]))
    if rng.random() < 0.5:
        opts["rotary_dim"] = rng.choice([r for r in (8, 16, 20, 32, 64, 128, 256) if r <= dim])
    if rng.random() < 0.3:
        opts["window"] = (rng.choice([-1, 0, 5, 100]), rng.choice([-1, 0, 3]))
    if rng.random() < 0.2:
        opts["softcap"] = rng.choice([5.0, 30.0])
    opts["alibi"] = rng.random() < 0.2
    batch = rng.choice([1, 2, 3, 5])
    room = KV_CAPACITY - opts["seqlen_new"]
    cache_seqlens = [rng.choice([0, 1, 15, 16, 17, 255, 256, 511, room]) if rng.random() < 0.5
                     else rng.randrange(room + 1) for _ in range(batch)]
    dtype = draw_dtype(rng, device)

    def check():
        args, slot, first = make_problem(opts, dtype, device, batch=batch, capacity=KV_CAPACITY,
                                         cache_seqlens=torch.tensor(cache_seqlens, dtype=torch.int32))
        out, lse = tileattn.flash_attn_with_kvcache(**args)
        check_against_reference(opts, dtype, args, slot, first, out, lse)

    changed = {name: value for name, value in opts.items() if DEFAULTS.get(name) != value}
    return f"batch {batch}, cache_seqlens {cache_seqlens}, {dtype}, {changed}", check


def test_random_kvcache_configurations(device):
    run_draws(device, draw_kvcache_config)


def draw_varlen_problem(rng, device):
    """Per-sequence lengths, dtype and run_varlen's options of one flash_attn_varlen_func call,
    and their description."""
    on_cpu = device == "cpu"
    lengths = [0] + [n for n in LENGTHS if not on_cpu or n <= CPU_MAX_LENGTH]
    count = rng.choice([1, 2, 3, 5])
    seqlens_q = [rng.choice(lengths) for _ in range(count)]
    seqlens_k = [n if rng.random() < 0.3 else rng.choice(lengths) for n in seqlens_q]
    num_heads_k = rng.choice([1, 2, 3])
    options = dict(num_heads=num_heads_k * rng.choice([1, 2, 3, 7]), num_heads_k=num_heads_k,
                   head_dim=rng.choice([d for d in HEAD_DIMS if not on_cpu or d <= CPU_MAX_HEAD_DIM]),
                   causal=rng.random() < 0.4, tail_rows=rng.choice([0, 0, 3]))
    if rng.random() < 0.3:
        options["window_size"] = (rng.choice([-1, 0, 9, 300]), rng.choice([-1, 0, 4]))
    if rng.random() < 0.2:
        options["softcap"] = rng.choice([2.0, 20.0])
    dtype = draw_dtype(rng, device)
    description = f"seqlens_q {seqlens_q}, seqlens_k {seqlens_k}, {dtype}, {options}"
    if rng.random() < 0.25:
        used = [rng.randrange(n + 1) for n in seqlens_k]
        options["seqused_k"] = torch.tensor(used, dtype=torch.int32, device=device)
        description += f", seqused_k {used}"
    description += draw_slopes(rng, options, options["num_heads"], count, device)
    return seqlens_q, seqlens_k, dtype, options, description


def draw_varlen_config(rng, device):
    """One flash_attn_varlen_func configuration, checked by test_varlen.run_varlen."""
    seqlens_q, seqlens_k, dtype, options, description = draw_varlen_problem(rng, device)
    return description, lambda: run_varlen(device, dtype, seqlens_q, seqlens_k, **options)


def draw_paged_varlen_config(rng, device):
    """The same configurations with the keys in shuffled pages (block_table), page sizes 16-256,
    checked by test_varlen_paged.run_paged."""
    seqlens_q, seqlens_k, dtype, options, description = draw_varlen_problem(rng, device)
    del options["tail_rows"]  # paged keys have no packed rows to run past
    page_size = rng.choice([16, 32, 48, 64, 256])
    description += f", pages of {page_size}"
    return description, lambda: run_paged(device, dtype, seqlens_q, seqlens_k, page_size, **options)


def draw_paged_decode_config(rng, device):
    """The paged configurations as a serving step batches them: 0 to ROW_LIMIT / (query heads a
    KV head) query rows a sequence and no gradient, so they run on the KV-cache kernels; checked
    by test_varlen_paged_decode.run_decode."""
    drawn_q, seqlens_k, dtype, options, description = draw_varlen_problem(rng, device)
    del options["tail_rows"]
    most = _paged_varlen_kvcache.ROW_LIMIT // (options["num_heads"] // options["num_heads_k"])
    seqlens_q = [rng.choice([0, 1, 1, 1, rng.randint(1, most)]) for _ in seqlens_k]
    page_size = rng.choice([16, 32, 48, 64, 256])
    description = description.replace(f"seqlens_q {drawn_q}", f"seqlens_q {seqlens_q}", 1)
    description += f", pages of {page_size}"
    return description, lambda: run_decode(device, dtype, seqlens_q, seqlens_k, page_size, **options)


def test_random_varlen_configurations(device):
    run_draws(device, draw_varlen_config)


def test_random_paged_varlen_configurations(device):
    run_draws(device, draw_paged_varlen_config)


def test_random_paged_decode_configurations(device):
    run_draws(device, draw_paged_decode_config)
