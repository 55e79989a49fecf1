// Keeping register math ahead of a wgmma wait.
//
// ptxas places a wgmma wait (WARPGROUP.DEPBAR) as early as the instructions it can see allow, and
// no register-only instruction orders it.  In the forward's key-block loop (CUDA 13.0, every head
// dim) it hoisted the wait for block n + 1's PV product above the whole softmax of block n, to
// the softmax's second instruction: the softmax then ran after the product instead of under it,
// which undoes FlashAttention-3's intra-warpgroup overlap (section 3.2).  The PTX had the wait
// after the softmax; a clock64 trace of the loop put the softmax step at 1250-1670 cycles against
// 1150-1480 for the same step with no product in flight.  A store to shared memory of values the
// step ends with does hold the wait back: ptxas keeps memory operations and the wait in program
// order, and the store cannot issue before its operands exist.
#pragma once

#include <cstdint>

namespace tileattn::cuda::sm90 {

// Stores this thread's two row sums (the last values score_step() computes) into `sink_slot`, its
// own shared-memory slot, which nothing reads.  Call it right before the warpgroup_wait it must
// precede.
__device__ __forceinline__ void hold_wait_after(float2* sink_slot, const float (&row_sum)[2]) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(sink_slot));
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(address), "f"(row_sum[0]), "f"(row_sum[1]) : "memory");
}

}  // namespace tileattn::cuda::sm90
