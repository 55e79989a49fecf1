// The sm90 forward kernel: a persistent, warp-specialized CTA of three or four warpgroups.
//   warpgroup 0: producer; gives registers back (setmaxnreg 24; 32 at d64 in the tail split's
//   kernel) and one thread issues the TMA loads
//   warpgroups 1 ..: consumers; take registers (setmaxnreg 240 for two, 160 for three), each runs 64
//   query rows of a tile.  128 x 24 + 256 x 240 = 64512 or 128 x 24 + 384 x 160 = 64512 of the
//   SM's 65536 registers.
// With Traits::kClusterSize 2, two CTAs of a cluster share each K/V load (cluster_sm90.h).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "cuda/sm90/cluster_sm90.h"
#include "cuda/sm90/consumer.h"
#include "cuda/sm90/kernel_params_sm90.h"
#include "cuda/sm90/pipeline_sm90.h"
#include "cuda/sm90/producer.h"
#include "cuda/sm90/tail_merge_sm90.h"

namespace tileattn::cuda::sm90 {

// kTailSplit: the kernel walks the tail split's pieces (tail_split.h).  A kernel of its own, so
// the calls that do not split run the same code as before it: compiled into every kernel, the
// pieces' walk and merge cost the calls that never split 4-8% at 512 keys (session 42's A/B).
template <typename Traits, typename ScorePolicy, typename DropoutPolicy, bool kTailSplit>
__global__ void __launch_bounds__(Traits::kThreads, 1) fwd_kernel_sm90(const __grid_constant__ Sm90Params<Traits> prm) {
  static_assert(!kTailSplit || tail_split_built<Traits, ScorePolicy, DropoutPolicy>(), "a kernel that can split");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(1024) char smem_raw[];
  auto& ss = *reinterpret_cast<typename Traits::SharedStorage*>(smem_raw);
  // Warp-uniform warpgroup index, so the compiler knows the branches below do not diverge.
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);

  if (threadIdx.x == 0) {
    cute::prefetch_tma_descriptor(prm.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(prm.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(prm.tma_v.get_tma_descriptor());
    cute::prefetch_tma_descriptor(prm.tma_o.get_tma_descriptor());
    FullBarrier::init(&ss.q_full, 1);
    EmptyBarrier::init(&ss.q_empty, Traits::kConsumerThreads);
    for (int s = 0; s < Traits::kStages; ++s) {
      FullBarrier::init(&ss.k_full[s], 1);
      FullBarrier::init(&ss.v_full[s], 1);
      EmptyBarrier::init(&ss.k_empty[s], kv_empty_arrivals<Traits>());
      EmptyBarrier::init(&ss.v_empty[s], kv_empty_arrivals<Traits>());
    }
    cutlass::arch::fence_barrier_init();
  }
  if constexpr (Traits::kClusterSize > 1) {
    cute::cluster_sync();  // the peer CTA arrives on these barriers and multicasts against them
  } else {
    __syncthreads();
  }

  if (warpgroup == 0) {
    // setmaxnreg moves registers only within the CTA's launch allocation: the launch bound's
    // per-thread count (65536 / kThreads down to a multiple of 8: 168 at 384 threads, 128 at 512)
    // times kThreads.  A consumer's alloc waits until the producer has freed enough, so the
    // producer keeps at most what the consumers leave: 24 with two consumers at 240
    // (168 x 384 = 64512 = 24 x 128 + 240 x 256; at 32 the consumers waited forever: the first
    // device run of the tail split hung at d128), 32 with three at 160 (128 x 512 = 65536).
    // The splitting kernel takes that most, up to 32: at 24 its producer spilled 26-45 times
    // around its TMA issues, none at 32 (d64 has the 32; d128 and d256 spill at their 24).
    constexpr int kLaunchRegisters = 65536 / Traits::kThreads / 8 * 8;
    constexpr int kProducerRegistersFree =
        (kLaunchRegisters * Traits::kThreads - Traits::kConsumerThreads * Traits::kConsumerRegisters) / 128 / 8 * 8;
    static_assert(kProducerRegistersFree >= Traits::kProducerRegisters, "the consumers' registers fit the launch");
    constexpr int kProducerRegisters =
        kTailSplit ? (kProducerRegistersFree < 32 ? kProducerRegistersFree : 32) : Traits::kProducerRegisters;
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegisters>();
    if constexpr (Traits::kSeqBounds) {
      if (prm.page_box_rows > 0) {  // pages read box by box: Q and K from warp 0, V from warp 1
        if (threadIdx.x < 32) run_producer<Traits, kTailSplit, ProducerRole::kQueriesAndKeys>(prm, ss);
        else if (threadIdx.x < 64) run_producer<Traits, kTailSplit, ProducerRole::kValues>(prm, ss);
      } else if (threadIdx.x == 0) {
        run_producer<Traits, kTailSplit>(prm, ss);
      }
    } else if (threadIdx.x == 0) {
      run_producer<Traits, kTailSplit>(prm, ss);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
    run_consumer<Traits, ScorePolicy, DropoutPolicy, kTailSplit>(prm, ss, warpgroup - 1);
  }
#endif
}

}  // namespace tileattn::cuda::sm90
