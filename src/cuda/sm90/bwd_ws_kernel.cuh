// The warp-specialized Hopper backward (FlashAttention-3's layout; types in bwd_ws_traits.h, roles
// in bwd_ws_roles.cuh).  One CTA of three warpgroups per (key block of 128, sequence, query head),
// walking the query blocks that see its keys in the order the FA2-structured kernel uses
// (bwd_walk_order.h).  The key-split layout (d64, d128):
//
//   producer warp 0 (one thread): K, V once; per query block, once its stage is free: Q_i, dO_i (TMA)
//   producer warp 1:              per query block: LSE_i (log2 units) and D_i into the stage
//   producer warps 2, 3 (dQ writers, even and odd steps): per query block: adds dQ_i from shared
//                                 memory to the float32 workspace by bulk reductions (in turn
//                                 order when deterministic)
//   consumer g (keys 64g .. 64g + 63), per query block i:
//     S^T = K_g Q_i^T,  dP^T = V_g dO_i^T                    (wgmma, both operands in smem)
//     P^T = exp2(S^T scale_log2 - LSE_i)   (0 where masked)  -- while dP^T is on the tensor cores
//     dS^T = P^T o (Z^T o dP^T - D_i)       (Z = dropout mask / (1 - p), 1 without dropout)
//     dV_g += (Z^T o P^T) dO_i,  dK_g += dS^T Q_i            (wgmma, A from registers)
//     dS -> smem;  barrier with the other consumer;  dQ_i[:, 64g..] = dS K  (wgmma, smem; at
//     d64 the consumers take alternate blocks' whole dQ instead)
//     release the stage;  dQ_i -> shared memory for the writer
//   then dK_g (times the softmax scale) and dV_g to global memory.
//
// What it changes against the FA2-structured kernel: no thread waits for its own loads (the TMA
// producer runs a stage ahead), no CTA-wide barrier (the consumers meet once per block, over dS),
// the keys as the M mode give P^T and dS^T in registers in the A layout of the dV and dK
// products, so P never goes through shared memory, and the consumers issue no atomics (the first
// version's float2 atomics, issued by every CTA of a head at the same moment, made it 10-50% slower
// than the FA2-structured kernel while its deterministic mode, which spreads them, was faster).
//
// At d256 the consumers split the columns of dK, dV and dQ instead, over 64-key blocks
// (bwd_ws_cols_traits.h, bwd_ws_cols_consumer.cuh); the producer roles are the same, with Q and dO
// on separate barriers of a single stage.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "cuda/sm90/bwd_ws_cols_consumer.cuh"
#include "cuda/sm90/bwd_ws_roles.cuh"

namespace tileattn::cuda::sm90 {

// kWriters dQ writer warps (1 or 2): a compile-time count, since with a runtime one the atomic
// path (one writer) measured 3-5% slower at d128 8k and ~10% at causal 1-2k than before the second
// writer existed (2026-11-30 A/B; ptxas stack 8 -> 24 bytes).
template <typename Traits, int kWriters, bool kDropout>
__global__ void __launch_bounds__(Traits::kThreads, 1) bwd_ws_kernel(const __grid_constant__ BwdWsParams<Traits> prm) {
  static_assert(kWriters >= 1 && kWriters <= Traits::kDqWriters);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(1024) char smem_raw[];
  auto& ss = *reinterpret_cast<typename Traits::template SharedStorage<kWriters>*>(smem_raw);
  const tileattn_fwd_params& f = prm.a.p.fwd;
  const int b = blockIdx.y, h = blockIdx.z;
  if (!sequence_in_bounds(f, b)) return;  // bad cu_seqlens / seqused_k: index_poison.h
  BwdWalk walk{&f, sequence_view(f, b), bwd::key_block_of(blockIdx.x, gridDim.x, prm.a.walk_order), Traits::kBlockM,
               Traits::kBlockN, prm.a.walk_order};
  if (walk.n_block * Traits::kBlockN >= walk.seq.seqlen_k) return;
  walk.plan();
  const int first = walk.at(0);

  if (threadIdx.x == 0) {
    cute::prefetch_tma_descriptor(prm.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(prm.tma_do.get_tma_descriptor());
    cute::prefetch_tma_descriptor(prm.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(prm.tma_v.get_tma_descriptor());
    FullBarrier::init(&ss.kv_full, 1);
    for (int s = 0; s < Traits::kStages; ++s) {
      FullBarrier::init(&ss.q_full[s], 1 + 32);  // the TMA arm and the 32 row-statistics lanes
      EmptyBarrier::init(&ss.q_empty[s], Traits::kConsumerThreads);
      if constexpr (Traits::kColumnSplit) {  // Q and dO on barriers of their own
        FullBarrier::init(&ss.do_full[s], 1 + 32);
        EmptyBarrier::init(&ss.do_empty[s], Traits::kConsumerThreads);
      }
    }
    for (int w = 0; w < kWriters; ++w) {
      EmptyBarrier::init(&ss.dq_full[w], Traits::kConsumerThreads);
      EmptyBarrier::init(&ss.dq_empty[w], 1);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    const int warp = threadIdx.x / 32;
    if (first < 0) return;
    if (warp == 0 && threadIdx.x == 0) {
      ws_load_tiles<Traits>(prm, ss, walk, b, h, h / (f.num_heads / f.num_heads_k));
    } else if (warp == 1) {
      ws_stage_row_stats<Traits>(prm.a, ss, walk, h);
    } else if (warp >= 2 && warp - 2 < kWriters) {  // lanes 1-31 of warp 0 are idle too
      ws_write_dq<Traits, kWriters>(prm.a, ss, walk, b, h, warp - 2);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
    if constexpr (Traits::kColumnSplit) {
      ws_consume_cols<Traits, kWriters, kDropout>(prm, ss, walk, first, warpgroup - 1, b, h);
    } else {
      ws_consume<Traits, kWriters, kDropout>(prm, ss, walk, first, warpgroup - 1, b, h);
    }
  }
#endif
}

}  // namespace tileattn::cuda::sm90
