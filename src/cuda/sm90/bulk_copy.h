// The PTX of non-tensor bulk copies (compute capability 9.0) that the warp-specialized backward's
// dQ writer uses: a float32 reduce-add of a shared-memory row into global memory, performed by
// the TMA unit, and the per-thread bulk-group commit and waits.
#pragma once

#include <cstdint>

namespace tileattn::cuda::sm90 {

__device__ __forceinline__ void bulk_reduce_add_f32(float* global_dst, const float* shared_src, int bytes) {
  const auto src = static_cast<uint32_t>(__cvta_generic_to_shared(shared_src));
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;"
               :
               : "l"(global_dst), "r"(src), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// This thread's bulk copies have read their shared-memory sources.
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
// This thread's bulk copies are complete: their reductions are performed in global memory.
__device__ __forceinline__ void bulk_wait_done() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
// Orders this thread's generic-proxy accesses against its async-proxy (bulk copy) ones.
__device__ __forceinline__ void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }

}  // namespace tileattn::cuda::sm90
