// The elementwise middle of one backward step, on the register tiles of S = Q K^T and
// dP = dO V^T that each thread holds (FA2 Algorithm 2 lines 13-16, with every forward feature):
//   s   = scale * S,  softcapped: s = cap tanh(s / cap),  minus the ALiBi bias slope |i + Sk - Sq - j|
//   P   = exp(s - LSE)                    (0 where the mask hides (i, j))
//   Z   = dropout mask / (1 - p)          (1 without dropout)
//   dS  = P o (Z o dP - D) o (1 - tanh^2)  (the softcap's derivative; scale is applied to dK, dQ)
// and overwrites S with Z o P (what dV = (Z o P)^T dO needs) and dP with dS.
#pragma once

#include <type_traits>

#include <cute/tensor.hpp>

#include "common/mask.h"
#include "common/philox.h"
#include "cuda/backward/bwd_tiles.cuh"  // ScoreRule
#include "cuda/softmax_state.h"          // fast_exp2

namespace tileattn::cuda::bwd {

// scores, dprobs: (rows, cols) views of the accumulators; coords: tile-local (row, col) of each.
// lse_log2 and delta: per row of the view.  kMasked: the tile crosses the causal / window edge
// or the end of the keys; kTransforms: softcap or ALiBi is on; kDropout: dropout is on.
template <bool kMasked, bool kTransforms, bool kDropout, int kRows, typename TensorS, typename TensorP,
          typename TensorC>
__device__ __forceinline__ void probs_and_score_grads(TensorS& scores, TensorP& dprobs, TensorC const& coords,
                                                      const float (&lse_log2)[kRows],
                                                      const float (&delta)[kRows], const ScoreRule& rule,
                                                      float scale_log2, int m0, int n0) {
  static_assert(decltype(cute::size<0>(scores))::value == kRows);
  static_assert(kRows % 2 == 0 && decltype(cute::size<1, 0>(scores))::value == 2,
                "rows i, i + 8 adjacent and column pairs (half of one Philox group)");
  // Rows r, r + 1 of the view are rows i, i + 8 of one 16-row band.  With the mma.sync products
  // this kernel's warps split the keys, so a thread's next column pair lies in another warp's 8
  // columns: one Philox call serves the four elements (i, i + 8) x (j, j + 1), words 0 and 2 of
  // the group, or 1 and 3 when j lies in the group's second 8 columns (common/philox.h).  In the
  // wgmma views of the sm90 products a thread's next pair is j + 8, the rest of the same group, so
  // one call serves all eight (checked per call from the coordinates: half the calls at d64 and
  // d256, where dropout's backward runs this kernel on Hopper).  The calls run first, in a loop
  // that is not unrolled, and leave four keep bits a column pair, as in the forward
  // (mask_policy.h), where unrolled calls spilled; here that measured even (d128 8k
  // forward+backward 245 TFLOP/s both ways), the kernel's own structure being what dropout's
  // backward waits on.
  constexpr int kCols = decltype(cute::size<1>(scores))::value;
  // Four keep bits a column pair: 32 bits hold the 8 column pairs of the mma.sync views, the
  // wgmma views of the sm90 products hold up to 16 (d64).
  using KeepBits = std::conditional_t<(kCols / 2 * 4 <= 32), uint32_t, uint64_t>;
  static_assert(kCols / 2 * 4 <= 64, "keep bits of a row pair fit two words");
  CUTE_UNROLL
  for (int r = 0; r < kRows; r += 2) {
    int rows[2];
    ColumnRange visible[2] = {{0, 0}, {0, 0}};
    CUTE_UNROLL
    for (int h = 0; h < 2; ++h) {
      rows[h] = m0 + cute::get<0>(coords(r + h, 0));
      if constexpr (kMasked) {
        visible[h] = visible_columns(rows[h], rule.seqlen_q, rule.seqlen_k, rule.window_left, rule.window_right);
      }
    }
    KeepBits keep_bits = 0;  // bit 4 (c / 2) + 2 h + j: element (r + h, c + j) is kept
    if constexpr (kDropout) {
      // The four keep bits of column pair c from its group's draws (band: which 8 columns).
      auto nibble_of = [&](const Philox4x32& draws, int band) {
        uint32_t nibble = 0;
        CUTE_UNROLL
        for (int h = 0; h < 2; ++h) {
          CUTE_UNROLL
          for (int j = 0; j < 2; ++j) {
            nibble |= uint32_t(dropout_draw16(draws, 4 * h + 2 * band + j) >= rule.dropout_threshold) << (2 * h + j);
          }
        }
        return nibble;
      };
#pragma unroll 1
      for (int c = 0; c < kCols;) {
        const int col0 = n0 + cute::get<1>(coords(r, c));
        const Philox4x32 draws = dropout_draws(rule.seed, rule.offset, rule.batch_index, rule.head,
                                               rule.num_heads, rows[0], col0);
        const int band = (col0 >> 3) & 1;
        keep_bits |= KeepBits(nibble_of(draws, band)) << (2 * c);
        // The next pair, 8 columns on, is the group's other half (wgmma views): same draws.
        if (band == 0 && c + 2 < kCols && cute::get<1>(coords(r, c + 2)) == cute::get<1>(coords(r, c)) + 8) {
          keep_bits |= KeepBits(nibble_of(draws, 1)) << (2 * (c + 2));
          c += 4;
        } else {
          c += 2;
        }
      }
    }
    CUTE_UNROLL
    for (int c = 0; c < kCols; c += 2) {
      const int col0 = n0 + cute::get<1>(coords(r, c));
      float keep[2][2] = {{1.f, 1.f}, {1.f, 1.f}};
      if constexpr (kDropout) {
        CUTE_UNROLL
        for (int h = 0; h < 2; ++h) {
          CUTE_UNROLL
          for (int j = 0; j < 2; ++j) keep[h][j] = (keep_bits >> (2 * c + 2 * h + j)) & 1u ? rule.keep_scale : 0.f;
        }
      }
      CUTE_UNROLL
      for (int h = 0; h < 2; ++h) {
        const int row = rows[h];
        CUTE_UNROLL
        for (int j = 0; j < 2; ++j) {
          const int col = col0 + j;
          float p, dtanh = 1.f;
          if constexpr (kTransforms) {
            float s = scores(r + h, c + j) * rule.scale;
            if (rule.softcap > 0.f) {
              const float th = tanhf(s / rule.softcap);
              dtanh = 1.f - th * th;
              s = rule.softcap * th;
            }
            s -= rule.alibi_slope * alibi_distance(row, col, rule.seqlen_q, rule.seqlen_k);
            p = fast_exp2(s * kLog2e - lse_log2[r + h]);
          } else {
            // One FFMA: the scale and log2(e) fold into scale_log2 (FA2 change 3).
            p = fast_exp2(scores(r + h, c + j) * scale_log2 - lse_log2[r + h]);
          }
          if constexpr (kMasked) {
            if (col < visible[h].first || col > visible[h].last) p = 0.f;
          }
          scores(r + h, c + j) = p * keep[h][j];
          dprobs(r + h, c + j) = p * (dprobs(r + h, c + j) * keep[h][j] - delta[r + h]) * dtanh;
        }
      }
    }
  }
}

}  // namespace tileattn::cuda::bwd
