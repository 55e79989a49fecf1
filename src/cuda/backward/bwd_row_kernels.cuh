// The two streaming kernels around the main backward kernel, one pass over rows each:
//   bwd_delta       D_i = rowsum(dO_i o O_i), and the row's float32 dQ accumulator set to zero
//                   (no separate memset: one pass over the workspace fewer)
//   bwd_finish_dq   dQ_i = softmax_scale * dQaccum_i, converted to the input type
// Pure bandwidth: at 16k tokens x 2048 hidden they move 134 MB (O, dO) and 134 + 67 MB (dQaccum,
// dQ).  A row is handled by L lanes of a warp (L = 8, 16 or 32, the fewest whose 8-element
// vectors cover head_dim: 16 at d = 128, so a warp takes two rows), each lane moving 16 bytes of
// each operand per step.  Measured on the H200 there: 64.6 us for the delta pass with the zeroing
// (268 MB, 4.15 TB/s) and 50 us for the finish (4.0 TB/s), where the first version (one warp per
// row, one element per lane, plus a memset) took 58 + 30 and 90 us.  Unaligned rows (the
// fallback path's inputs) take the same shape element by element.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/sequence.h"
#include "cuda/backward/bwd_args.h"
#include "cuda/backward/bwd_tiles.cuh"

namespace tileattn::cuda::bwd {

constexpr int kRowKernelThreads = 256;

// Lanes per row for a head dim (host and device).
__host__ __device__ constexpr int row_lanes(int head_dim) { return head_dim <= 64 ? 8 : head_dim <= 128 ? 16 : 32; }
__host__ __device__ constexpr int rows_per_row_block(int head_dim) {
  return kRowKernelThreads / row_lanes(head_dim);
}

// 8 elements <-> floats through one 16-byte vector.
template <typename Element>
__device__ __forceinline__ void unpack8(const uint4& v, float (&x)[8]) {
  const Element* e = reinterpret_cast<const Element*>(&v);
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = to_float(e[i]);
}

template <typename Element>
__device__ __forceinline__ uint4 pack8(const float (&x)[8]) {
  uint4 v;
  Element* e = reinterpret_cast<Element*>(&v);
#pragma unroll
  for (int i = 0; i < 8; ++i) e[i] = from_float<Element>(x[i]);
  return v;
}

template <typename Element>
__global__ void __launch_bounds__(kRowKernelThreads) bwd_delta_kernel(BwdArgs a) {
  const tileattn_fwd_params& f = a.p.fwd;
  const int lanes = row_lanes(f.head_dim), lane = threadIdx.x % lanes;
  const int b = blockIdx.y, h = blockIdx.z;
  if (!sequence_in_bounds(f, b)) return;  // bad cu_seqlens / seqused_k: index_poison.h
  const SequenceView s = sequence_view(f, b);
  const int row = blockIdx.x * rows_per_row_block(f.head_dim) + threadIdx.x / lanes;
  const bool valid = row < s.seqlen_q;
  float sum = 0.0f;
  if (valid) {
    const Element* out = static_cast<const Element*>(f.out) +
                         q_offset(s, f.out_batch_stride, f.out_row_stride, f.out_head_stride, row, h);
    const Element* dout = static_cast<const Element*>(a.p.dout) +
                          q_offset(s, a.p.dout_batch_stride, a.p.dout_row_stride, a.p.dout_head_stride, row, h);
    if (a.vector_out && a.vector_dout) {
      for (int d = 8 * lane; d < f.head_dim; d += 8 * lanes) {
        float o[8], g[8];
        unpack8<Element>(__ldg(reinterpret_cast<const uint4*>(out + d)), o);
        unpack8<Element>(__ldg(reinterpret_cast<const uint4*>(dout + d)), g);
#pragma unroll
        for (int i = 0; i < 8; ++i) sum += o[i] * g[i];
      }
    } else {
      for (int d = lane; d < f.head_dim; d += lanes) sum += to_float(out[d]) * to_float(dout[d]);
    }
  }
  // Every lane takes part in the shuffles (rows past the sequence too): xor offsets below `lanes`
  // stay inside the row's lanes.
  for (int offset = lanes / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (!valid) return;
  const int64_t packed = h * a.q_rows + packed_q_row(f, s, row);
  if (lane == 0) a.delta[packed] = sum;
  if (a.dq_accum != nullptr) {
    float* accum = a.dq_accum + packed * a.dq_pitch;
    if (a.dq_pitch % 4 == 0) {  // cudaMalloc'd base, rows of whole float4s: aligned
      for (int d = 4 * lane; d < a.dq_pitch; d += 4 * lanes) *reinterpret_cast<float4*>(accum + d) = float4{};
    } else {
      for (int d = lane; d < a.dq_pitch; d += lanes) accum[d] = 0.0f;
    }
  }
}

template <typename Element>
__global__ void __launch_bounds__(kRowKernelThreads) bwd_finish_dq_kernel(BwdArgs a) {
  const tileattn_fwd_params& f = a.p.fwd;
  const int lanes = row_lanes(f.head_dim), lane = threadIdx.x % lanes;
  const int b = blockIdx.y, h = blockIdx.z;
  if (!sequence_in_bounds(f, b)) return;  // bad cu_seqlens / seqused_k: index_poison.h
  const SequenceView s = sequence_view(f, b);
  const int row = blockIdx.x * rows_per_row_block(f.head_dim) + threadIdx.x / lanes;
  if (row >= s.seqlen_q) return;
  const float* src = a.dq_accum + (h * a.q_rows + packed_q_row(f, s, row)) * a.dq_pitch;
  Element* dst = static_cast<Element*>(a.p.dq) +
                 q_offset(s, a.p.dq_batch_stride, a.p.dq_row_stride, a.p.dq_head_stride, row, h);
  const float scale = f.softmax_scale;
  if (a.vector_dq && a.dq_pitch % 4 == 0) {
    for (int d = 8 * lane; d < f.head_dim; d += 8 * lanes) {
      const float4 lo = __ldg(reinterpret_cast<const float4*>(src + d));
      const float4 hi = __ldg(reinterpret_cast<const float4*>(src + d + 4));
      const float x[8] = {lo.x * scale, lo.y * scale, lo.z * scale, lo.w * scale,
                          hi.x * scale, hi.y * scale, hi.z * scale, hi.w * scale};
      *reinterpret_cast<uint4*>(dst + d) = pack8<Element>(x);
    }
  } else {
    for (int d = lane; d < f.head_dim; d += lanes) dst[d] = from_float<Element>(src[d] * scale);
  }
}

}  // namespace tileattn::cuda::bwd
