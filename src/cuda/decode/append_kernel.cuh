// The append kernel: k_new/v_new written into the cache at cache_seqlens[b] + i (through the block
// table when paged), k rotated first (append_token, which the split kernel's one-token path shares);
// and the rotary rule, which the split kernel applies to q.
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

// The index of angle j at row `position` in the (positions, rotary_dim / 2) cos and sin tables.
__device__ __forceinline__ int64_t rotary_at(const tileattn_kvcache_params& p, int64_t position, int j) {
  return position * (p.rotary_dim / 2) + j;
}

template <typename T>
__device__ __forceinline__ float2 rotary_cos_sin(const tileattn_kvcache_params& p, int64_t position, int j) {
  const int64_t at = rotary_at(p, position, j);
  return make_float2(to_float(static_cast<const T*>(p.rotary_cos)[at]),
                     to_float(static_cast<const T*>(p.rotary_sin)[at]));
}

// What element d of row x becomes, split into its loads (RotaryInputs, raw) and its math
// (rotated), so a thread can issue several elements' loads before it uses any.
template <typename T>
struct RotaryInputs {
  T xa, xb, c, s;    // x[a], x[b] and the angle's cos, sin; only xa for a dim rotary passes through
  bool rotated, first;  // first: d is a (x'[a]), else b (x'[b])
};

template <typename T>
__device__ __forceinline__ RotaryInputs<T> load_rotary_inputs(const tileattn_kvcache_params& p, const T* x, int d,
                                                              int64_t position) {
  RotaryInputs<T> in;
  in.rotated = p.rotary_cos != nullptr && d < p.rotary_dim;
  const int j = in.rotated ? rotary_angle(p, d) : 0;
  const int2 pair = in.rotated ? rotary_pair(p, j) : make_int2(d, d);
  in.first = d == pair.x;
  in.xa = x[pair.x];
  if (in.rotated) {
    const int64_t at = rotary_at(p, position, j);
    in.xb = x[pair.y];
    in.c = static_cast<const T*>(p.rotary_cos)[at];
    in.s = static_cast<const T*>(p.rotary_sin)[at];
  }
  return in;
}

template <typename T>
__device__ __forceinline__ float rotated(const RotaryInputs<T>& in) {
  if (!in.rotated) return to_float(in.xa);
  const float xa = to_float(in.xa), xb = to_float(in.xb), c = to_float(in.c), s = to_float(in.s);
  // Each product and the sum rounded on its own, never contracted into an FMA: with one new token
  // the split kernel rotates it twice, for the cache (append_token) and for its own attention
  // (stage_new_row, tma_block_loop.cuh), and the two must give the same bits.
  return in.first ? __fsub_rn(__fmul_rn(xa, c), __fmul_rn(xb, s)) : __fadd_rn(__fmul_rn(xa, s), __fmul_rn(xb, c));
}

// Row i of k_new (or v_new, with the v strides) of sequence b, KV head h.
template <typename T>
__device__ __forceinline__ const T* new_row(const void* x, int64_t batch_stride, int64_t row_stride,
                                            int64_t head_stride, int b, int i, int h) {
  return static_cast<const T*>(x) + b * batch_stride + i * row_stride + h * head_stride;
}

// New token i of sequence b (cache position seq.seqlen + i) into the cache, KV heads
// [head_begin, head_end), by `threads` threads of which this is `thread`: an append kernel CTA
// (every head) or, with the TMA split kernel, one CTA of each KV head (split_kernel.cuh).  A page
// index out of range skips the token: the split kernel writes NaN for the rows that see it.
// kBatch elements a thread a pass, every load of a pass issued before its first store: one memory
// round trip a pass.  One element at a time, each store waited for its loads, 8 round trips at
// 8 x d128 (~4.8 us of a 23-28 us call at 8 x 2k, session 29).  The split kernel's CTA writes one
// head (head_dim elements, 128 threads) and takes kBatch = 1: 8 slots held 10 more registers there.
template <typename T, int kBatch>
__device__ __forceinline__ void append_token(const tileattn_kvcache_params& p, const SequenceKeys& seq, int b, int i,
                                             int head_begin, int head_end, int thread, int threads) {
  const tileattn_fwd_params& f = p.fwd;
  const int64_t pos = static_cast<int64_t>(seq.seqlen) + i;
  const int64_t k_row = cache_offset(p, seq, pos, f.k_batch_stride, f.k_row_stride);
  const int64_t v_row = cache_offset(p, seq, pos, f.v_batch_stride, f.v_row_stride);
  if (k_row < 0 || v_row < 0) return;
  T* k_cache = static_cast<T*>(const_cast<void*>(f.k)) + k_row;
  T* v_cache = static_cast<T*>(const_cast<void*>(f.v)) + v_row;
  const int first = head_begin * f.head_dim, n = head_end * f.head_dim;
  for (int e0 = first + thread; e0 < n; e0 += kBatch * threads) {
    RotaryInputs<T> k[kBatch];
    T v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int e = e0 + u * threads, h = e / f.head_dim, d = e % f.head_dim;
      if (e < n) {
        k[u] = load_rotary_inputs(p, new_row<T>(p.k_new, p.k_new_batch_stride, p.k_new_row_stride,
                                                p.k_new_head_stride, b, i, h), d, pos);
        v[u] = new_row<T>(p.v_new, p.v_new_batch_stride, p.v_new_row_stride, p.v_new_head_stride, b, i, h)[d];
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int e = e0 + u * threads, h = e / f.head_dim, d = e % f.head_dim;
      if (e < n) {
        k_cache[h * f.k_head_stride + d] = from_float<T>(rotated(k[u]));
        v_cache[h * f.v_head_stride + d] = v[u];
      }
    }
  }
}

// Grid (seqlen_new, batch); the threads of a CTA cover Hk x head_dim elements of one new token.
// Serves the register loop and calls of more than one new token; the TMA split kernel appends one
// new token itself (split_kernel.cuh, "one new token").  A sequence whose index arrays are out of
// range (SequenceKeys::ok false) is skipped: the split kernel writes NaN for it.
template <typename T>
__global__ void __launch_bounds__(kThreads) append_kernel(const DecodeArgs args) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched programmatically (decode_launch.cuh), so its launch overlaps the tail of the kernel
  // ahead of it, which may have written anything it reads (cache_seqlens, k_new): it waits for that
  // kernel to finish first.  Then it lets the split kernel launch: every CTA triggers after its
  // wait, so the split kernel starts only once everything ahead of this kernel has finished, and it
  // reads the new positions only after its own griddepcontrol.wait (split_kernel.cuh, "after an
  // append").
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  const int i = blockIdx.x, b = blockIdx.y;
  const SequenceKeys seq = sequence_keys(args.p, b);
  if (seq.ok) append_token<T, 8>(args.p, seq, b, i, 0, args.p.fwd.num_heads_k, threadIdx.x, blockDim.x);
}

}  // namespace tileattn::cuda::decode
