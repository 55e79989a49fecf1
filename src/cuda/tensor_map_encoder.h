// cuTensorMapEncodeTiled from the driver, looked up once: the library links only the CUDA runtime,
// and the driver's entry point is what encodes the TMA tensor maps the decode kernels read
// (src/cuda/decode/cuda_decode.cu) and bench/gpu/sm_intake.cu's.  nullptr when the driver has none.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

namespace tileattn::cuda {

inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t status =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
    return status == cudaSuccess && found == cudaDriverEntryPointSuccess
               ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn)
               : nullptr;
  }();
  return encode;
}

}  // namespace tileattn::cuda
