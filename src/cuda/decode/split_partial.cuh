// A split's partial result and the merge of several, as both merges compute them: the combine
// kernel (from the float32 partials in global memory) and the cluster merge (from the split CTAs'
// shared memory).  One set of expressions, so the two give the same bits and the split heuristic
// may choose either per call (tests/python/test_kvcache.py checks the bits).
#pragma once

#include <math_constants.h>

#include "cuda/decode/decode_shape.h"
#include "cuda/decode/softmax_step.cuh"

namespace tileattn::cuda::decode {

// Split s's normalized partial output for one element: o_sum is the warp merge's O (o[0] + o[1]),
// scale its row's 1 / l (0 when the split saw no key).  NaN for an invalid sequence.
__device__ __forceinline__ float split_partial_o(bool seq_ok, float scale, float o_sum) {
  return !seq_ok ? CUDART_NAN_F : scale == 0.0f ? 0.0f : o_sum * scale;
}

// Split s's LSE (natural log) from its row max (base 2) and row sum: -inf for a split that saw no
// key (weight 0 in the merge), NaN for an invalid sequence or NaN scores.
__device__ __forceinline__ float split_partial_lse(bool seq_ok, float row_max, float row_sum) {
  return !seq_ok ? CUDART_NAN_F : row_sum == 0.0f ? -CUDART_INF_F : (row_max + log2f(row_sum)) * kLn2;
}

// lse = lse_max + log sum_s exp(lse_s - lse_max) over the splits; `poisoned` when any lse_s is NaN
// (the row comes out NaN), `empty` when no split saw a key (out 0, lse +inf).
struct MergedLse {
  float lse;
  bool empty, poisoned;

  __device__ __forceinline__ float weight(float split_lse) const {
    return empty || poisoned ? 0.0f : expf(split_lse - lse);
  }
  __device__ __forceinline__ float output_lse() const { return poisoned ? CUDART_NAN_F : empty ? CUDART_INF_F : lse; }
};

__device__ __forceinline__ MergedLse merged_lse(float lse_max, float exp_sum, bool poisoned) {
  return {lse_max + logf(exp_sum), lse_max == -CUDART_INF_F, poisoned};
}

// The exponential of one split's LSE against the max, the summand of the merge.
__device__ __forceinline__ float lse_exp(float split_lse, float lse_max) {
  return lse_max == -CUDART_INF_F ? 0.0f : expf(split_lse - lse_max);
}

// The merge of up to kMaxClusterSplits LSEs (-inf past the last split), its sum added in the order
// the combine kernel's block_reduce adds them: a butterfly over lanes with offsets 16, 8, 4, 2, 1,
// where only lanes 0-7 hold nonzero values, leaves ((e0 + e4) + (e2 + e6)) + ((e1 + e5) + (e3 + e7))
// in lane 0, and the other warps add exact zeros.  fmaxf drops NaN, as the combine's max does.
static_assert(kMaxClusterSplits == 8, "the sum below spells out the butterfly's order for 8 lanes");
__device__ __forceinline__ MergedLse merge_split_lses(const float (&split_lse)[kMaxClusterSplits]) {
  float lse_max = -CUDART_INF_F;
  bool poisoned = false;
#pragma unroll
  for (int s = 0; s < kMaxClusterSplits; ++s) {
    lse_max = fmaxf(lse_max, split_lse[s]);
    poisoned = poisoned || isnan(split_lse[s]);
  }
  float e[kMaxClusterSplits];
#pragma unroll
  for (int s = 0; s < kMaxClusterSplits; ++s) e[s] = lse_exp(split_lse[s], lse_max);
  const float exp_sum = ((e[0] + e[4]) + (e[2] + e[6])) + ((e[1] + e[5]) + (e[3] + e[7]));
  return merged_lse(lse_max, exp_sum, poisoned);
}

}  // namespace tileattn::cuda::decode
