// Online softmax for the sm90 consumers, split in two so that it can overlap the PV wgmma of the
// previous key block (FlashAttention-3, section 3.2):
//   score_step():  m_new = max(m_old, rowmax(S)),  P = exp2(S * scale_log2 - m_new * scale_log2),
//                  l = l * exp2((m_old - m_new) * scale_log2) + rowsum(P)    -- touches no O
//   rescale_o():   O = O * exp2((m_old - m_new) * scale_log2)                -- after PV(j-1) landed
// Same conventions as the sm80 family's softmax_state.h: raw scores, base 2 with the scale folded
// into one FFMA, -inf rows use offset 0 and end with O = 0, LSE = +inf.
//
// Also here: the wgmma accumulator seen as a (rows, cols) matrix and as the A operand of the
// next wgmma (P kept in registers).
#pragma once

#include <cute/tensor.hpp>

#include "cuda/cute_utils.h"
#include "cuda/softmax_state.h"

namespace tileattn::cuda::sm90 {

// A 64 x N wgmma accumulator gives each thread ((2 cols, 2 rows, N/8 col groups), 1, 1): rows
// t/4 and t/4 + 8 of its warp's 16, columns 2(t%4) + {0,1} + 8g.  As (rows, cols):
template <typename Layout>
__device__ __forceinline__ auto gmma_acc_rowcol_layout(Layout acc) {
  static_assert(decltype(cute::rank<0>(acc))::value == 3);
  return cute::make_layout(cute::make_layout(cute::get<0, 1>(acc), cute::get<1>(acc)),
                           cute::make_layout(cute::get<0, 0>(acc), cute::get<0, 2>(acc), cute::get<2>(acc)));
}

// The accumulator's values in the order of the rs wgmma's A fragment (64 x 16 per k-step: the
// same (2 cols, 2 rows, 2 col groups) pattern), ((2, 2, 2), 1, N / 16).
template <typename Layout>
__device__ __forceinline__ auto gmma_acc_as_operand_a_layout(Layout acc) {
  static_assert(decltype(cute::rank<0>(acc))::value == 3);
  auto groups = cute::logical_divide(cute::get<0, 2>(acc), cute::Tile<cute::_2>{});  // ((2, N/16))
  return cute::make_layout(
      cute::make_layout(cute::get<0, 0>(acc), cute::get<0, 1>(acc), cute::get<0, 0>(groups)), cute::get<1>(acc),
      cute::coalesce(cute::make_layout(cute::get<0, 1>(groups), cute::get<2>(acc))));
}

template <int kRows>
struct SplitOnlineSoftmax {
  float row_max[kRows];  // max raw score so far (-inf before any visible key)
  float row_sum[kRows];  // this thread's share of the row sum; reduced over the quad in finalize
  float scale_log2;

  __device__ __forceinline__ void init(float scale_log2_) {
    scale_log2 = scale_log2_;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.f;
    }
  }

  // Overwrites scores (rows, cols) with P; writes the O correction of each row.  Returns whether
  // any row of the warp changed its max (else every correction is exactly 1 and O is left alone).
  template <typename TensorS>
  __device__ __forceinline__ bool score_step(TensorS& scores, float (&correction)[kRows]) {
    static_assert(decltype(cute::size<0>(scores))::value == kRows);
    float offset[kRows];
    bool unchanged = true;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float tile_max = row_max[r];
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(scores); ++c) tile_max = fmaxf(tile_max, scores(r, c));
      const float new_max = quad_allreduce(tile_max, MaxOp{});
      offset[r] = new_max == -INFINITY ? 0.f : new_max * scale_log2;
      const bool same = new_max == row_max[r];
      correction[r] = same ? 1.f : fast_exp2(row_max[r] * scale_log2 - offset[r]);
      unchanged &= same;
      row_max[r] = new_max;
    }
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float sum = 0.f;
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(scores); ++c) {
        scores(r, c) = fast_exp2(scores(r, c) * scale_log2 - offset[r]);
        sum += scores(r, c);
      }
      row_sum[r] = row_sum[r] * correction[r] + sum;
    }
    return !__all_sync(0xffffffffu, unchanged);
  }

  template <typename TensorO>
  __device__ __forceinline__ void rescale_o(TensorO& acc_o, const float (&correction)[kRows]) const {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(acc_o); ++c) acc_o(r, c) *= correction[r];
    }
  }

  // O <- O * output_scale / rowsum and the natural-log LSE.  output_scale is 1/(1 - p) with
  // dropout (the row sums count the dropped probabilities: they normalize the undropped softmax),
  // else 1.
  template <typename TensorO>
  __device__ __forceinline__ void finalize(TensorO& acc_o, float output_scale, float (&lse)[kRows]) {
    constexpr float kLn2 = 0.6931471805599453f;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const float sum = quad_allreduce(row_sum[r], SumOp{});
      const bool empty = sum == 0.f;  // a NaN sum (a NaN score: max drops it) is not empty: O, LSE NaN
      const float inv = empty ? 0.f : output_scale / sum;
      lse[r] = empty ? INFINITY : row_max[r] * scale_log2 * kLn2 + logf(sum);
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(acc_o); ++c) acc_o(r, c) *= inv;
    }
  }
};

}  // namespace tileattn::cuda::sm90
