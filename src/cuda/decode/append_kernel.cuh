// The append kernel: k_new/v_new written into the cache at cache_seqlens[b] + i (through the block
// table when paged), k rotated first; and the rotary rule, which the split kernel applies to q.
#pragma once

#include "cuda/decode/decode_args.h"
#include "cuda/decode/elements.cuh"

namespace tileattn::cuda::decode {

// Element d of row x (head_dim elements) after rotary at the angle row `position`:
//   interleaved pairs (2j, 2j+1), or halves (j, j + rotary_dim / 2), each rotated by angle j:
//   x'[a] = x[a] cos - x[b] sin,   x'[b] = x[a] sin + x[b] cos.
// Dims past rotary_dim pass through.  Float32 math, as the CPU backend does.
// The dims (a, b) that angle j rotates, and the angle index of dim d < rotary_dim.
__device__ __forceinline__ int2 rotary_pair(const tileattn_kvcache_params& p, int j) {
  return p.rotary_interleaved ? make_int2(2 * j, 2 * j + 1) : make_int2(j, j + p.rotary_dim / 2);
}
__device__ __forceinline__ int rotary_angle(const tileattn_kvcache_params& p, int d) {
  const int half = p.rotary_dim / 2;
  return p.rotary_interleaved ? d / 2 : d < half ? d : d - half;
}

template <typename T>
__device__ __forceinline__ float2 rotary_cos_sin(const tileattn_kvcache_params& p, int64_t position, int j) {
  const int64_t at = position * (p.rotary_dim / 2) + j;
  return make_float2(to_float(static_cast<const T*>(p.rotary_cos)[at]),
                     to_float(static_cast<const T*>(p.rotary_sin)[at]));
}

template <typename T>
__device__ __forceinline__ float rotated_element(const tileattn_kvcache_params& p, const T* x, int d,
                                                 int64_t position) {
  if (p.rotary_cos == nullptr || d >= p.rotary_dim) return to_float(x[d]);
  const int j = rotary_angle(p, d);
  const int2 pair = rotary_pair(p, j);
  const float2 cs = rotary_cos_sin<T>(p, position, j);
  const float xa = to_float(x[pair.x]), xb = to_float(x[pair.y]);
  return d == pair.x ? xa * cs.x - xb * cs.y : xa * cs.y + xb * cs.x;
}

// Grid (seqlen_new, batch); the threads of a CTA cover Hk x head_dim elements of one new token.
// A sequence whose index arrays are out of range (SequenceKeys::ok false) or whose page index is
// out of range is skipped: the split kernel writes NaN for it.
template <typename T>
__global__ void __launch_bounds__(kThreads) append_kernel(const DecodeArgs args) {
  const tileattn_kvcache_params& p = args.p;
  const tileattn_fwd_params& f = p.fwd;
  const int i = blockIdx.x, b = blockIdx.y;
  const SequenceKeys seq = sequence_keys(p, b);
  if (!seq.ok) return;
  const int64_t pos = static_cast<int64_t>(seq.seqlen) + i;
  const int64_t k_row = cache_offset(p, seq, pos, f.k_batch_stride, f.k_row_stride);
  const int64_t v_row = cache_offset(p, seq, pos, f.v_batch_stride, f.v_row_stride);
  if (k_row < 0 || v_row < 0) return;
  const T* k_new = static_cast<const T*>(p.k_new) + b * p.k_new_batch_stride + i * p.k_new_row_stride;
  const T* v_new = static_cast<const T*>(p.v_new) + b * p.v_new_batch_stride + i * p.v_new_row_stride;
  T* k_cache = static_cast<T*>(const_cast<void*>(f.k)) + k_row;
  T* v_cache = static_cast<T*>(const_cast<void*>(f.v)) + v_row;
  for (int e = threadIdx.x; e < f.num_heads_k * f.head_dim; e += blockDim.x) {
    const int h = e / f.head_dim, d = e % f.head_dim;
    k_cache[h * f.k_head_stride + d] = from_float<T>(rotated_element(p, k_new + h * p.k_new_head_stride, d, pos));
    v_cache[h * f.v_head_stride + d] = v_new[h * p.v_new_head_stride + d];
  }
}

}  // namespace tileattn::cuda::decode
