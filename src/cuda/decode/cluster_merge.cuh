// The splits of one (sequence, KV head, row block) merged inside a thread-block cluster
// (compute capability 9.0, the TMA loop, 2 to kMaxClusterSplits splits): the split CTAs are
// launched as one cluster (1, splits, 1), so each can read the others' shared memory, and they
// merge their (max, sum, O) there instead of writing float32 partials for a combine kernel.
//
// The merge is Flash-Decoding's (combine_kernel.cuh): lse = log sum_s exp(lse_s),
// out = sum_s exp(lse_s - lse) out_s over the splits' normalized partial outputs out_s.
// What it saves against the combine kernel: each split CTA's partial stores, and the combine's
// wait for the whole split grid, its loads and its stores, ~2.4 us of an 8 x 2k call's ~24 (session
// 19's timeline: the combine left its wait 0.7 us after the last split CTA and ended 1.7 us later).
// Each CTA of the cluster writes an equal slice of the rows' dims, reading every split's O for it.
#pragma once

#include <math_constants.h>

#include <cute/arch/cluster_sm90.hpp>

#include "cuda/decode/decode_args.h"
#include "cuda/decode/elements.cuh"
#include "cuda/decode/split_partial.cuh"
#include "cuda/decode/tma_ring.cuh"  // smem_address

namespace tileattn::cuda::decode {

// Every thread of every CTA of the cluster arrives, then waits for all: release/acquire, so the
// shared-memory writes before it are visible to the peers' reads after it.  cute::cluster_sync
// issues the same barrier without a "memory" clobber, which leaves the compiler free to move
// plain shared-memory stores across it.
__device__ __forceinline__ void cluster_barrier() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

// The address of `p` (this CTA's shared memory) in the shared memory of cluster CTA `rank`.
__device__ __forceinline__ uint32_t peer_address(const void* p, uint32_t rank) {
  return cute::set_block_rank(smem_address(p), rank);
}

__device__ __forceinline__ float load_peer(uint32_t address) {
  float x = 0.0f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(x) : "r"(address) : "memory");
#endif
  return x;
}

__device__ __forceinline__ float4 load_peer4(uint32_t address) {
  float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(x.x), "=f"(x.y), "=f"(x.z), "=f"(x.w)
               : "r"(address)
               : "memory");
#endif
  return x;
}

// Called by every thread of every split CTA once its warps are merged into `sm` (row_max,
// row_sum, row_scale, and O as o[0] + o[1]); writes out and, from the cluster's first CTA, the LSE.
// The math is the combine kernel's, expression for expression (split_partial.cuh): each split's
// partial O and LSE as the split kernel would store them, the LSEs' max, their exponentials summed
// in the order the combine's block_reduce adds up to 8 values, the weights, and the outputs summed
// in split order with fmaf.  So the two merges give the same bits (a test holds them to it), and
// the heuristic may pick either by batch size without breaking a fixed num_splits' batch
// invariance.
template <typename T, int kD, typename Smem, typename HeadOf, typename QrowOf>
__device__ __forceinline__ void merge_splits_in_cluster(const DecodeArgs& args, Smem& sm, bool seq_ok,
                                                        const QuerySlots& slots, int rows_here, HeadOf head_of,
                                                        QrowOf qrow_of) {
  const tileattn_fwd_params& f = args.p.fwd;
  const int splits = args.num_splits;  // the cluster's size
  const uint32_t rank = cute::block_rank_in_cluster();
  cluster_barrier();  // every split's (max, sum, scale, O) is in its shared memory
  if (threadIdx.x < rows_here) {
    const int r = threadIdx.x;
    float split_lse[kMaxClusterSplits];
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      split_lse[s] = s < splits ? split_partial_lse(seq_ok, load_peer(peer_address(&sm.row_max[r], s)),
                                                    load_peer(peer_address(&sm.row_sum[r], s)))
                                : -CUDART_INF_F;
    }
    const MergedLse merged = merge_split_lses(split_lse);
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      if (s < splits) sm.split_weight[s][r] = merged.weight(split_lse[s]);
    }
    sm.row_poisoned[r] = merged.poisoned;
    if (rank == 0 && slots.live(qrow_of(r))) f.softmax_lse[slots.lse_offset(f, qrow_of(r), head_of(r))] = merged.output_lse();
  }
  __syncthreads();  // split_weight, row_poisoned complete

  // This CTA's slice of the rows' dims, four at a time (kD: the bucket's, a constant divisor).
  constexpr int kQuads = kD / 4;
  const int total = rows_here * kQuads, per_cta = (total + splits - 1) / splits;
  const int end = min(total, static_cast<int>(rank + 1) * per_cta);
  for (int e = static_cast<int>(rank) * per_cta + threadIdx.x; e < end; e += blockDim.x) {
    const int r = e / kQuads, d0 = e % kQuads * 4;
    if (d0 >= f.head_dim) continue;
    float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      if (s < splits) {
        const float w = sm.split_weight[s][r], scale = load_peer(peer_address(&sm.row_scale[r], s));
        const float4 a = load_peer4(peer_address(&sm.o[0][r][d0], s));
        const float4 c = load_peer4(peer_address(&sm.o[1][r][d0], s));
        x[0] = fmaf(w, split_partial_o(seq_ok, scale, a.x + c.x), x[0]);
        x[1] = fmaf(w, split_partial_o(seq_ok, scale, a.y + c.y), x[1]);
        x[2] = fmaf(w, split_partial_o(seq_ok, scale, a.z + c.z), x[2]);
        x[3] = fmaf(w, split_partial_o(seq_ok, scale, a.w + c.w), x[3]);
      }
    }
    if (!slots.live(qrow_of(r))) continue;
    const bool poisoned = sm.row_poisoned[r];
    T* out = static_cast<T*>(f.out) +
             slots.offset(qrow_of(r), head_of(r), f.out_batch_stride, f.out_row_stride, f.out_head_stride);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      if (d0 + c < f.head_dim) out[d0 + c] = from_float<T>(poisoned ? CUDART_NAN_F : x[c]);
    }
  }
  cluster_barrier();  // no CTA exits while a peer may still read its shared memory
}

}  // namespace tileattn::cuda::decode
