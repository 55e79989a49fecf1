// The online-softmax state of one thread's query rows (FA2, Algorithm 1 lines 8-12), kept in
// registers.  Scores arrive in "raw" units: the weight of a score s is exp2(s * scale_log2), so
// the softmax scale and log2(e) fold into one FFMA before each ex2 (FA2 change 3).
//
// The -inf rule: a row that has seen no visible key keeps row_max = -inf, uses 0 as its exponent
// offset (so exp2(-inf - 0) = 0 and never -inf - -inf = NaN), ends with row_sum = 0, and is
// finalized to O = 0 and LSE = +inf.
#pragma once

#include <cute/tensor.hpp>

#include "cuda/cute_utils.h"

namespace tileattn::cuda {

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// log2 on the MUFU (one instruction, absolute error ~2^-22 near 1): logf is a ~20-instruction
// dependent polynomial with range branches.
__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The end of both families' online softmax: O <- O * output_scale / rowsum and the natural-log
// LSE, for rows whose exps were taken against offset[r] (log2 units) and whose per-thread sums
// row_sum[r] are reduced over the quad here.  output_scale is 1/(1 - dropout_p) with dropout (the
// sums count the dropped probabilities: they normalize the undropped softmax), else 1.
//
// The callers guarantee that a row with a visible key has sum >= 1 (up to rounding), so the MUFU's
// reciprocal and log2 are exact to a few ulp: no IEEE division's slow-path branch nor logf's ~20
// dependent instructions, and every row's statistics come before the O scaling, so the rows'
// chains interleave.  The d128 sm90 trace had put the two serialized IEEE chains at 675-725
// cycles of each tile boundary (session 26).  Measured: sm90 causal 512-1k +1-3% (session 32),
// sm80 causal d64 512 +5%, causal d128 512 +2% (session 33), longer calls level (perf log).
template <int kRows, typename TensorO>
__device__ __forceinline__ void finalize_rows(TensorO& acc_o, const float (&row_sum)[kRows],
                                              const float (&offset)[kRows], float output_scale,
                                              float (&lse)[kRows]) {
  constexpr float kLn2 = 0.6931471805599453f;
  float inv[kRows];
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    const float sum = quad_allreduce(row_sum[r], SumOp{});
    const bool empty = sum == 0.f;  // a NaN sum (a NaN score: max drops it) is not empty: O, LSE NaN
    inv[r] = empty ? 0.f : __fdividef(output_scale, sum);
    lse[r] = empty ? INFINITY : (offset[r] + fast_log2(sum)) * kLn2;
  }
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    CUTE_UNROLL
    for (int c = 0; c < cute::size<1>(acc_o); ++c) acc_o(r, c) *= inv[r];
  }
}

template <int kRows>
struct OnlineSoftmax {
  float row_max[kRows];  // max raw score seen so far (-inf before any visible key)
  float row_sum[kRows];  // this thread's share of sum exp2((s - row_max) * scale_log2); the quad
                         // reduction is deferred to finalize(), since the sum is only read there
  float scale_log2;

  __device__ __forceinline__ void init(float scale_log2_) {
    scale_log2 = scale_log2_;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.f;
    }
  }

  // Takes one tile of scores (rows, cols) and overwrites it with the unnormalized probabilities
  //   P = exp2((S - m_new) * scale_log2),  m_new = max(m_old, rowmax(S)),
  // rescaling the running sum and the O accumulator by exp2((m_old - m_new) * scale_log2).
  // O stays unnormalized until finalize() (FA2 change 1: one division per row at the very end).
  // The first tile needs no special case: m_old = -inf gives a correction of exp2(-inf) = 0
  // applied to a zero O and a zero sum.
  // When no row of the warp changed its max (the common case after the first few key blocks),
  // the O rescale is skipped, saving one multiply per O accumulator.  FlashAttention-4 skips
  // below a threshold; we skip only when the max is unchanged, where the exact factor is 1.
  template <typename TensorS, typename TensorO>
  __device__ __forceinline__ void update(TensorS& scores, TensorO& acc_o) {
    static_assert(decltype(cute::size<0>(scores))::value == kRows);
    float offset[kRows];
    float correction[kRows];
    bool unchanged = true;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float tile_max = row_max[r];
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(scores); ++c) tile_max = fmaxf(tile_max, scores(r, c));
      // Row statistics live in the 4 threads of a quad: shuffles, never shared memory (FA2 change 2).
      const float new_max = quad_allreduce(tile_max, MaxOp{});
      offset[r] = new_max == -INFINITY ? 0.f : new_max * scale_log2;
      // Compare the maxima, not the correction: exp2 of the FFMA's rounding residue is not 1.
      const bool same = new_max == row_max[r];
      correction[r] = same ? 1.f : fast_exp2(row_max[r] * scale_log2 - offset[r]);
      unchanged &= same;
      row_sum[r] *= correction[r];
      row_max[r] = new_max;
    }
    if (!__all_sync(0xffffffffu, unchanged)) {
      CUTE_UNROLL
      for (int r = 0; r < kRows; ++r) {
        CUTE_UNROLL
        for (int c = 0; c < cute::size<1>(acc_o); ++c) acc_o(r, c) *= correction[r];
      }
    }
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float sum = 0.f;
      CUTE_UNROLL
      for (int c = 0; c < cute::size<1>(scores); ++c) {
        scores(r, c) = fast_exp2(scores(r, c) * scale_log2 - offset[r]);
        sum += scores(r, c);
      }
      row_sum[r] += sum;
    }
  }

  // O <- O * output_scale / rowsum, and the natural-log LSE of the (undropped) scores
  // (finalize_rows).  A row that saw a visible key has sum >= 1 up to rounding: its max's P is exp2
  // of the FFMA's rounding residue, 1 to ~2^-20.
  template <typename TensorO>
  __device__ __forceinline__ void finalize(TensorO& acc_o, float output_scale, float (&lse)[kRows]) const {
    float offset[kRows];
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) offset[r] = row_max[r] * scale_log2;
    finalize_rows(acc_o, row_sum, offset, output_scale, lse);
  }
};

}  // namespace tileattn::cuda
