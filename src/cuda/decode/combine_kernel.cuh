// The combine kernel: merges the float32 partial results of the splits through their LSEs.
//   lse = log sum_s exp(lse_s),   out = sum_s exp(lse_s - lse) out_s
// (Flash-Decoding; a split that saw no key has lse_s = -inf and weight 0).  One CTA per output
// row (b, h, i): thread s reads split s's LSE (kMaxSplits <= kThreads), thread d sums dims d and
// d + 128 over the splits.  The partial outputs do not depend on the LSEs, so the first
// kSplitsPerTrip splits' values are loaded together with the LSEs: a row of up to 32 splits costs
// one memory round trip, not two or three (each ~1 us of a 1 x 2k call's ~12; the first version's
// per-split loop made 99 splits cost 190 us).  The sum runs in split order either way, so the bits
// do not depend on the batching.
#pragma once

#include <math_constants.h>

#include "cuda/decode/decode_args.h"
#include "cuda/decode/elements.cuh"
#include "cuda/decode/split_partial.cuh"

namespace tileattn::cuda::decode {

static_assert(kMaxSplits <= kThreads, "one thread per split's LSE");
constexpr int kSplitsPerTrip = 32;
constexpr int kCombineDims = 2;  // dims a thread: head dims up to 256 over 128 threads
static_assert(kCombineDims * kThreads >= 256, "every head dim the API takes");

__device__ __forceinline__ float block_reduce(float x, bool is_max, float* scratch) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const float y = __shfl_xor_sync(0xffffffffu, x, offset);
    x = is_max ? fmaxf(x, y) : x + y;
  }
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  float total = scratch[0];
  for (int w = 1; w < kWarps; ++w) total = is_max ? fmaxf(total, scratch[w]) : total + scratch[w];
  __syncthreads();
  return total;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) combine_kernel(const DecodeArgs args) {
  __shared__ float weights[kMaxSplits];
  __shared__ float scratch[kWarps];
  const tileattn_fwd_params& f = args.p.fwd;
  const int64_t split_rows = static_cast<int64_t>(f.batch) * f.num_heads * f.seqlen_q;
  const int64_t row = blockIdx.x;
  const int i = static_cast<int>(row % f.seqlen_q), h = static_cast<int>(row / f.seqlen_q % f.num_heads);
  const int b = static_cast<int>(row / (static_cast<int64_t>(f.seqlen_q) * f.num_heads));
  const int splits = args.num_splits, s = threadIdx.x;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched programmatically (decode_launch.cuh): wait for the split kernel's partials.  A no-op
  // when the launch was an ordinary one.  The trigger lets a kernel launched programmatically
  // after this one (the next decode call's split kernel) start its launch now; it waits for this
  // grid to finish before touching memory.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  const QuerySlots slots = query_slots(f, b);
  if (!slots.live(i)) return;  // a leading slot of packed rows: no output row

  T* out = static_cast<T*>(f.out) + slots.offset(i, h, f.out_batch_stride, f.out_row_stride, f.out_head_stride);
  const float* partial = args.o_partial + row * f.head_dim;
  const int64_t split_stride = split_rows * f.head_dim;
  auto load_trip = [&](float (&part)[kCombineDims][kSplitsPerTrip], int k0) {
#pragma unroll
    for (int c = 0; c < kCombineDims; ++c) {
      const int d = threadIdx.x + c * kThreads;
#pragma unroll
      for (int j = 0; j < kSplitsPerTrip; ++j) {
        part[c][j] = d < f.head_dim && k0 + j < splits ? partial[(k0 + j) * split_stride + d] : 0.0f;
      }
    }
  };
  float part[kCombineDims][kSplitsPerTrip];
  const float mine = s < splits ? args.lse_partial[s * split_rows + row] : -CUDART_INF_F;
  load_trip(part, 0);

  // The same expressions as the cluster merge (split_partial.cuh), so both give the same bits.
  const bool poisoned = __syncthreads_or(isnan(mine));
  const float lse_max = block_reduce(mine, true, scratch);
  const MergedLse merged = merged_lse(lse_max, block_reduce(lse_exp(mine, lse_max), false, scratch), poisoned);
  if (s < splits) weights[s] = merged.weight(mine);
  __syncthreads();

  float x[kCombineDims] = {};
  for (int k0 = 0; k0 < splits; k0 += kSplitsPerTrip) {
    if (k0 > 0) load_trip(part, k0);
#pragma unroll
    for (int c = 0; c < kCombineDims; ++c) {
#pragma unroll
      for (int j = 0; j < kSplitsPerTrip; ++j) {
        if (k0 + j < splits) x[c] = fmaf(weights[k0 + j], part[c][j], x[c]);
      }
    }
  }
#pragma unroll
  for (int c = 0; c < kCombineDims; ++c) {
    const int d = threadIdx.x + c * kThreads;
    if (d < f.head_dim) out[d] = from_float<T>(poisoned ? CUDART_NAN_F : x[c]);
  }
  if (threadIdx.x == 0) f.softmax_lse[slots.lse_offset(f, i, h)] = merged.output_lse();
}

}  // namespace tileattn::cuda::decode
