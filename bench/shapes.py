"""The sweep's shapes and what one call of each costs: FLOPs by FlashAttention's formula, the
bytes that must cross HBM at least once, and the GEMM ceiling they are compared with."""
from dataclasses import dataclass

SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
HEADDIMS = (64, 128, 256)

# bf16 dense GEMM, 8192^3 on the lent H200 (shared/anchors/README.md): the "peak" of frac_peak.
GEMM_PEAK_TFLOPS = 782.0

# Backward does 2.5x the forward's matrix work: 5 GEMMs (S recomputed, dP, dV, dK, dQ) against the
# forward's 2 (S, O), FA2's convention; forward + backward is the sum.
FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}

# Tensors of the q shape that must move through HBM at least once: fwd reads Q, K, V and writes O;
# bwd reads Q, K, V, O, dO and writes dQ, dK, dV; fwdbwd is both.  (The LSE, B*H*S floats, is
# 1/d of one tensor and left out.)
TENSORS_MOVED = {"fwd": 4, "bwd": 8, "fwdbwd": 12}


@dataclass(frozen=True)
class Case:
    shape: str  # the shape set's name
    batch: int
    heads: int
    seqlen: int
    headdim: int
    causal: bool

    def flops(self, direction):
        forward = 4 * self.batch * self.heads * self.seqlen ** 2 * self.headdim
        return forward / (2 if self.causal else 1) * FLOP_FACTOR[direction]

    def bytes_moved(self, direction, element_bytes=2):
        return TENSORS_MOVED[direction] * self.batch * self.seqlen * self.heads * self.headdim * element_bytes

    def scores_bytes(self, element_bytes=4):
        """One materialized B x H x S x S score matrix (the brief's memory estimate for SDPA math)."""
        return self.batch * self.heads * self.seqlen ** 2 * element_bytes

    def label(self):
        return (f"{self.shape} B{self.batch} H{self.heads} S{self.seqlen} d{self.headdim}"
                f"{' causal' if self.causal else ''}")


def lecture(seqlen, headdim, causal):
    """The FA2 lecture's shape: batch 2, 16 heads."""
    return Case("lecture", 2, 16, seqlen, headdim, causal)


def fa_papers(seqlen, headdim, causal):
    """The FlashAttention papers' shape: 16k tokens in all, hidden 2048."""
    return Case("fa", max(1, 16384 // seqlen), 2048 // headdim, seqlen, headdim, causal)


SHAPE_SETS = {"lecture": lecture, "fa": fa_papers}


def fa_spec(spec):
    """The FA papers' case a "HEADDIM:SEQLEN[:causal]" argument names (bench/gpu's probes)."""
    head_dim, seqlen, *rest = spec.split(":")
    return fa_papers(int(seqlen), int(head_dim), rest == ["causal"])


def cases(shape_sets, seqlens, headdims, causals):
    """Every case, causal outermost, then head dim, then seqlen (the CSV's and the table's order)."""
    return [SHAPE_SETS[s](n, d, c) for s in shape_sets for c in causals for d in headdims for n in seqlens]


def rate(case, direction, ms):
    """(TFLOP/s, GB/s, fraction of the GEMM peak) of one call that took `ms`."""
    tflops = case.flops(direction) / ms / 1e9
    gbps = case.bytes_moved(direction) / ms / 1e6
    return tflops, gbps, tflops / GEMM_PEAK_TFLOPS
