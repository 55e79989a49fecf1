// Checks only the CUDA side can make: the GPU's architecture, that pointers are device memory,
// and that the problem fits the launch grid; and the current GPU's SM count and opt-in shared
// memory.  Shared by the forward, the backward and the decode.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "cuda/check.h"
#include "tileattn/tileattn.hpp"

namespace tileattn::cuda {

// An attribute of the current GPU.
inline int device_attribute(cudaDeviceAttr attribute, const char* what) {
  int device = 0, value = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&value, attribute, device), what);
  return value;
}

inline void require_sm80() {
  const int major = device_attribute(cudaDevAttrComputeCapabilityMajor, "cudaDeviceGetAttribute");
  const int minor = device_attribute(cudaDevAttrComputeCapabilityMinor, "cudaDeviceGetAttribute");
  if (major < 8) {
    throw Error(ErrorCode::kUnsupported, "q",
                "the CUDA backend needs compute capability 8.0 or newer (Ampere); this GPU is sm" +
                    std::to_string(major) + std::to_string(minor));
  }
}

// nullptr passes (optional arguments); host memory does not.
inline void require_device_pointer(const void* ptr, const char* name) {
  if (ptr == nullptr) return;
  cudaPointerAttributes attributes;
  if (cudaPointerGetAttributes(&attributes, ptr) != cudaSuccess) {
    cudaGetLastError();  // clear the error so later calls are not blamed for it
    throw Error(ErrorCode::kInvalidArgument, name, std::string(name) + " is not a CUDA pointer");
  }
  if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged) {
    throw Error(ErrorCode::kInvalidArgument, name,
                std::string(name) + " must point to device memory for the CUDA backend");
  }
}

// Grids put sequences on y and heads on z, each limited to 65535.
inline void require_grid_fits(const tileattn_fwd_params& p) {
  if (p.batch > 65535) {
    throw Error(ErrorCode::kUnsupported, "q", "the CUDA backend handles at most 65535 sequences per call");
  }
  if (p.num_heads > 65535) {
    throw Error(ErrorCode::kUnsupported, "q", "the CUDA backend handles at most 65535 heads");
  }
}

// TMA descriptors (the sm90 kernels) take no stride of 0: an expanded tensor must go elsewhere.
inline bool all_positive(std::initializer_list<int64_t> strides) {
  for (int64_t stride : strides) {
    if (stride <= 0) return false;
  }
  return true;
}

inline int sm_count() {
  return device_attribute(cudaDevAttrMultiProcessorCount, "cudaDeviceGetAttribute(multiprocessors)");
}

// Shared memory one block may opt in to (227 KB on H100/H200).
inline int smem_optin_bytes() {
  return device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, "cudaDeviceGetAttribute(shared memory)");
}

}  // namespace tileattn::cuda
