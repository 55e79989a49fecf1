// The synchronization of the warp-specialized CTA: mbarrier pipelines between the TMA producer
// and the consumers, and named barriers between the two consumer warpgroups.
//
// Each K (and V) stage has a "full" barrier (one producer arrival plus the TMA transaction bytes)
// and an "empty" barrier (one arrival from every consumer thread).  A barrier completes phases
// 0, 1, 2, ...; waiting on parity p returns once a phase of parity p has completed, and waiting on
// parity 1 of a fresh barrier returns at once, which is how the producer's first pass over the
// empty barriers goes through without a consumer having released anything.
#pragma once

#include <cutlass/arch/barrier.h>

#include "cuda/sm90/tile_config_sm90.h"

namespace tileattn::cuda::sm90 {


// Position in a ring of kStages buffers: the buffer index and the parity of its current use.
// Producer and consumers walk the same sequence of key blocks, so their counters agree.
template <int kStages>
struct StageCounter {
  int index = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++index == kStages) {
      index = 0;
      phase ^= 1u;
    }
  }
};

using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
using EmptyBarrier = cutlass::arch::ClusterBarrier;

// Named barriers 1..6 (0 is __syncthreads).  kSchedulerBase + w orders consumer w's wgmma issue
// after the previous consumer's (ping-pong); kEpilogueBase + w gathers consumer w before its O
// store.
constexpr int kSchedulerBarrierBase = 1;
constexpr int kEpilogueBarrierBase = kSchedulerBarrierBase + kMaxConsumers;

__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Ping-pong between the consumers (FlashAttention-3, section 3.1): a consumer waits for its turn
// before issuing its GEMMs, and hands the turn to the next one (round robin) after issuing them,
// so that the tensor cores run one consumer's GEMMs while the others compute their softmax.  Each
// turn barrier counts two warpgroups: its waiter (bar.sync) and the one handing over (bar.arrive).
template <int kConsumers>
struct PingPong {
  int self;  // consumer index 0 .. kConsumers - 1
  __device__ __forceinline__ void wait_turn() const { named_barrier_sync(kSchedulerBarrierBase + self, 256); }
  __device__ __forceinline__ void pass_turn() const {
    named_barrier_arrive(kSchedulerBarrierBase + (self + 1) % kConsumers, 256);
  }
};

}  // namespace tileattn::cuda::sm90
