"""CPU decode benchmark: flash_attn_with_kvcache on the CPU backend next to PyTorch's CPU
scaled_dot_product_attention over the same cache (its query heads repeated over the KV heads, as
an application without a decode kernel would call it), measured in the same run, and the same step
as flash_attn_func over the whole cache (column flash_attn_func: a model that passes its K/V whole,
as Hugging Face's flash-attention path does).

One query token per sequence (--tokens N: N, the cache's last N positions, attending causally, as
a few speculative tokens do), contiguous caches (float32, or --dtype bf16/fp16) filled to the end.
Reports milliseconds a call and GB/s of K and V read (batch x length x KV heads x d x element bytes x 2).  Writes a CSV under
bench/results/ with the machine, date and commit, and prints a table.

    python3 bench/cpu_decode.py
    python3 bench/cpu_decode.py --shapes 8x8192x4x1x64 --repeats 5 --dtype bf16
    python3 bench/cpu_decode.py --paged-varlen 16   # also the step as a paged varlen call
    python3 bench/cpu_decode.py --tokens 4 --shapes 1x32768x32x8x128

--paged-varlen PAGE adds three columns: flash_attn_with_kvcache over the cache in shuffled pages of
PAGE with a block table, the same step as flash_attn_varlen_func over those pages (one query row a sequence, as a serving engine batches
it), which runs on the KV-cache path (python/tileattn/_paged_varlen_kvcache.py), and the same call
made to gather the pages into a padded copy first (the path before session 52).
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import environment  # noqa: E402
from bench.cpu import cpu_name, interleaved_medians, write_rows  # noqa: E402
from bench.paged_varlen_step import decode_step  # noqa: E402

import tileattn  # noqa: E402

# batch x cache length x query heads x KV heads x head dim
DEFAULT_SHAPES = ("8x8192x4x1x64", "1x32768x32x8x128", "32x2048x32x8x128")


def parse_shape(text):
    batch, length, heads, heads_k, dim = (int(x) for x in text.split("x"))
    return batch, length, heads, heads_k, dim


def paged_varlen_calls(q, k_cache, v_cache, page):
    """{"kvcache-paged", "varlen-paged", "varlen-gather": call}: the step over the cache in shuffled
    pages."""
    batch, length = k_cache.shape[:2]
    if length % page:
        raise SystemExit(f"--paged-varlen {page}: the cache length {length} is not a multiple of it")
    blocks = batch * length // page
    order = torch.randperm(blocks)
    k_pages, v_pages = (torch.empty((blocks,) + (page,) + tuple(x.shape[2:]), dtype=x.dtype) for x in (k_cache, v_cache))
    k_pages[order], v_pages[order] = (x.reshape(blocks, page, *x.shape[2:]) for x in (k_cache, v_cache))
    table = order.view(batch, -1).to(torch.int32)
    seqlens = torch.full((batch,), length, dtype=torch.int32)

    def kvcache_paged():
        tileattn.flash_attn_with_kvcache(q, k_pages, v_pages, cache_seqlens=seqlens, block_table=table)
    return {"kvcache-paged": kvcache_paged,
            "varlen-paged": decode_step(q, k_pages, v_pages, table, seqlens, length),
            "varlen-gather": decode_step(q, k_pages, v_pages, table, seqlens, length, gather=True)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(DEFAULT_SHAPES), help="BxLxHxHkxD")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32")
    parser.add_argument("--paged-varlen", type=int, default=0, metavar="PAGE",
                        help="also time the paged varlen call over pages of PAGE keys, both paths")
    parser.add_argument("--tokens", type=int, default=1, help="query tokens a sequence (causal)")
    parser.add_argument("--out", default=None, help="CSV path (default: bench/results/cpu-decode-DATE.csv)")
    args = parser.parse_args()
    if args.tokens < 1 or (args.tokens > 1 and args.paged_varlen):
        parser.error("--tokens must be 1 or more, and 1 with --paged-varlen (its varlen step has one row a sequence)")
    torch.manual_seed(0)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    rows = []
    print(f"# {cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}, {args.dtype}")
    impls = ["tileattn", "flash_attn_func", "sdpa"] + (["kvcache-paged", "varlen-paged", "varlen-gather"] if args.paged_varlen else [])
    print(f"{'shape':>20} | " + " | ".join(f"{name + ' ms':>18} {'GB/s':>7}" for name in impls))
    for text in args.shapes:
        batch, length, heads, heads_k, dim = parse_shape(text)
        q = torch.randn(batch, args.tokens, heads, dim).to(dtype)
        k_cache = torch.randn(batch, length, heads_k, dim).to(dtype)
        v_cache = torch.randn(batch, length, heads_k, dim).to(dtype)
        seqlens = torch.full((batch,), length, dtype=torch.int32)
        kv_bytes = 2 * batch * length * heads_k * dim * k_cache.element_size()
        group = heads // heads_k

        # Token i sees the cache up to position length - tokens + i (bottom-right causal).
        visible = torch.ones(args.tokens, length, dtype=torch.bool).tril(length - args.tokens)

        def ours():
            tileattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, causal=True)

        def sdpa():
            k = k_cache.transpose(1, 2).repeat_interleave(group, dim=1)
            v = v_cache.transpose(1, 2).repeat_interleave(group, dim=1)
            F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=None if args.tokens == 1 else visible)

        def whole():
            tileattn.flash_attn_func(q, k_cache, v_cache, causal=True)

        calls = {"tileattn": ours, "flash_attn_func": whole, "sdpa": sdpa}
        if args.paged_varlen:
            calls.update(paged_varlen_calls(q, k_cache, v_cache, args.paged_varlen))
        times = interleaved_medians(calls, args.repeats)
        print(f"{text:>20} | " + " | ".join(f"{times[impl] * 1e3:18.2f} {kv_bytes / times[impl] / 1e9:7.1f}"
                                            for impl in impls))
        for impl, seconds in times.items():
            rows.append({"machine": cpu_name(), "date": environment.today(), "commit": environment.commit(),
                         "impl": impl, "dtype": args.dtype, "batch": batch, "tokens": args.tokens,
                         "cache_len": length, "heads": heads,
                         "heads_k": heads_k, "headdim": dim, "ms": round(seconds * 1e3, 3),
                         "gbs": round(kv_bytes / seconds / 1e9, 2)})
    write_rows(rows, args.out or os.path.join(environment.RESULTS, f"cpu-decode-{environment.today()}.csv"))


if __name__ == "__main__":
    main()
