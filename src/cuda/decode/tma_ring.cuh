// The PTX behind the decode kernel's TMA staging (compute capability 9.0): shared-memory
// transaction barriers (mbarrier) and 4-D tensor loads (cp.async.bulk.tensor) that complete on
// them.  A warp owns a ring of stages; its lane 0 arms a stage's barrier with the bytes it expects
// and issues the loads, and all 32 lanes wait on the barrier's phase before reading the stage.
#pragma once

#include <cuda.h>
#include <stdint.h>

namespace tileattn::cuda::decode {

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, int arrivals) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(bar)), "r"(arrivals) : "memory");
#endif
}

// Makes initialized barriers visible to the async proxy (the TMA unit) before it signals them.
__device__ __forceinline__ void fence_barrier_init() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// Orders this thread's earlier generic-proxy shared-memory accesses before later async-proxy
// writes (a TMA load refilling a stage the warp has just read).
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// Brings a tensor map (here a __grid_constant__ kernel parameter) into the TMA unit's descriptor
// cache ahead of its first load.
__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#endif
}

// One arrival that also tells the barrier to wait for `bytes` of TMA transactions.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
#endif
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_address(bar)) : "memory");
#endif
}

// Returns once the barrier's phase with this parity has completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n"
      "}\n" ::"r"(smem_address(bar)),
      "r"(parity)
      : "memory");
#endif
}

// The L2 policy the cache's K/V boxes are loaded with: evict_first, for data read once.  On the
// H200 (docs/perf-log.md, session 15) evict_first with no L2 promotion on the tensor map took the
// TMA loop from 3.4 to 4.36 TB/s at 8 x 32k; promotion to 256 B or normal eviction left 8-28% on
// the table (Nsight Compute: a 26% L2 hit rate on a stream read once, the L2 at 92% of its
// throughput while DRAM was at 82%).
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#endif
  return policy;
}

// The box at coordinates (c0, c1, c2, c3) (innermost first) of the tensor `map` describes, into
// shared memory at `dst`, completing its bytes on `bar`; the lines it brings into L2 carry
// `policy` (l2_evict_first_policy).  Coordinates past the tensor read as zero.
__device__ __forceinline__ void tma_load_4d(const CUtensorMap* map, void* dst, uint64_t* bar, int c0, int c1, int c2,
                                            int c3, uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%3, %4, "
      "%5, %6}], [%2], %7;" ::"r"(smem_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_address(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "l"(policy)
      : "memory");
#endif
}

}  // namespace tileattn::cuda::decode
