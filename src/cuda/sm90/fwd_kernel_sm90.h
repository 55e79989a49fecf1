// The sm90 forward kernel: a persistent, warp-specialized CTA of three or four warpgroups.
//   warpgroup 0: producer; gives registers back (setmaxnreg 24) and one thread issues the TMA loads
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

namespace tileattn::cuda::sm90 {

template <typename Traits, typename ScorePolicy, typename DropoutPolicy>
__global__ void __launch_bounds__(Traits::kThreads, 1) fwd_kernel_sm90(const __grid_constant__ Sm90Params<Traits> prm) {
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
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    if (threadIdx.x == 0) run_producer<Traits>(prm, ss);
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
    run_consumer<Traits, ScorePolicy, DropoutPolicy>(prm, ss, warpgroup - 1);
  }
#endif
}

}  // namespace tileattn::cuda::sm90
