// CUDA runtime errors -> tileattn::Error(kInternal).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "tileattn/tileattn.hpp"

namespace tileattn::cuda {

// A failed runtime call also leaves its error as the thread's "last error" (a launch through
// cudaLaunchKernelEx returns it and records it): cleared here, or the next launch's
// check_cuda(cudaGetLastError()) would report this error against a call that did nothing wrong
// (seen: a decode split launch refused for its grid, then the next call's poison_kernel).  Sticky
// errors (a kernel's illegal address) survive the clear and keep failing later calls, as they must.
inline void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw Error(ErrorCode::kInternal, "", std::string("CUDA error in ") + what + ": " +
                                              cudaGetErrorName(status) + " (" +
                                              cudaGetErrorString(status) + ")");
  }
}

}  // namespace tileattn::cuda
