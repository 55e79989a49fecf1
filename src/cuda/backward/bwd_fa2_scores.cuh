// The elementwise middle of one backward step, on the register tiles of S = Q K^T and
// dP = dO V^T that each thread holds (FA2 Algorithm 2 lines 13-16, with every forward feature):
//   s   = scale * S,  softcapped: s = cap tanh(s / cap),  minus the ALiBi bias slope |i + Sk - Sq - j|
//   P   = exp(s - LSE)                    (0 where the mask hides (i, j))
//   Z   = dropout mask / (1 - p)          (1 without dropout)
//   dS  = P o (Z o dP - D) o (1 - tanh^2)  (the softcap's derivative; scale is applied to dK, dQ)
// and overwrites S with Z o P (what dV = (Z o P)^T dO needs) and dP with dS.
#pragma once

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
  static_assert(decltype(cute::size<1, 0>(scores))::value == 2, "column pairs (one Philox group)");
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const int row = m0 + cute::get<0>(coords(r, 0));
    ColumnRange visible{0, 0};
    if constexpr (kMasked) {
      visible = visible_columns(row, rule.seqlen_q, rule.seqlen_k, rule.window_left, rule.window_right);
    }
    CUTE_UNROLL
    for (int c = 0; c < cute::size<1>(scores); c += 2) {
      const int col0 = n0 + cute::get<1>(coords(r, c));
      float keep[2] = {1.f, 1.f};
      if constexpr (kDropout) {
        const Philox4x32 draws = dropout_draws(rule.seed, rule.offset, rule.batch_index, rule.head,
                                               rule.num_heads, row, col0);
        keep[0] = draws.x[col0 & 3] >= rule.dropout_threshold ? rule.keep_scale : 0.f;
        keep[1] = draws.x[(col0 + 1) & 3] >= rule.dropout_threshold ? rule.keep_scale : 0.f;
      }
      CUTE_UNROLL
      for (int j = 0; j < 2; ++j) {
        const int col = col0 + j;
        float p, dtanh = 1.f;
        if constexpr (kTransforms) {
          float s = scores(r, c + j) * rule.scale;
          if (rule.softcap > 0.f) {
            const float th = tanhf(s / rule.softcap);
            dtanh = 1.f - th * th;
            s = rule.softcap * th;
          }
          s -= rule.alibi_slope * alibi_distance(row, col, rule.seqlen_q, rule.seqlen_k);
          p = fast_exp2(s * kLog2e - lse_log2[r]);
        } else {
          // One FFMA: the scale and log2(e) fold into scale_log2 (FA2 change 3).
          p = fast_exp2(scores(r, c + j) * scale_log2 - lse_log2[r]);
        }
        if constexpr (kMasked) {
          if (col < visible.first || col > visible.last) p = 0.f;
        }
        scores(r, c + j) = p * keep[j];
        dprobs(r, c + j) = p * (dprobs(r, c + j) * keep[j] - delta[r]) * dtanh;
      }
    }
  }
}

}  // namespace tileattn::cuda::bwd
