// Which kernel family serves a call on this GPU: the Hopper (sm90a: wgmma, TMA) kernels run on
// compute capability 9.0 only, and an environment variable per direction lets a user force the
// sm80 family (for comparisons, or as an escape hatch):
//   TILEATTN_FORWARD_FAMILY, TILEATTN_BACKWARD_FAMILY, TILEATTN_DECODE_FAMILY
//     = auto (default) | sm90 | sm80
// auto and sm90 use the Hopper kernels where they apply (the decode's auto only at the sizes where
// they are faster); any other value is an error naming the variable.  Read on every call, so one
// process (a test, a benchmark) can switch families.
#pragma once

#include <cuda_runtime.h>

#include "common/env_choice.h"
#include "cuda/check.h"

namespace tileattn::cuda {

enum class KernelFamily { kAuto, kSm90, kSm80 };  // in env_choice's order below

inline KernelFamily kernel_family(const char* variable) {
  return static_cast<KernelFamily>(env_choice(variable, {"auto", "sm90", "sm80"}));
}

inline bool sm90_family_allowed(const char* variable) { return kernel_family(variable) != KernelFamily::kSm80; }

// Whether `variable` says sm90 outright (not auto): a kernel chosen by size under auto is then
// used at every size.
inline bool sm90_family_forced(const char* variable) { return kernel_family(variable) == KernelFamily::kSm90; }

// wgmma and TMA as compiled (sm_90a) run on compute capability 9.0 only.
inline bool is_sm90_device() {
  int device = 0, major = 0, minor = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), "cudaDeviceGetAttribute");
  return major == 9 && minor == 0;
}

}  // namespace tileattn::cuda
