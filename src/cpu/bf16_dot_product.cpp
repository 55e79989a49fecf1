#include "cpu/bf16_dot_product.h"

#include <cstdint>
#include <cstring>

#include "cpu/amx_target.h"  // TILEATTN_AMX_BUILT: x86-64 Linux GCC, immintrin.h included
#include "tileattn/tileattn.hpp"

namespace tileattn::cpu::bf16_dot {

#if TILEATTN_AMX_BUILT
bool hardware_ready() {
  // libgcc's checks include the OS's XCR0 bits for the zmm state.
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512bf16");
}

namespace {

#define TILEATTN_BF16_DOT_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))

// One A entry pair (row i, depth 2t and 2t + 1) in every lane: the compiler folds it into
// vdpbf16ps as a {1to16} memory operand.
TILEATTN_BF16_DOT_TARGET inline __m512bh pair_broadcast(const uint16_t* at) {
  int32_t bits;
  std::memcpy(&bits, at, sizeof(bits));
  return reinterpret_cast<__m512bh>(_mm512_set1_epi32(bits));
}

// A block of MR rows x NV vectors (16 columns each) of C over the whole depth: per pair row, NV
// loads of B and MR broadcasts of A feed MR x NV vdpbf16ps.  Zen 5 issues two 512-bit vdpbf16ps a
// cycle at a latency of ~6, so at least 12 independent sums must be in flight: 4 x 4 keeps 16, with
// 4 B loads and 4 broadcasts for 16 instructions.  One core of a Zen 5 EPYC, 128 x 128 x 128:
// 4 x 4 477 GFLOP/s, 8 x 3 458, 8 x 2 452, 16 x 1 221 (its 16 broadcasts a pair row bound it);
// the float32 kernels' 6 x 4 FMA block 226.
template <int MR, int NV>
TILEATTN_BF16_DOT_TARGET void product_block(const uint16_t* a, int lda, const uint16_t* b, int ldb, int pairs,
                                            float* c, int ldc, bool accumulate) {
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      acc[i][j] = accumulate ? _mm512_loadu_ps(c + static_cast<int64_t>(i) * ldc + 16 * j) : _mm512_setzero_ps();
    }
  }
  for (int t = 0; t < pairs; ++t) {
    const uint16_t* b_row = b + static_cast<int64_t>(t) * ldb;
    __m512bh bv[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) bv[j] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b_row + 32 * j));
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512bh av = pair_broadcast(a + static_cast<int64_t>(i) * lda + 2 * t);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], av, bv[j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) _mm512_storeu_ps(c + static_cast<int64_t>(i) * ldc + 16 * j, acc[i][j]);
  }
}

constexpr int kBlockRows = 4, kBlockVectors = 4;

// The columns [col, col + 16 vectors) of every row block: B's panel of those columns (depth / 2
// pair rows of 64 bytes a vector, 32 KB at depth 256) stays in L1 while the rows pass over it.
template <int NV>
TILEATTN_BF16_DOT_TARGET void column_panel(int m, int col, int pairs, const amx::RowsOperand& a,
                                           const amx::PairsOperand& b, float* c, int ldc, bool accumulate) {
  for (int row = 0; row < m; row += kBlockRows) {
    product_block<kBlockRows, NV>(a.data + static_cast<int64_t>(row) * a.ld, a.ld, b.data + 2 * col, b.ld, pairs,
                                  c + static_cast<int64_t>(row) * ldc + col, ldc, accumulate);
  }
}

}  // namespace

TILEATTN_BF16_DOT_TARGET void product(int m, int n, int depth, const amx::RowsOperand& a, const amx::PairsOperand& b,
                                      float* c, int ldc, bool accumulate) {
  static_assert(amx::kRowsPerTile % kBlockRows == 0, "m, a multiple of 16, must split into whole row blocks");
  const int pairs = depth / 2;
  int col = 0;
  for (; col + 16 * kBlockVectors <= n; col += 16 * kBlockVectors) {
    column_panel<kBlockVectors>(m, col, pairs, a, b, c, ldc, accumulate);
  }
  switch ((n - col) / 16) {
    case 1: column_panel<1>(m, col, pairs, a, b, c, ldc, accumulate); break;
    case 2: column_panel<2>(m, col, pairs, a, b, c, ldc, accumulate); break;
    case 3: column_panel<3>(m, col, pairs, a, b, c, ldc, accumulate); break;
    default: break;
  }
}
#else
bool hardware_ready() { return false; }

void product(int, int, int, const amx::RowsOperand&, const amx::PairsOperand&, float*, int, bool) {
  throw Error(ErrorCode::kInternal, "", "AVX512-BF16 product called in a build without it");
}
#endif

}  // namespace tileattn::cpu::bf16_dot
