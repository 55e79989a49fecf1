// Masks and score transforms as small policy objects, plus the split of a CTA's key blocks into
// the ones that need masking and the clean ones (FA2 change 4: the clean blocks, the common case,
// run with no mask code at all).
//
// All coordinates here are within one sequence: row in [0, seqlen_q), col in [0, seqlen_k).
#pragma once

#include <cute/tensor.hpp>

#include "common/mask.h"
#include "common/philox.h"

namespace tileattn::cuda {

// Which key blocks a query tile [m0, m0 + block_m) visits, and which of them need the mask.
// Blocks run from n_block_max - 1 down to n_block_min; a block n is clean when all its columns are
// visible from every row of the tile:
//   n * block_n >= left_clean_col  and  (n + 1) * block_n <= right_clean_col.
struct KeyBlockRange {
  int n_block_min;
  int n_block_max;      // exclusive; n_block_max <= n_block_min means no row sees any key
  int right_clean_col;  // columns below this are visible from the tile's first row (right side)
  int left_clean_col;   // columns from this on are visible from the tile's last row (left side)

  __device__ __forceinline__ bool needs_mask(int n_block, int block_n) const {
    return (n_block + 1) * block_n > right_clean_col || n_block * block_n < left_clean_col;
  }
};

__device__ __forceinline__ KeyBlockRange key_block_range(int m0, int block_m, int block_n, int seqlen_q,
                                                         int seqlen_k, int window_left,
                                                         int window_right) {
  // Row i sees [i + d - window_left, i + d + window_right] clipped to [0, seqlen_k), d = Sk - Sq.
  // The interval slides right by one per row and keeps its width (>= 1), so over the tile's rows
  // [m0, last_row] the visible columns form the one interval [lo, hi].
  const long long diagonal = static_cast<long long>(seqlen_k) - seqlen_q;
  const long long last_row = min(m0 + block_m, seqlen_q) - 1;
  long long lo = 0, hi = seqlen_k - 1;
  if (window_left >= 0) lo = max(lo, m0 + diagonal - window_left);
  if (window_right >= 0) hi = min(hi, last_row + diagonal + window_right);
  KeyBlockRange range;
  range.n_block_min = lo > hi ? 0 : static_cast<int>(lo / block_n);
  range.n_block_max = lo > hi ? 0 : static_cast<int>(hi / block_n) + 1;
  // Clean-column bounds use the tile's full block_m rows: masking a few more blocks than needed
  // (in a ragged last tile) is harmless, masking fewer would not be.
  long long right = seqlen_k;
  if (window_right >= 0) right = min(right, m0 + diagonal + window_right + 1);
  long long left = 0;
  if (window_left >= 0) left = max(left, m0 + block_m - 1 + diagonal - window_left);
  range.right_clean_col = static_cast<int>(max(right, 0LL));
  range.left_clean_col = static_cast<int>(min(left, static_cast<long long>(seqlen_k)));
  return range;
}

// The mask's row of a query row: the row itself, except where the KV-cache route packs a KV
// group's query heads into a token's rows (sm90/row_tokens.h's RowTokens reads the row's token).
struct RowIsToken {
  __device__ __forceinline__ int token(int row) const { return row; }
};

// Sets scores of invisible (row, col) pairs to -inf: the causal / sliding-window rule of
// common/mask.h, read at each row's token (`rows`), which also hides columns at or past seqlen_k.
// Applied to masked blocks only.  kLeftEdge false: the caller guarantees window_left < 0, so no
// row has a left edge (causal masks, right windows and the seqlen_k edge hide only columns past
// `last`) and a score takes one compare and a select instead of two compares and a select.  At the
// H200's power cap the instructions are joules: causal d128 512 +2.6%, d64 512 +2.2% back to back
// (session 43).
struct VisibilityMask {
  int seqlen_q, seqlen_k, window_left, window_right;  // seqlen_q in tokens

  // scores and coords: (rows, cols) views; coords hold tile-local (row, col).
  template <bool kLeftEdge = true, typename TensorS, typename TensorC, typename Rows = RowIsToken>
  __device__ __forceinline__ void apply(TensorS& scores, TensorC const& coords, int m0, int n0,
                                        Rows const& rows = {}) const {
    CUTE_UNROLL
    for (int r = 0; r < cute::size<0>(scores); ++r) {
      const int row = rows.token(m0 + cute::get<0>(coords(r, 0)));
      const ColumnRange visible = visible_columns(row, seqlen_q, seqlen_k, window_left, window_right);
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(scores); ++c) {
        const int col = n0 + cute::get<1>(coords(r, c));
        if constexpr (kLeftEdge) {
          if (col < visible.first || col > visible.last) scores(r, c) = -INFINITY;
        } else {
          if (col > visible.last) scores(r, c) = -INFINITY;
        }
      }
    }
  }
};

// Plain scores: s = <q, k>; the softmax scale is folded into the exp2 (scale_log2 = scale*log2 e).
struct PlainScores {
  static constexpr bool kTransforms = false;
  template <typename TensorS, typename TensorC>
  __device__ __forceinline__ void apply(TensorS&, TensorC const&, int, int) const {}
};

// Softcap and/or ALiBi (tileattn.h's formula).  The scores are scaled here, in natural units, and
// the softmax then runs with scale_log2 = log2 e.
struct ModifiedScores {
  static constexpr bool kTransforms = true;
  float softmax_scale;
  float softcap;      // 0 = off
  float alibi_slope;  // 0 = off
  int seqlen_q, seqlen_k;

  template <typename TensorS, typename TensorC>
  __device__ __forceinline__ void apply(TensorS& scores, TensorC const& coords, int m0, int n0) const {
    const float pre_tanh = softcap > 0.f ? softmax_scale / softcap : 0.f;
    CUTE_UNROLL
    for (int r = 0; r < cute::size<0>(scores); ++r) {
      const int row = m0 + cute::get<0>(coords(r, 0));
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(scores); ++c) {
        float s = scores(r, c);
        s = softcap > 0.f ? softcap * tanhf(s * pre_tanh) : s * softmax_scale;
        if (alibi_slope != 0.f) {
          const int col = n0 + cute::get<1>(coords(r, c));
          s -= alibi_slope * alibi_distance(row, col, seqlen_q, seqlen_k);
        }
        scores(r, c) = s;
      }
    }
  }
};

// No dropout: nothing to do.
struct NoDropout {
  static constexpr bool kEnabled = false;
  template <typename TensorP, typename TensorC>
  __device__ __forceinline__ void apply(TensorP&, TensorC const&, int, int) const {}
};

// Dropout with the shared Philox mapping of common/philox.h: element (row, col) of head `head` in
// batch `batch` is kept when its draw is >= threshold.  Dropped probabilities become 0 here; the
// 1/(1-p) factor is applied once in the softmax finalize.
//
// probs is the (rows, cols) view of an mma.sync m16n8 or wgmma accumulator whose warps do not
// split the keys (the sm80 and sm90 forward kernels): rows 2k and 2k+1 are rows i and i+8 of one
// 16-row band, columns 4g .. 4g+3 are j, j+1, j+8, j+9 of the g-th 16-column band.  Those eight
// elements are one Philox group, so one call serves eight elements, each taking slot
// 4 (row half) + (column index within the four) of it.  A view ordered otherwise draws the
// wrong slots, which the GPU suite's comparison with the CPU's mask (test_dropout) catches.
//
// The calls run in a loop that is not unrolled and leave one keep bit an element: unrolled, the
// compiler interleaved all eight calls of a 64 x 128 tile next to the live S, P and O fragments
// and spilled (ptxas: 496 bytes a thread at d128; Nsight Compute: 98M local-memory requests in one
// d128 8k forward, issue slots 25% busy).
struct PhiloxDropout {
  static constexpr bool kEnabled = true;
  uint64_t seed, offset;
  int batch, head, num_heads;
  uint32_t threshold;

  // Keep bits of the `count` groups of one row pair from column col on, 16 columns apart: bit
  // 8 g + slot for the g-th.
  __device__ __forceinline__ uint32_t keep_bits(int row, int col, int count) const {
    uint32_t bits = 0;
#pragma unroll 1
    for (int g = 0; g < count; ++g) {
      const Philox4x32 draws = dropout_draws(seed, offset, batch, head, num_heads, row, col + 16 * g);
      uint32_t byte = 0;
      CUTE_UNROLL
      for (int slot = 0; slot < 8; ++slot) byte |= uint32_t(dropout_draw16(draws, slot) >= threshold) << slot;
      bits |= byte << (8 * g);
    }
    return bits;
  }

  template <typename TensorP, typename TensorC>
  __device__ __forceinline__ void apply(TensorP& probs, TensorC const& coords, int m0, int n0) const {
    static_assert(decltype(cute::size<0>(probs))::value % 2 == 0, "row halves i, i + 8");
    static_assert(decltype(cute::size<1>(probs))::value % 4 == 0, "two column pairs a 16-column band");
    constexpr int kGroups = decltype(cute::size<1>(probs))::value / 4;  // 16-column bands a row pair
    using Value = typename TensorP::value_type;  // float, or the 16-bit copy of P (sm90)
    CUTE_UNROLL
    for (int r = 0; r < cute::size<0>(probs); r += 2) {
      const int row = m0 + cute::get<0>(coords(r, 0)), col = n0 + cute::get<1>(coords(r, 0));
      CUTE_UNROLL
      for (int word = 0; word < (kGroups + 3) / 4; ++word) {
        const int count = kGroups - 4 * word < 4 ? kGroups - 4 * word : 4;
        const uint32_t bits = keep_bits(row, col + 64 * word, count);
        CUTE_UNROLL
        for (int g = 0; g < count; ++g) {
          CUTE_UNROLL
          for (int half = 0; half < 2; ++half) {
            CUTE_UNROLL
            for (int k = 0; k < 4; ++k) {
              if (!((bits >> (8 * g + 4 * half + k)) & 1u)) probs(r + half, 4 * (4 * word + g) + k) = Value(0.f);
            }
          }
        }
      }
    }
  }
};

}  // namespace tileattn::cuda
