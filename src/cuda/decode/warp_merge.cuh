// How the split kernel's four warps merge their partial softmax states (FA2's merge of row
// statistics): for each query row r, with the warps' (m_w, l_w, O_w) in shared memory,
//   M = max_w m_w,   L = sum_w 2^(m_w - M) l_w,   O = sum_w 2^(m_w - M) O_w,   out = O / L.
// Two merges use these helpers (split_kernel.cuh): one scales each warp's O in the warp and sums
// the halves in two barrier steps, the other (four slots) sums the warps' unscaled O where the
// outputs are written.  Both perform the same float operations in the same order, each one
// explicit (no contraction left to the compiler), so a call's bits do not depend on which merge
// its kernel took (the ring and the cluster merge depend on the batch; a fixed num_splits must
// give the same bits at every batch size).
#pragma once

#include <math_constants.h>

#include "cuda/decode/decode_shape.h"

namespace tileattn::cuda::decode {

struct MergedRow {
  float max, sum, scale;   // M, L, and 1 / L (0 for a row that saw no key)
  float weight[kWarps];    // each warp's 2^(m_w - M), 0 for a warp that saw no visible key
};

// M of row r, the warps' maxima taken in warp order.
template <typename Smem>
__device__ __forceinline__ float merged_max(const Smem& sm, int r) {
  float max = -CUDART_INF_F;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) max = fmaxf(max, sm.m[w][r]);
  return max;
}

// A warp's weight 2^(m_w - M) in a row, 0 where it saw no visible key (m_w = -inf).
__device__ __forceinline__ float warp_weight(float warp_max, float row_max) {
  return warp_max == -CUDART_INF_F ? 0.0f : exp2f(warp_max - row_max);
}

// Row r's statistics and the warps' weights, each exp2f once.
template <typename Smem>
__device__ __forceinline__ MergedRow merged_row(const Smem& sm, int r) {
  MergedRow row;
  row.max = merged_max(sm, r);
  row.sum = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    // A warp whose max is still -inf saw no visible key, and its l is 0 -- unless NaN scores
    // reached it (a NaN in q or k, a page that does not exist: fmaxf drops NaN, so the max stays
    // -inf while l is NaN).  Adding its l as it is keeps that NaN in the row sum, so the row
    // comes out NaN instead of passing for one that saw no key (0, or weight 0 in the combine).
    const float m = sm.m[w][r], l = sm.l[w][r];
    const bool none = m == -CUDART_INF_F;
    row.weight[w] = warp_weight(m, row.max);
    row.sum = __fadd_rn(row.sum, none ? l : __fmul_rn(row.weight[w], l));
  }
  row.scale = row.sum == 0.0f ? 0.0f : 1.0f / row.sum;
  return row;
}

// The halves' sums of the two-step merge: warps 2 and 3 store x_w = O_w 2^(m_w - M) (add false),
// then warps 0 and 1 add theirs (add true), so out is (O_0 + O_2) + (O_1 + O_3).
__device__ __forceinline__ void merge_into_half(float& slot, float o, float weight, bool add) {
  slot = add ? __fmaf_rn(o, weight, slot) : __fmul_rn(o, weight);
}

// The same sum from the four warps' unscaled O (slots[w][r][d]) and their weights in row r.
template <typename Slots>
__device__ __forceinline__ float four_slot_sum(const Slots& slots, int r, int d, const float (&weight)[kWarps]) {
  const float half0 = __fmaf_rn(slots[0][r][d], weight[0], __fmul_rn(slots[2][r][d], weight[2]));
  const float half1 = __fmaf_rn(slots[1][r][d], weight[1], __fmul_rn(slots[3][r][d], weight[3]));
  return __fadd_rn(half0, half1);
}

}  // namespace tileattn::cuda::decode
