"""`python3 -m bench varlen`: a ragged batch, padded to its longest sequence vs packed.

Lengths are lognormal (median 1024, sigma 0.8, fixed seed), clipped to [16, 4096]; 32 sequences,
16 heads, d 128.  Packed: tileattn.flash_attn_varlen_func over the concatenated tokens; paged: the
same call with K and V in shuffled pages of 16 and a block table (vLLM's chunked-prefill layout).  Padded:
the (batch, max_len) tensor through flash_attn_func / SDPA flash, which attend to the padding too
(the cost a padded batch pays; the padded rows are thrown away), and SDPA with a boolean key
padding mask, the padded batch computed correctly.  The packed output is checked against the
masked SDPA one on the real rows, the paged one against the packed one.  Speedup = padded time / packed time."""
import math
import os

import torch
import torch.nn.functional as F

from bench import environment, timing
from bench.measure import DTYPES

SEED = 0
PAGE_SIZE = 16  # vLLM's page size; the paged variant gathers pages into a padded copy first


def add_parser(subparsers):
    p = subparsers.add_parser("varlen", help="ragged batch: padded vs packed", description=__doc__)
    p.add_argument("--sequences", type=int, default=32)
    p.add_argument("--max-len", type=int, default=4096)
    p.add_argument("--median-len", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--headdim", type=int, default=128)
    p.add_argument("--direction", nargs="+", default=["fwd", "fwdbwd"], choices=["fwd", "fwdbwd"])
    p.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--runs", type=int, default=timing.RUNS)
    p.add_argument("--warmup", type=int, default=timing.WARMUP)
    p.add_argument("--out", default=None, help="markdown table path; a CSV goes beside it")
    p.set_defaults(run=run)


def ragged_lengths(count, median, cap, seed=SEED):
    generator = torch.Generator().manual_seed(seed)
    draws = torch.randn(count, generator=generator, dtype=torch.float64) * 0.8 + math.log(median)
    return [int(x) for x in draws.exp().round().clamp(16, cap)]


class RaggedBatch:
    """The same tokens packed (total, heads, d) and padded (batch, max_len, heads, d)."""

    def __init__(self, lengths, heads, headdim, device, dtype):
        self.lengths = lengths
        self.max_len = max(lengths)
        total = sum(lengths)
        self.cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), device=device, dtype=torch.int32)
        self.packed = [torch.randn(total, heads, headdim, device=device, dtype=dtype) for _ in range(3)]
        self.dout_packed = torch.randn(total, heads, headdim, device=device, dtype=dtype)
        self.padded = [self.pad(x) for x in self.packed]
        self.dout_padded = self.pad(self.dout_packed)
        cols = torch.arange(self.max_len, device=device)
        self.key_valid = cols[None, :] < torch.tensor(lengths, device=device)[:, None]  # (batch, max_len)
        self.pages, self.block_table = self.paged(PAGE_SIZE)

    def pad(self, packed):
        out = packed.new_zeros(len(self.lengths), self.max_len, *packed.shape[1:])
        for i, n in enumerate(self.lengths):
            out[i, :n] = packed[int(self.cu[i]):int(self.cu[i]) + n]
        return out

    def paged(self, page_size):
        """K and V in shuffled pages of page_size keys, and the block table that finds them."""
        owned = [math.ceil(n / page_size) for n in self.lengths]
        device = self.packed[0].device
        order = torch.randperm(sum(owned), generator=torch.Generator().manual_seed(SEED))
        block_table = torch.zeros(len(self.lengths), max(owned), dtype=torch.int32)
        page_of_row, slot_of_row, used = [], [], 0
        for b, n in enumerate(self.lengths):
            block_table[b, :owned[b]] = order[used:used + owned[b]].to(torch.int32)
            used += owned[b]
            page_of_row += [int(block_table[b, j // page_size]) for j in range(n)]
            slot_of_row += [j % page_size for j in range(n)]
        rows = (torch.tensor(page_of_row, device=device), torch.tensor(slot_of_row, device=device))
        pages = []
        for packed in self.packed[1:]:
            x = packed.new_zeros(sum(owned), page_size, *packed.shape[1:])
            x[rows] = packed
            pages.append(x)
        return pages, block_table.to(device)

    def unpad(self, padded):
        return torch.cat([padded[i, :n] for i, n in enumerate(self.lengths)])

    def useful_flops(self, heads, headdim, causal):
        return sum(4 * heads * n * n * headdim / (2 if causal else 1) for n in self.lengths)


def variants(batch, causal):
    """name -> (make(requires_grad) -> (call, inputs, dout))."""
    import tileattn

    def leaves(tensors, grad):
        return [t.detach().requires_grad_(grad) for t in tensors]

    def packed(grad):
        q, k, v = leaves(batch.packed, grad)
        return (lambda: tileattn.flash_attn_varlen_func(q, k, v, batch.cu, batch.cu, batch.max_len, batch.max_len,
                                                        causal=causal)), (q, k, v), batch.dout_packed

    def paged(grad):
        q, k_pages, v_pages = leaves([batch.packed[0]] + batch.pages, grad)
        return (lambda: tileattn.flash_attn_varlen_func(q, k_pages, v_pages, batch.cu, batch.cu, batch.max_len,
                                                        batch.max_len, causal=causal,
                                                        block_table=batch.block_table)), \
            (q, k_pages, v_pages), batch.dout_packed

    def padded_tileattn(grad):
        q, k, v = leaves(batch.padded, grad)
        return (lambda: tileattn.flash_attn_func(q, k, v, causal=causal)), (q, k, v), batch.dout_padded

    def padded_sdpa(kind, masked):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        mask = batch.key_valid[:, None, None, :]
        if masked and causal:  # bottom-right = top-left here: every padded sequence has Sq = Sk
            mask = mask & torch.ones(batch.max_len, batch.max_len, dtype=torch.bool, device=mask.device).tril()

        def make(grad):
            q, k, v = leaves(batch.padded, grad)
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
            backends = [SDPBackend.FLASH_ATTENTION] if kind == "flash" else \
                [SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

            def call():
                with sdpa_kernel(backends):
                    if masked:
                        return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask).transpose(1, 2)
                    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)
            return call, (q, k, v), batch.dout_padded
        return make

    return {"packed tileattn (varlen)": packed,
            f"paged tileattn (varlen, pages of {PAGE_SIZE})": paged,
            "padded tileattn (no mask)": padded_tileattn,
            "padded sdpa-flash (no mask)": padded_sdpa("flash", False),
            "padded sdpa + key mask": padded_sdpa("auto", True)}


def time_variant(make, direction, device, runs, warmup):
    call, inputs, dout = make(direction != "fwd")

    def forward():
        with torch.no_grad():
            call()

    def forward_backward():
        for t in inputs:
            t.grad = None
        call().backward(dout)
    try:
        return timing.median_ms(forward if direction == "fwd" else forward_backward, device, runs, warmup)
    except (RuntimeError, NotImplementedError) as error:
        return str(error).strip().splitlines()[0][:120]


def run(args):
    dtype = DTYPES[args.dtype]
    lengths = ragged_lengths(args.sequences, args.median_len, args.max_len)
    batch = RaggedBatch(lengths, args.heads, args.headdim, args.device, dtype)
    padding = 1 - sum(lengths) / (len(lengths) * batch.max_len)
    header = (f"Ragged batch: {len(lengths)} sequences, lognormal lengths (median {args.median_len}, "
              f"seed {SEED}) in [16, {args.max_len}]: {sum(lengths)} tokens, longest {batch.max_len}, "
              f"{padding:.0%} of the padded batch is padding; {args.heads} heads, d{args.headdim}, "
              f"{args.dtype}, {environment.device_name(args.device)} ({environment.today()}, commit "
              f"{environment.commit()}).  ms (median of {args.runs}); TFLOP/s of the useful work.")
    lines = [header, "", "| causal | direction | variant | ms | useful TFLOP/s | speedup of packed |",
             "|---|---|---|---|---|---|"]
    csv_lines = ["causal,direction,variant,ms,useful_tflops,gpu,date,commit"]
    meta = f"{environment.device_name(args.device)},{environment.today()},{environment.commit()}"
    causals = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    for causal in causals:
        table = variants(batch, causal)
        check_packed_against_mask(table, batch, causal)
        for direction in args.direction:
            factor = 1.0 if direction == "fwd" else 3.5
            useful = batch.useful_flops(args.heads, args.headdim, causal) * factor
            times = {name: time_variant(make, direction, args.device, args.runs, args.warmup)
                     for name, make in table.items()}
            packed_ms = times["packed tileattn (varlen)"]
            for name, ms in times.items():
                if isinstance(ms, str):
                    lines.append(f"| {'yes' if causal else 'no'} | {direction} | {name} | {ms} | | |")
                    continue
                speedup = "1.00" if name.startswith("packed") or isinstance(packed_ms, str) else f"{ms / packed_ms:.2f}"
                lines.append(f"| {'yes' if causal else 'no'} | {direction} | {name} | {ms:.3f} | "
                             f"{useful / ms / 1e9:.3g} | {speedup} |")
                csv_lines.append(f"{int(causal)},{direction},{name},{ms:.5g},{useful / ms / 1e9:.4g},{meta}")
            print("\n".join(lines[-len(times):]), flush=True)
    out = args.out or os.path.join(environment.RESULTS, f"varlen-{environment.today()}.md")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.splitext(out)[0] + ".csv", "w") as f:
        f.write("\n".join(csv_lines) + "\n")
    print("\n".join(lines))
    print(f"# wrote {out}")


def check_packed_against_mask(table, batch, causal):
    """The packed result must be the masked padded one on the real rows (bf16 noise only)."""
    with torch.no_grad():
        packed = table["packed tileattn (varlen)"](False)[0]()
        masked = table["padded sdpa + key mask"](False)[0]()
        paged = table[f"paged tileattn (varlen, pages of {PAGE_SIZE})"](False)[0]()
    diff = (packed.float() - batch.unpad(masked).float()).abs().max().item()
    paged_diff = (paged.float() - packed.float()).abs().max().item()
    print(f"# causal={causal}: max |packed - masked padded| = {diff:.3g}, |paged - packed| = {paged_diff:.3g}",
          flush=True)
    if not (diff < 0.05 and paged_diff < 0.05):
        raise SystemExit(f"varlen: packed and masked padded outputs differ by {diff}, paged and packed by {paged_diff}")
