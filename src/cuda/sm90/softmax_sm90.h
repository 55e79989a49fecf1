// Online softmax for the sm90 consumers, split in two so that it can overlap the PV wgmma of the
// previous key block (FlashAttention-3, section 3.2):
//   score_step():     m_new = max(m_old, rowmax(S)),  P = exp2(S * scale_log2 - m_new * scale_log2),
//                     l = l * exp2((m_old - m_new) * scale_log2) + rowsum(P)    -- touches no O
//   reference_step(): P = exp2(S * scale_log2 - m_ref * scale_log2),  l += rowsum(P), with the
//                     reference m_ref moved (and l, O rescaled) only when a P reaches 2^8
//   rescale_o():      O = O * correction                                        -- after PV(j-1) landed
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
  // Row r's exps are taken against row_offset[r] (log2 units: scale_log2 times a raw score), so
  // P = exp2(S * scale_log2 - row_offset) and O and row_sum are sums of such P.  The exact step
  // sets it to the running max; the reference step leaves it where it is while no P of a block
  // reaches kReferenceHeadroom.  -inf before the row's first visible key.
  float row_offset[kRows];
  float row_sum[kRows];  // this thread's share of the row sum; reduced over the quad in finalize
  float scale_log2;
  // Every row of the warp has a finite row_offset (warp-uniform).  Derivable from row_offset, but
  // kept so that the loop's reference step needs no vote for it: the exact step, which alone can
  // change it, sets it.
  bool has_reference;

  // A P at or above this in the reference step moves the row's reference up (below).  2^8 keeps
  // fp16 P (65504 at most) and the float32 sums far from overflow, and random scores never get
  // there: the reference set by a row's first block is within a few units of the running max.
  static constexpr float kReferenceHeadroom = 256.f;

  __device__ __forceinline__ void init(float scale_log2_) {
    scale_log2 = scale_log2_;
    has_reference = false;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      row_offset[r] = -INFINITY;
      row_sum[r] = 0.f;
    }
  }

  // The exact step (FA2, Algorithm 1 lines 8-10): the reference moves to the running max.
  // Overwrites scores (rows, cols) with P; writes the O correction of each row.  Returns whether
  // any row of the warp changed its reference (else every correction is exactly 1 and O is left
  // alone).
  template <typename TensorS>
  __device__ __forceinline__ bool score_step(TensorS& scores, float (&correction)[kRows]) {
    static_assert(decltype(cute::size<0>(scores))::value == kRows);
    float exp_offset[kRows];
    bool unchanged = true, finite = true;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float tile_max = -INFINITY;
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(scores); ++c) tile_max = fmaxf(tile_max, scores(r, c));
      const float new_offset = fmaxf(row_offset[r], quad_allreduce(tile_max, MaxOp{}) * scale_log2);
      exp_offset[r] = new_offset == -INFINITY ? 0.f : new_offset;
      const bool same = new_offset == row_offset[r];
      correction[r] = same ? 1.f : fast_exp2(row_offset[r] - exp_offset[r]);
      unchanged &= same;
      finite &= new_offset != -INFINITY;
      row_offset[r] = new_offset;
    }
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float sum = 0.f;
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(scores); ++c) {
        scores(r, c) = fast_exp2(scores(r, c) * scale_log2 - exp_offset[r]);
        sum += scores(r, c);
      }
      row_sum[r] = row_sum[r] * correction[r] + sum;
    }
    has_reference = __all_sync(0xffffffffu, finite);
    return !__all_sync(0xffffffffu, unchanged);
  }

  // One key block's step, as score_step() but without a row max on the way to the exps when the
  // warp has a reference (FlashDecoding++'s unified max, checked):
  //   P = exp2(S * scale_log2 - row_offset),  l += rowsum(P)
  // Any reference gives the same O and LSE, since both are taken against it; it only has to keep
  // every P finite and far from overflow, which the row sums check for free (a sum under the
  // headroom bounds each of its P).  The max's 64 FMNMX, its quad shuffles, the correction's exp2
  // and the O rescale leave the loop; they come back only for a block whose P reached the headroom:
  //   - P finite: the reference moves up by the whole power of two 2^e <= max P, and P, l and
  //     O (through `correction`) are multiplied by 2^-e, exactly;
  //   - some P = +inf (a score at least 128 / scale_log2 above the reference: S is lost):
  //     `rescore()` writes the block's scores again and the exact step runs.
  // Returns whether O must be multiplied by `correction`.
  template <typename TensorS, typename Rescore>
  __device__ __forceinline__ bool reference_step(TensorS& scores, float (&correction)[kRows], Rescore&& rescore) {
    if (has_reference) {
      float sum[kRows];
      bool below_headroom = true;
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        sum[r] = 0.f;
        CUTE_UNROLL
        for (int c = 0; c < cute::size<1>(scores); ++c) {
          scores(r, c) = fast_exp2(scores(r, c) * scale_log2 - row_offset[r]);
          sum[r] += scores(r, c);
        }
        below_headroom &= sum[r] < kReferenceHeadroom;  // false for a NaN sum: NaN stays NaN below
      }
      if (__all_sync(0xffffffffu, below_headroom)) {
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) row_sum[r] += sum[r];
        return false;
      }
      float p_max[kRows];
      bool overflow = false;
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        float m = 0.f;
        CUTE_UNROLL
        for (int c = 0; c < cute::size<1>(scores); ++c) m = fmaxf(m, scores(r, c));
        p_max[r] = quad_allreduce(m, MaxOp{});
        overflow |= p_max[r] == INFINITY;
      }
      if (!__any_sync(0xffffffffu, overflow)) {
        bool unchanged = true;
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) {
          // max P in [2^e, 2^(e + 1)): e from its exponent bits, 0 below 2.
          // (2^-127 is subnormal: e stops at 126, leaving P < 4.)
          const int e = p_max[r] >= 2.f ? min((__float_as_int(p_max[r]) >> 23) - 127, 126) : 0;
          const float down = __int_as_float((127 - e) << 23);  // 2^-e
          correction[r] = down;
          unchanged &= e == 0;
          row_offset[r] += float(e);
          // Summed again after the scaling: P near 2^127 can overflow the first sum.
          float scaled_sum = 0.f;
          CUTE_UNROLL
          for (int c = 0; c < cute::size<1>(scores); ++c) {
            scores(r, c) *= down;
            scaled_sum += scores(r, c);
          }
          row_sum[r] = row_sum[r] * down + scaled_sum;
        }
        return !__all_sync(0xffffffffu, unchanged);
      }
      rescore();
    }
    return score_step(scores, correction);
  }

  template <typename TensorO>
  __device__ __forceinline__ void rescale_o(TensorO& acc_o, const float (&correction)[kRows]) const {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(acc_o); ++c) acc_o(r, c) *= correction[r];
    }
  }

  // O <- O * output_scale / rowsum and the natural-log LSE (finalize_rows, softmax_state.h).  A row
  // that saw a visible key has sum >= 1: the exact step sets the reference at the row max (that
  // score's P is 1) and the reference step moves it only to the largest P's power of two (that P
  // stays >= 1).
  template <typename TensorO>
  __device__ __forceinline__ void finalize(TensorO& acc_o, float output_scale, float (&lse)[kRows]) const {
    finalize_rows(acc_o, row_sum, row_offset, output_scale, lse);
  }
};

}  // namespace tileattn::cuda::sm90
