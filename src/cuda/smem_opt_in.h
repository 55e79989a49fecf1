// Dynamic shared memory above 48 KB is opt-in per kernel (cudaFuncSetAttribute), and the setting
// lives in each device's context: a process that launches on two GPUs needs it on both.  Setting
// it before every launch cost ~1-5 us of host a call on the H200's host (torch.profiler, session
// 23: 4.9 us under the profiler for the sm90 forward, whose fwd+bwd step is host-bound at small
// sizes), so each kernel keeps the devices it has opted in on.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "cuda/check.h"

namespace tileattn::cuda {

// One per kernel (a static in the launcher's template instance): bit d set once device d opted in.
struct SmemOptIn {
  std::atomic<uint64_t> devices{0};
};

// `kernel` may use `bytes` of dynamic shared memory on the current device.  Devices past 63 are
// opted in at every call.  Two threads may both set the attribute the first time: harmless.
template <typename Kernel>
void opt_in_smem(SmemOptIn& state, Kernel kernel, int bytes, const char* what) {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if (bit != 0 && (state.devices.load(std::memory_order_acquire) & bit) != 0) return;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), what);
  state.devices.fetch_or(bit, std::memory_order_release);
}

}  // namespace tileattn::cuda
