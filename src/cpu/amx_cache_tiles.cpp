#include "cpu/amx_cache_tiles.h"

#include <algorithm>
#include <cstring>

#include "cpu/amx_bf16.h"
#include "cpu/amx_target.h"
#include "tileattn/tileattn.hpp"

namespace tileattn::cpu::amx {

void pack_cache_query(const float* q, int64_t q_ld, int rows, int dim, CacheTileScratch& w) {
  w.query_columns = round_up(rows, kColsPerTile);
  pack_pairs_transposed(q, static_cast<int>(q_ld), rows, dim, w.query_columns, dim, w.q_transposed.data());
}

void cache_scores(Engine engine, const StridedRows& k, const SequenceView& seq, int head, int col0, int cols,
                  int rows, int dim, CacheTileScratch& w, float* scores, int lds) {
  const uint16_t* base = static_cast<const uint16_t*>(k.data);
  const int n = w.query_columns;
  for (int g = 0; g < cols;) {
    const int keys = std::min(kRowsPerTile, cols - g);
    const int64_t first = k.offset(seq, col0 + g, head);
    // Groups of 16 keys whose rows lie row_stride apart (a contiguous cache; a paged one within a
    // page) are read in place, as many in one product as continue the run (each product loads and
    // releases the tile configuration, which per group of 16 cost more than the group's loads);
    // others (a short last group, a group across pages) are copied, zero-padded.
    auto spaced = [&](int start, int count) {
      return k.offset(seq, col0 + start + count - 1, head) - first == (start - g + count - 1) * k.row_stride;
    };
    int run = 0;
    while (g + run + kRowsPerTile <= cols && spaced(g + run, kRowsPerTile)) run += kRowsPerTile;
    if (run > 0) {
      product(engine, run, n, dim, {base + first, static_cast<int>(k.row_stride)}, {w.q_transposed.data(), 2 * n},
              w.scores_transposed.data() + static_cast<int64_t>(g) * n, n, false);
      g += run;
      continue;
    }
    for (int r = 0; r < kRowsPerTile; ++r) {
      uint16_t* row = w.k_rows.data() + static_cast<int64_t>(r) * dim;
      if (r < keys) {
        std::memcpy(row, base + k.offset(seq, col0 + g + r, head), sizeof(uint16_t) * dim);
      } else {
        std::fill(row, row + dim, uint16_t{0});
      }
    }
    product(engine, kRowsPerTile, n, dim, {w.k_rows.data(), dim}, {w.q_transposed.data(), 2 * n},
            w.scores_transposed.data() + static_cast<int64_t>(g) * n, n, false);
    g += kRowsPerTile;
  }
  for (int r = 0; r < rows; ++r) {
    float* out = scores + static_cast<int64_t>(r) * lds;
    for (int c = 0; c < cols; ++c) out[c] = w.scores_transposed[static_cast<size_t>(c) * n + r];
  }
}

#if TILEATTN_AMX_BUILT
namespace {

// One pair row of V's B layout from two cache rows (either may be absent: zeros), 32 columns at a
// time: a two-source word permutation puts even[j], odd[j] at 2j, 2j + 1.
TILEATTN_AMX_TARGET void interleave_rows(const uint16_t* even, const uint16_t* odd, int dim, uint16_t* out) {
  alignas(64) static constexpr uint16_t kLow[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                                    8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static constexpr uint16_t kHigh[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                                     24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i low = _mm512_load_si512(kLow), high = _mm512_load_si512(kHigh);
  for (int n = 0; n < dim; n += 32) {
    const __m512i e = even ? _mm512_loadu_si512(even + n) : _mm512_setzero_si512();
    const __m512i o = odd ? _mm512_loadu_si512(odd + n) : _mm512_setzero_si512();
    _mm512_storeu_si512(out + 2 * n, _mm512_permutex2var_epi16(e, low, o));
    _mm512_storeu_si512(out + 2 * n + 32, _mm512_permutex2var_epi16(e, high, o));
  }
}

}  // namespace

void cache_accumulate_pv(Engine engine, const StridedRows& v, const SequenceView& seq, int head, int col0, int cols,
                         int rows_padded, int dim, const uint16_t* p, int p_ld, CacheTileScratch& w, float* out,
                         int out_ld) {
  const uint16_t* base = static_cast<const uint16_t*>(v.data);
  const int depth = round_up(cols, kDepthPerStep);
  for (int t = 0; t < depth / 2; ++t) {
    const int even = 2 * t, odd = 2 * t + 1;
    interleave_rows(even < cols ? base + v.offset(seq, col0 + even, head) : nullptr,
                    odd < cols ? base + v.offset(seq, col0 + odd, head) : nullptr, dim,
                    w.v_pairs.data() + static_cast<int64_t>(t) * 2 * dim);
  }
  product(engine, rows_padded, dim, depth, {p, p_ld}, {w.v_pairs.data(), 2 * dim}, out, out_ld, true);
}
#else
void cache_accumulate_pv(Engine, const StridedRows&, const SequenceView&, int, int, int, int, int, const uint16_t*, int,
                         CacheTileScratch&, float*, int) {
  throw Error(ErrorCode::kInternal, "", "AMX cache tiles called in a build without AMX support");
}
#endif

}  // namespace tileattn::cpu::amx
