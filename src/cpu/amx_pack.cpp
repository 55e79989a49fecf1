// The AMX path's operands: float32 rows rounded to bf16 into the A (rows) and B (pairs) layouts of
// amx_bf16.h, with the zero padding the 16 x 32 tiles need, and P's rows straight from the exp2
// pass.  AVX-512 throughout (these run only where amx::enabled() is true): VCVTNEPS2BF16 rounds
// 16 lanes at a time, where the generic conversion loops took 3-4x longer (session 54).
#include <algorithm>
#include <cstdint>

#include "cpu/amx_bf16.h"
#include "cpu/amx_target.h"
#include "cpu/exp2_poly.h"
#include "tileattn/tileattn.hpp"

namespace tileattn::cpu::amx {

#if TILEATTN_AMX_BUILT
namespace {

TILEATTN_AMX_TARGET inline __mmask16 first_lanes(int count) {
  return count >= 16 ? __mmask16(0xFFFF) : count <= 0 ? __mmask16(0) : __mmask16((1u << count) - 1);
}

// src[0 .. count) as bf16 into dst[0 .. padded), zeros past count; padded a multiple of 16.
// Masked loads read nothing past count (src may end there).
TILEATTN_AMX_TARGET void row_to_bf16(const float* src, int count, int padded, uint16_t* dst) {
  for (int i = 0; i < padded; i += 16) {
    const __m256bh bits = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(first_lanes(count - i), src + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), (__m256i)bits);
  }
}

TILEATTN_AMX_TARGET inline __mmask32 first_words(int count) {
  return count >= 32 ? __mmask32(0xFFFFFFFFu) : count <= 0 ? __mmask32(0) : __mmask32((1u << count) - 1);
}

// The same from bf16 values: a masked copy, 32 at a time.
TILEATTN_AMX_TARGET void row_to_bf16(const uint16_t* src, int count, int padded, uint16_t* dst) {
  for (int i = 0; i < padded; i += 32) {
    const __m512i words = _mm512_maskz_loadu_epi16(first_words(count - i), src + i);
    _mm512_mask_storeu_epi16(dst + i, first_words(padded - i), words);
  }
}

// 2^x on 16 lanes for P rounded to bf16: n = round(max(x, -126)), f = x - n, 2^f by kExp2PolyBf16
// (exp2_poly.h: 2.9e-6 relative, where vector_math.cpp's exp2_approx keeps float accuracy), times
// 2^n by VSCALEFPS; 0 where x < -126, NaN kept (VMAXPS returns its second operand when either is
// NaN, so the clamp lets a NaN through).  The clamp is at -126, not exp2_approx's -127, so that no
// lane ever makes a subnormal (the smallest is 2^-126, the polynomial being 1 at f = 0): the masked
// -inf scores of a causal tile made subnormals in VSCALEFPS, each a microcode assist, and this
// kernel took 19% of a causal forward against the products' 14%.
TILEATTN_AMX_TARGET inline __m512 exp2_lanes(__m512 x) {
  const __m512 clamped = _mm512_max_ps(_mm512_set1_ps(-126.0f), x);
  const __m512 n = _mm512_roundscale_ps(clamped, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(clamped, n);
  __m512 p = _mm512_set1_ps(kExp2PolyBf16[0]);
  for (int i = 1; i < 5; ++i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2PolyBf16[i]));
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_LT_OQ);
  return _mm512_mask_mov_ps(_mm512_scalef_ps(p, n), underflow, _mm512_setzero_ps());
}

// 16 columns of rows 2t (even) and 2t + 1 (odd) as one 64-byte row of the pairs layout, each bf16:
// VCVTNE2PS2BF16 puts the even row's values in the low half and the odd row's in the high half,
// and a word permutation interleaves them.
TILEATTN_AMX_TARGET inline __m512i bf16_pairs(__m512 even, __m512 odd) {
  alignas(64) static constexpr uint16_t kInterleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                           8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  return _mm512_permutexvar_epi16(_mm512_load_si512(kInterleave), (__m512i)_mm512_cvtne2ps_pbh(odd, even));
}

}  // namespace

TILEATTN_AMX_TARGET float exp2_row_to_bf16(const float* x, float scale, float shift, int count, int padded,
                                           uint16_t* y) {
  const __m512 factor = _mm512_set1_ps(scale), offset = _mm512_set1_ps(shift);
  __m512 sum = _mm512_setzero_ps();
  for (int i = 0; i < padded; i += 16) {
    const __mmask16 live = first_lanes(count - i);
    const __m512 exponent = _mm512_fmsub_ps(_mm512_maskz_loadu_ps(live, x + i), factor, offset);
    const __m512 power = _mm512_maskz_mov_ps(live, exp2_lanes(exponent));
    sum = _mm512_add_ps(sum, power);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), (__m256i)_mm512_cvtneps_pbh(power));
  }
  return _mm512_reduce_add_ps(sum);
}

TILEATTN_AMX_TARGET void backward_operands(const float* scores, const float* dprobs, const float* dtanh, int ld,
                                           const float* lse_log2, const float* delta, int rows, int cols,
                                           uint16_t* p_pairs, uint16_t* ds_pairs, uint16_t* ds_rows, int ds_rows_ld) {
  // Rows 2t and 2t + 1 at a time: their P and dS as pairs (bf16_pairs), their dS rows as they come.
  const int rows_deep = round_up(rows, kDepthPerStep), rows_tall = round_up(rows, kRowsPerTile);
  const int cols_wide = round_up(cols, kColsPerTile), cols_deep = round_up(cols, kDepthPerStep);
  for (int t = 0; t < rows_deep / 2; ++t) {
    uint16_t* p_out = p_pairs + static_cast<int64_t>(t) * 2 * cols_wide;
    uint16_t* ds_out = ds_pairs + static_cast<int64_t>(t) * 2 * cols_wide;
    for (int n = 0; n < cols_deep; n += 16) {
      __m512 p[2], ds[2];
      for (int half = 0; half < 2; ++half) {
        const int r = 2 * t + half;
        const bool real = r < rows;  // padding rows: no lane live, every output 0
        const __mmask16 live = first_lanes(real ? cols - n : 0);
        const int64_t at = static_cast<int64_t>(r) * ld + n;
        const __m512 exponent = _mm512_sub_ps(_mm512_maskz_loadu_ps(live, scores + at),
                                              _mm512_set1_ps(real ? lse_log2[r] : 0.0f));
        p[half] = _mm512_maskz_mov_ps(live, exp2_lanes(exponent));
        const __m512 gap = _mm512_sub_ps(_mm512_maskz_loadu_ps(live, dprobs + at), _mm512_set1_ps(real ? delta[r] : 0.0f));
        ds[half] = _mm512_maskz_mul_ps(live, p[half], gap);
        if (dtanh != nullptr) ds[half] = _mm512_mul_ps(ds[half], _mm512_maskz_loadu_ps(live, dtanh + at));
        if (r < rows_tall) {
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(ds_rows + static_cast<int64_t>(r) * ds_rows_ld + n),
                              (__m256i)_mm512_cvtneps_pbh(ds[half]));
        }
      }
      if (n < cols_wide) {
        _mm512_storeu_si512(p_out + 2 * n, bf16_pairs(p[0], p[1]));
        _mm512_storeu_si512(ds_out + 2 * n, bf16_pairs(ds[0], ds[1]));
      }
    }
  }
}

void pack_rows(const float* src, int src_ld, int rows, int depth, int rows_padded, int depth_padded, uint16_t* dst,
               int dst_ld) {
  for (int r = 0; r < rows_padded; ++r) {
    row_to_bf16(src + static_cast<int64_t>(r) * src_ld, r < rows ? depth : 0, depth_padded,
                dst + static_cast<int64_t>(r) * dst_ld);
  }
}

void pack_rows_transposed(const float* src, int src_ld, int src_rows, int src_cols, int rows_padded,
                          int depth_padded, uint16_t* dst, int dst_ld) {
  // Row c of A is column c of M: each row of M is converted once, then scattered down a column.
  for (int c = 0; c < rows_padded; ++c) std::fill(dst + static_cast<int64_t>(c) * dst_ld, dst + static_cast<int64_t>(c) * dst_ld + depth_padded, uint16_t{0});
  alignas(64) uint16_t row[256 + kColsPerTile];
  for (int r = 0; r < src_rows; ++r) {
    row_to_bf16(src + static_cast<int64_t>(r) * src_ld, src_cols, rows_padded, row);
    for (int c = 0; c < src_cols; ++c) dst[static_cast<int64_t>(c) * dst_ld + r] = row[c];
  }
}

namespace {

// pack_pairs_transposed from float32 or bf16 rows.
template <class Element>
TILEATTN_AMX_TARGET void pairs_transposed(const Element* src, int64_t src_ld, int cols, int depth, int cols_padded,
                                          int depth_padded, uint16_t* dst) {
  // Column c of B is row c of M, so each pair row t takes M[c][2t], M[c][2t + 1] for every c: a
  // transpose of M read as 32-bit pairs.  Sixteen rows of M at a time are converted into `rows`,
  // then each pair row's 16 values are gathered from them into one 64-byte store: the scalar
  // scatter this replaces (one store a pair, each to another line of B) was 6.3% of a causal bf16
  // d128 S1024 backward, which packs K^T and V^T once a key tile.
  uint32_t* out = reinterpret_cast<uint32_t*>(dst);
  const int pair_rows = depth_padded / 2;
  constexpr int kMaxPairRows = (256 + kDepthPerStep) / 2;
  alignas(64) uint32_t rows[16][kMaxPairRows];
  const __m512i row_starts = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                _mm512_set1_epi32(kMaxPairRows));
  for (int c0 = 0; c0 < cols_padded; c0 += 16) {
    for (int i = 0; i < 16; ++i) {
      const int c = c0 + i;
      row_to_bf16(src + static_cast<int64_t>(c) * src_ld, c < cols ? depth : 0, depth_padded,
                  reinterpret_cast<uint16_t*>(rows[i]));
    }
    for (int t = 0; t < pair_rows; ++t) {
      const __m512i pairs = _mm512_i32gather_epi32(row_starts, &rows[0][t], 4);
      _mm512_storeu_si512(out + static_cast<int64_t>(t) * cols_padded + c0, pairs);
    }
  }
}

}  // namespace

// 32 columns at a time, interleaved by two word permutations into two 64-byte pair-row pieces (the
// second stored only where cols_padded reaches it).
TILEATTN_AMX_TARGET void pack_pair_row(const uint16_t* even, int even_count, const uint16_t* odd, int odd_count,
                                       int cols_padded, uint16_t* out) {
  alignas(64) static constexpr uint16_t kLow[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                                    8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static constexpr uint16_t kHigh[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                                     24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i low = _mm512_load_si512(kLow), high = _mm512_load_si512(kHigh);
  for (int n = 0; n < cols_padded; n += 32) {
    const __m512i e = _mm512_maskz_loadu_epi16(first_words(even_count - n), even + n);
    const __m512i o = _mm512_maskz_loadu_epi16(first_words(odd_count - n), odd + n);
    _mm512_storeu_si512(out + 2 * n, _mm512_permutex2var_epi16(e, low, o));
    if (n + 16 < cols_padded) _mm512_storeu_si512(out + 2 * n + 32, _mm512_permutex2var_epi16(e, high, o));
  }
}

TILEATTN_AMX_TARGET void pack_pairs_transposed(const float* src, int src_ld, int cols, int depth, int cols_padded,
                                               int depth_padded, uint16_t* dst) {
  pairs_transposed(src, src_ld, cols, depth, cols_padded, depth_padded, dst);
}

TILEATTN_AMX_TARGET void pack_pairs_transposed(const uint16_t* src, int64_t src_ld, int cols, int depth,
                                               int cols_padded, int depth_padded, uint16_t* dst) {
  pairs_transposed(src, src_ld, cols, depth, cols_padded, depth_padded, dst);
}

TILEATTN_AMX_TARGET void pack_pairs(const uint16_t* src, int64_t src_ld, int depth, int cols, int depth_padded,
                                    int cols_padded, uint16_t* dst) {
  for (int t = 0; t < depth_padded / 2; ++t) {
    const uint16_t* even = src + static_cast<int64_t>(2 * t) * src_ld;
    pack_pair_row(even, 2 * t < depth ? cols : 0, even + src_ld, 2 * t + 1 < depth ? cols : 0, cols_padded,
                  dst + static_cast<int64_t>(t) * 2 * cols_padded);
  }
}

TILEATTN_AMX_TARGET void pack_pairs(const float* src, int src_ld, int depth, int cols, int depth_padded,
                                    int cols_padded, uint16_t* dst) {
  // Rows 2t and 2t + 1 of M, 16 columns at a time (bf16_pairs).
  for (int t = 0; t < depth_padded / 2; ++t) {
    const float* even = src + static_cast<int64_t>(2 * t) * src_ld;
    const float* odd = even + src_ld;
    const int even_count = 2 * t < depth ? cols : 0, odd_count = 2 * t + 1 < depth ? cols : 0;
    uint16_t* out = dst + static_cast<int64_t>(t) * 2 * cols_padded;
    for (int n = 0; n < cols_padded; n += 16) {
      _mm512_storeu_si512(out + 2 * n, bf16_pairs(_mm512_maskz_loadu_ps(first_lanes(even_count - n), even + n),
                                                  _mm512_maskz_loadu_ps(first_lanes(odd_count - n), odd + n)));
    }
  }
}
#else
namespace {
[[noreturn]] void not_built() { throw Error(ErrorCode::kInternal, "", "AMX packing called in a build without AMX support"); }
}  // namespace

float exp2_row_to_bf16(const float*, float, float, int, int, uint16_t*) { not_built(); }
void backward_operands(const float*, const float*, const float*, int, const float*, const float*, int, int, uint16_t*,
                       uint16_t*, uint16_t*, int) {
  not_built();
}
void pack_rows(const float*, int, int, int, int, int, uint16_t*, int) { not_built(); }
void pack_rows_transposed(const float*, int, int, int, int, int, uint16_t*, int) { not_built(); }
void pack_pairs_transposed(const float*, int, int, int, int, int, uint16_t*) { not_built(); }
void pack_pairs_transposed(const uint16_t*, int64_t, int, int, int, int, uint16_t*) { not_built(); }
void pack_pairs(const uint16_t*, int64_t, int, int, int, int, uint16_t*) { not_built(); }
void pack_pair_row(const uint16_t*, int, const uint16_t*, int, int, uint16_t*) { not_built(); }
void pack_pairs(const float*, int, int, int, int, int, uint16_t*) { not_built(); }
#endif

}  // namespace tileattn::cpu::amx
