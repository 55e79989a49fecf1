// float32 tile products on AVX-512 or AVX2, for CPUs where they beat OpenBLAS's sgemm on the
// backend's tiles.  sgemm packs both operands on every call; a forward of 256-row query tiles
// against 128-key tiles calls it twice per tile pair, and its packing was ~20% of its time there
// (perf, fp32 D128 S2048: sgemm_oncopy/incopy/itcopy 11.8% of the samples against the kernel's
// 44%).  Here A is read where it lies (any row and depth stride) and B must hold its rows
// contiguous, so the callers lay B out once (K^T and V tiles, float32_key_tiles.h) and the product
// packs nothing: S = Q K^T at D64 ran 86 -> 115 GFLOP/s on one core of an Emerald Rapids host (D128
// 123 -> 135), O += P V level with sgemm.
#pragma once

#include <cstdint>

#include "tileattn/tileattn.h"

namespace tileattn::cpu::simd {

// A (m x k): element (i, l) at data[i * row + l * depth], so A^T is read by swapping the strides.
struct StridedOperand {
  const float* data;
  int64_t row, depth;
};

// How many rows ahead the few-row kernels request K and V rows (prefetch into L1).  A decode
// step's rows lie H_k x D elements apart in the cache (4 KB at 8 x 128 floats), each in another 4 KB
// page, where the hardware prefetchers stop: one core read a 32k fp32 cache at 5.6-6.6 GB/s without,
// 10-11 with 8 rows ahead (4 and 16 between).  The kernels take each row's address, so the requests
// follow a paged cache's rows into the next page as they do a contiguous cache's rows.
constexpr int kFewRowsAhead = 8;

// One instruction set's kernels.
struct Kernels {
  const char* name;  // "avx512" or "avx2"
  // C (m x n, rows ldc apart) = A B, or C + A B with `accumulate`.  B (k x n): row l at b + l * ldb,
  // its n floats contiguous.  Nothing past n columns of B or C is read or written.  Each C entry is
  // one float32 FMA chain over l = 0 .. k-1 in order, so results do not depend on threads (nor on
  // the instruction set).
  void (*product)(int m, int n, int k, const StridedOperand& a, const float* b, int64_t ldb, float* c, int64_t ldc,
                  bool accumulate);
  // dst (cols x rows, rows dst_ld apart) = src^T for src (rows x cols, rows src_ld apart): the B
  // operand K^T from K's rows, by gathers (the scalar loop it replaced was ~6% of a causal fp32 D128
  // S=1024 forward).
  void (*transpose)(const float* src, int64_t src_ld, int rows, int cols, float* dst, int64_t dst_ld);
  // A decode step's products, for a few query rows (a KV group's heads of one token, say) against
  // K and V rows read where they lie (k_rows[c] and v_rows[c]: key c's row of `dim` `dtype`
  // elements, anywhere, in a contiguous cache or in pages; bf16/fp16 widened to float as loaded),
  // each requested kFewRowsAhead rows before its use: S (rows x cols, ld lds) = Q K^T, and O (rows
  // x dim, ld ldo) += P V.  The row lists hold `listed` >= cols addresses; those past cols (the
  // next tile's first rows) are only requested.  Their sums run in another order than product's (S
  // by vector lanes, then across them).
  void (*few_rows_scores)(int rows, int cols, int listed, int dim, const float* q, int64_t ldq,
                          const void* const* k_rows, tileattn_dtype dtype, float* s, int64_t lds);
  void (*few_rows_accumulate)(int rows, int cols, int listed, int dim, const float* p, int64_t ldp,
                              const void* const* v_rows, tileattn_dtype dtype, float* o, int64_t ldo);
};

// The kernels this call should use, or null for OpenBLAS's sgemm: TILEATTN_CPU_SIMD (read on every
// call) = auto takes AVX-512F where the CPU has it, else AVX2 with FMA, else none; avx2 takes AVX2
// (so an AVX-512 host tests the kernels of CPUs without it; raises naming the variable where the
// CPU has no AVX2); off keeps sgemm, the path of CPUs with neither.  Any other value raises.
const Kernels* kernels();

// The kernels of one instruction set, or null where this CPU lacks it (the tests' way to both).
const Kernels* avx512_kernels();
const Kernels* avx2_kernels();

// The row length, in floats, to store a B operand of n columns with: n rounded up to whole 64-byte
// lines, then to an odd number of them, so that consecutive rows start in different L1 sets.  B's
// rows at a multiple of 512 bytes (D = 128 floats) fill only half of L1's 64 sets with a 64-column
// panel (4 lines a row), which then does not fit in the 12 ways of the others: the products ran
// 0.90-0.95x on such rows (one core, D128, against rows 576 bytes apart).
inline int64_t padded_ld(int n) {
  const int64_t lines = (n + 15) / 16;
  return 16 * (lines % 2 == 1 ? lines : lines + 1);
}

}  // namespace tileattn::cpu::simd
