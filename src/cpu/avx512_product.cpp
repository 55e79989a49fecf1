#include "cpu/avx512_product.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>

#include "common/env_choice.h"
#include "cpu/amx_target.h"  // TILEATTN_AMX_BUILT: x86-64 Linux GCC, immintrin.h included

namespace tileattn::cpu::avx512 {

#if TILEATTN_AMX_BUILT

#define TILEATTN_AVX512_TARGET __attribute__((target("avx512f")))

namespace {

// The register block: kRows rows x kVectors 16-float vectors of C held in 24 of the 32 zmm
// registers, two more for B's vectors; each depth step loads 4 B vectors and broadcasts 6 A
// entries for 24 FMAs, 12 cycles on two FMA ports.  12 x 32 (two B vectors) ran at 40% of this
// on GCC 12 (it kept 12 row addresses live and spilled), 4 x 64 at 0.8-0.9x.
constexpr int kRows = 6;
constexpr int kVectors = 4;
constexpr int kLanes = 16;

// C rows [0, R) x columns [0, 16 NV) of the block, the last vector's lanes limited to `tail` unless
// kWhole (then every lane: GCC otherwise reloaded the mask register from the stack at every depth
// step, and the whole-lane clone ran 1.05-1.1x on one core).
template <int R, int NV, bool kWhole>
TILEATTN_AVX512_TARGET void block(int k, const float* a, int64_t a_row, int64_t a_depth, const float* b, int64_t ldb,
                                  float* c, int64_t ldc, __mmask16 tail, bool accumulate) {
  auto lanes = [tail](int v) { return v == NV - 1 && !kWhole ? tail : static_cast<__mmask16>(0xFFFF); };
  __m512 acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      acc[r][v] = accumulate ? _mm512_maskz_loadu_ps(lanes(v), c + r * ldc + v * kLanes) : _mm512_setzero_ps();
    }
  }
#pragma GCC unroll 2
  for (int l = 0; l < k; ++l) {
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_maskz_loadu_ps(lanes(v), b + l * ldb + v * kLanes);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 ar = _mm512_set1_ps(a[r * a_row + l * a_depth]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(ar, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) _mm512_mask_storeu_ps(c + r * ldc + v * kLanes, lanes(v), acc[r][v]);
  }
}

using BlockFn = void (*)(int, const float*, int64_t, int64_t, const float*, int64_t, float*, int64_t, __mmask16, bool);

template <int R, bool kWhole>
constexpr BlockFn block_of_width(int vectors) {
  return vectors == 1   ? block<R, 1, kWhole>
         : vectors == 2 ? block<R, 2, kWhole>
         : vectors == 3 ? block<R, 3, kWhole>
                        : block<R, 4, kWhole>;
}

template <bool kWhole>
BlockFn block_fn(int rows, int vectors) {
  switch (rows) {
    case 1: return block_of_width<1, kWhole>(vectors);
    case 2: return block_of_width<2, kWhole>(vectors);
    case 3: return block_of_width<3, kWhole>(vectors);
    case 4: return block_of_width<4, kWhole>(vectors);
    case 5: return block_of_width<5, kWhole>(vectors);
    default: return block_of_width<6, kWhole>(vectors);
  }
}

}  // namespace

bool enabled() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return env_choice("TILEATTN_CPU_AVX512", {"auto", "off"}) == 0 && has;
}

// Column panels of 64 outside, row blocks inside: a panel of B (k x 64 floats, 32 KB at k = 128)
// stays in L1 while A's rows stream past it.
void product(int m, int n, int k, const StridedOperand& a, const float* b, int64_t ldb, float* c, int64_t ldc,
             bool accumulate) {
  constexpr int kPanel = kVectors * kLanes;
  for (int n0 = 0; n0 < n; n0 += kPanel) {
    const int width = std::min(kPanel, n - n0);
    const int vectors = (width + kLanes - 1) / kLanes;
    const __mmask16 tail = width % kLanes == 0 ? 0xFFFF : static_cast<__mmask16>((1u << (width % kLanes)) - 1);
    const bool whole = tail == 0xFFFF;
    for (int m0 = 0; m0 < m; m0 += kRows) {
      const int rows = std::min(kRows, m - m0);
      const BlockFn fn = whole ? block_fn<true>(rows, vectors) : block_fn<false>(rows, vectors);
      fn(k, a.data + m0 * a.row, a.row, a.depth, b + n0, ldb, c + m0 * ldc + n0, ldc, tail, accumulate);
    }
  }
}

TILEATTN_AVX512_TARGET void transpose(const float* src, int64_t src_ld, int rows, int cols, float* dst,
                                      int64_t dst_ld) {
  // The gathers' offsets are 32-bit: rows further apart (a view with a huge key stride) go one by one.
  if (src_ld > std::numeric_limits<int32_t>::max() / kLanes) {
    for (int c = 0; c < cols; ++c) {
      for (int r = 0; r < rows; ++r) dst[c * dst_ld + r] = src[r * src_ld + c];
    }
    return;
  }
  const __m512i row_offsets = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                 _mm512_set1_epi32(static_cast<int>(src_ld)));
  for (int r0 = 0; r0 < rows; r0 += kLanes) {
    const int count = std::min(kLanes, rows - r0);
    const __mmask16 lanes = count == kLanes ? 0xFFFF : static_cast<__mmask16>((1u << count) - 1);
    const float* column = src + r0 * src_ld;
    for (int c = 0; c < cols; ++c) {
      const __m512 values = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), lanes, row_offsets, column + c, 4);
      _mm512_mask_storeu_ps(dst + c * dst_ld + r0, lanes, values);
    }
  }
}

#else

bool enabled() {
  env_choice("TILEATTN_CPU_AVX512", {"auto", "off"});  // a bad value raises on every build
  return false;
}

void product(int, int, int, const StridedOperand&, const float*, int64_t, float*, int64_t, bool) {
  throw std::logic_error("avx512::product called where avx512::enabled() is false");
}

void transpose(const float*, int64_t, int, int, float*, int64_t) {
  throw std::logic_error("avx512::transpose called where avx512::enabled() is false");
}

#endif

}  // namespace tileattn::cpu::avx512
