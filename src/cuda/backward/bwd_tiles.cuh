// The pieces of the CUDA backward that are not matrix products: moving tiles between global and
// shared memory, and turning S and dP into P and dS element by element.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/mask.h"
#include "common/philox.h"
#include "common/sequence.h"
#include "tileattn/tileattn.h"

namespace tileattn::cuda::bwd {

template <typename Element>
__device__ __forceinline__ float to_float(Element x);
template <>
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename Element>
__device__ __forceinline__ Element from_float(float x);
template <>
__device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }

// rows x kDim tile <- `valid_rows` rows of `head_dim` elements at `src` (row pitch in elements);
// the rest is zero so padded rows and columns add nothing to any product.  With `vectorized`
// (the caller checked: 16-byte aligned base and strides, head_dim % 8 == 0) each thread moves
// 16 bytes per load instead of 2: an eighth of the load instructions.
template <int kRows, int kDim, int kPitch, int kThreads, typename Element>
__device__ void load_tile(Element* tile, const Element* src, int64_t row_stride, int valid_rows,
                          int head_dim, bool vectorized) {
  if (vectorized) {
    constexpr int kVector = 16 / sizeof(Element);
    constexpr int kVectorsPerRow = kDim / kVector;
    static_assert(kPitch % kVector == 0, "16-byte stores need 16-byte aligned smem rows");
    for (int i = threadIdx.x; i < kRows * kVectorsPerRow; i += kThreads) {
      const int r = i / kVectorsPerRow, c = i % kVectorsPerRow * kVector;
      uint4 value = make_uint4(0, 0, 0, 0);
      if (r < valid_rows && c < head_dim) value = *reinterpret_cast<const uint4*>(src + r * row_stride + c);
      *reinterpret_cast<uint4*>(tile + r * kPitch + c) = value;
    }
    return;
  }
  for (int i = threadIdx.x; i < kRows * kDim; i += kThreads) {
    const int r = i / kDim, c = i % kDim;
    tile[r * kPitch + c] =
        r < valid_rows && c < head_dim ? src[r * row_stride + c] : from_float<Element>(0.0f);
  }
}

// Keys stored for sequence b (seqused_k may use fewer; the rest get zero gradients).
__device__ inline int stored_keys(const tileattn_fwd_params& f, int b) {
  return f.cu_seqlens_k ? f.cu_seqlens_k[b + 1] - f.cu_seqlens_k[b] : f.seqlen_k;
}

// What turns raw products into probabilities and score gradients for one (sequence, head).
struct ScoreRule {
  float scale;            // softmax_scale
  float softcap;          // 0 = off
  float alibi_slope;      // 0 = off
  int seqlen_q, seqlen_k, window_left, window_right;
  bool dropout;
  uint32_t dropout_threshold;
  float keep_scale;       // 1 / (1 - p)
  uint64_t seed, offset;
  int batch_index, head, num_heads;
};

__device__ inline ScoreRule make_rule(const tileattn_fwd_params& p, const SequenceView& s, int b, int h) {
  ScoreRule r;
  r.scale = p.softmax_scale;
  r.softcap = p.softcap;
  r.alibi_slope = p.alibi_slopes ? p.alibi_slopes[b * p.alibi_batch_stride + h] : 0.0f;
  r.seqlen_q = s.seqlen_q;
  r.seqlen_k = s.seqlen_k;
  r.window_left = p.window_left;
  r.window_right = p.window_right;
  r.dropout = p.dropout_p > 0.0f;
  r.dropout_threshold = dropout_threshold(p.dropout_p);
  r.keep_scale = 1.0f / (1.0f - p.dropout_p);
  r.seed = p.philox_seed;
  r.offset = p.philox_offset;
  r.batch_index = b;
  r.head = h;
  r.num_heads = p.num_heads;
  return r;
}

// Whether query rows [row0, row0 + rows) and keys [col0, col0 + cols) share any visible pair.
__device__ inline bool tiles_meet(const ScoreRule& r, int row0, int rows, int col0, int cols) {
  const long long shift = static_cast<long long>(r.seqlen_k) - r.seqlen_q;
  if (r.window_right >= 0 && row0 + rows - 1 + shift + r.window_right < col0) return false;
  if (r.window_left >= 0 && row0 + shift - r.window_left > col0 + cols - 1) return false;
  return row0 < r.seqlen_q && col0 < r.seqlen_k;
}

constexpr float kLog2e = 1.4426950408889634f;

// For each (r, c) of the step:
//   s = scale q.k, softcapped, minus the ALiBi bias;  P = exp(s - LSE)
//   dP~ = Z dP / (1 - p)  (Z the dropout mask);  dS = P (dP~ - D) tanh'
// and writes the dropped P (Z P / (1 - p), for dV) and dS as 16-bit tiles for the next products.
// `products` holds q.k, `dprobs` holds dO.v; lse_log2 and delta are per row of the step.
template <int kRows, int kCols, int kScorePitch, int kProbPitch, int kThreads, typename Element>
__device__ void probabilities_and_gradients(const ScoreRule& r, int row0, int col0,
                                            const float* products, const float* dprobs,
                                            const float* lse_log2, const float* delta,
                                            Element* dropped_probs, Element* dscores) {
  for (int i = threadIdx.x; i < kRows * kCols; i += kThreads) {
    const int tr = i / kCols, tc = i % kCols;
    const int row = row0 + tr, col = col0 + tc;
    float dropped = 0.0f, ds = 0.0f;
    const ColumnRange visible = visible_columns(row, r.seqlen_q, r.seqlen_k, r.window_left, r.window_right);
    if (row < r.seqlen_q && col < r.seqlen_k && col >= visible.first && col <= visible.last) {
      float s = products[tr * kScorePitch + tc] * r.scale;
      float dtanh = 1.0f;
      if (r.softcap > 0.0f) {
        const float th = tanhf(s / r.softcap);
        dtanh = 1.0f - th * th;
        s = r.softcap * th;
      }
      s -= r.alibi_slope * alibi_distance(row, col, r.seqlen_q, r.seqlen_k);
      const float p = exp2f(s * kLog2e - lse_log2[tr]);  // 0 when the row's LSE is +inf
      float z = 1.0f;
      if (r.dropout) {
        z = dropout_keep(r.seed, r.offset, r.batch_index, r.head, r.num_heads, row, col,
                         r.dropout_threshold) ? r.keep_scale : 0.0f;
      }
      dropped = p * z;
      ds = p * (dprobs[tr * kScorePitch + tc] * z - delta[tr]) * dtanh;
    }
    dropped_probs[tr * kProbPitch + tc] = from_float<Element>(dropped);
    dscores[tr * kProbPitch + tc] = from_float<Element>(ds);
  }
}

// Per-row LSE (in log2 units; +inf for rows past the sequence, so their P is 0) and D.
template <int kRows, int kThreads>
__device__ void load_row_stats(const tileattn_fwd_params& p, const SequenceView& s, int h, int row0,
                               const float* delta_buffer, int64_t q_rows, float* lse_log2, float* delta) {
  for (int r = threadIdx.x; r < kRows; r += kThreads) {
    const int row = row0 + r;
    const bool valid = row < s.seqlen_q;
    lse_log2[r] = valid ? p.softmax_lse[lse_offset(p, s, row, h)] * kLog2e : __int_as_float(0x7f800000);
    delta[r] = valid ? delta_buffer[h * q_rows + packed_q_row(p, s, row)] : 0.0f;
  }
}

}  // namespace tileattn::cuda::bwd
