#include "cpu/amx_cache_tiles.h"

#include <algorithm>
#include <cstring>

#include "cpu/amx_bf16.h"

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

void cache_accumulate_pv(Engine engine, const StridedRows& v, const SequenceView& seq, int head, int col0, int cols,
                         int rows_padded, int dim, const uint16_t* p, int p_ld, CacheTileScratch& w, float* out,
                         int out_ld) {
  // V's rows interleaved in pairs straight from the cache, a key past cols a row of zeros (its row
  // address unused: nothing is read for it).
  const uint16_t* base = static_cast<const uint16_t*>(v.data);
  const int depth = round_up(cols, kDepthPerStep);
  for (int t = 0; t < depth / 2; ++t) {
    const int even = 2 * t, odd = 2 * t + 1;
    pack_pair_row(even < cols ? base + v.offset(seq, col0 + even, head) : base, even < cols ? dim : 0,
                  odd < cols ? base + v.offset(seq, col0 + odd, head) : base, odd < cols ? dim : 0, dim,
                  w.v_pairs.data() + static_cast<int64_t>(t) * 2 * dim);
  }
  product(engine, rows_padded, dim, depth, {p, p_ld}, {w.v_pairs.data(), 2 * dim}, out, out_ld, true);
}

}  // namespace tileattn::cpu::amx
