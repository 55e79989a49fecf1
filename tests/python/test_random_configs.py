"""flash_attn_func on random configurations against the float64 reference, with FlashAttention's
rule for out, lse, attention probabilities, dq, dk and dv (test_attention.run_and_compare).

The hand-picked tests name each option on a few shapes; here every draw combines them: lengths on
and off the kernels' tiles (Sq != Sk both ways), 1-7 query heads per KV head, head dims from 8 to
256 (odd ones included, which take the unaligned paths), masks, windows, softcap, ALiBi, the
scale, the deterministic backward and the dtype.  The draws follow the test's seed
(TILEATTN_TEST_SEED, conftest.py), so a failure names its configurations and replays with the seed.
TILEATTN_RANDOM_CONFIGS=N sets the draws a device (default: 20 on the CPU, whose CI runs the suite,
and 60 on CUDA).
"""

import os
import random

import torch

from test_attention import run_and_compare

LENGTHS = [1, 2, 15, 17, 63, 64, 65, 127, 128, 129, 191, 255, 300, 513, 777, 1000, 1100]
HEAD_DIMS = [8, 16, 20, 32, 33, 40, 48, 64, 72, 80, 96, 112, 128, 144, 160, 192, 200, 224, 256]
# The CPU backend's draws stay small: CI runs them on two cores.
CPU_MAX_LENGTH, CPU_MAX_HEAD_DIM = 300, 128


def draw_config(rng, device):
    """One configuration: the shape (batch, Sq, Sk, H, Hk, D), the dtype and run_and_compare's
    options."""
    on_cpu = device == "cpu"
    lengths = [n for n in LENGTHS if not on_cpu or n <= CPU_MAX_LENGTH]
    head_dims = [d for d in HEAD_DIMS if not on_cpu or d <= CPU_MAX_HEAD_DIM]
    seqlen_q = rng.choice(lengths)
    seqlen_k = seqlen_q if rng.random() < 0.3 else rng.choice(lengths)
    num_heads_k = rng.choice([1, 2, 3])
    num_heads = num_heads_k * rng.choice([1, 2, 3, 4, 7])
    batch = rng.choice([1, 2, 3])
    shape = (batch, seqlen_q, seqlen_k, num_heads, num_heads_k, rng.choice(head_dims))
    dtypes = [torch.bfloat16, torch.float16] + ([torch.float32] if on_cpu else [])
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
    if rng.random() < 0.25:
        slopes_shape = (num_heads,) if rng.random() < 0.5 else (batch, num_heads)
        options["alibi_slopes"] = ("slopes", slopes_shape)
    options["deterministic"] = rng.random() < 0.3
    return shape, rng.choice(dtypes), options


def test_random_configurations(device):
    count = int(os.environ.get("TILEATTN_RANDOM_CONFIGS", 20 if device == "cpu" else 60))
    rng = random.Random(torch.initial_seed())
    failures = []
    for index in range(count):
        shape, dtype, options = draw_config(rng, device)
        call_options = dict(options)
        if "alibi_slopes" in call_options:
            call_options["alibi_slopes"] = torch.rand(call_options["alibi_slopes"][1], device=device) * 0.3
        try:
            run_and_compare(device, dtype, shape, **call_options)
        except AssertionError as error:
            failures.append(f"draw {index}: shape {shape}, {dtype}, {options}: {str(error).splitlines()[0]}")
    assert not failures, f"{len(failures)} of {count} draws failed:\n" + "\n".join(failures)
