// CUDA runtime errors -> tileattn::Error(kInternal).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "tileattn/tileattn.hpp"

namespace tileattn::cuda {

inline void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw Error(ErrorCode::kInternal, "", std::string("CUDA error in ") + what + ": " +
                                              cudaGetErrorName(status) + " (" +
                                              cudaGetErrorString(status) + ")");
  }
}

}  // namespace tileattn::cuda
