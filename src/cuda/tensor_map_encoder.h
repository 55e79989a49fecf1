// cuTensorMapEncodeTiled from the driver, looked up once: the library links only the CUDA runtime,
// and the driver's entry point is what encodes the TMA tensor maps the decode kernels read
// (src/cuda/decode/cuda_decode.cu), the sm90 forward's page boxes (sm90/paged_boxes_sm90.h) and
// bench/gpu/sm_intake.cu's.  nullptr when the driver has none.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

namespace tileattn::cuda {

// The entry point's type from cuda.h's own prototype: cudaTypedefs.h's PFN_ name is not usable in
// units that include CuTe first (CUTLASS includes cudaTypedefs.h inside its own namespace, and the
// header's include guard then keeps it out of the global one).
using TensorMapEncoder = decltype(&cuTensorMapEncodeTiled);

inline TensorMapEncoder tensor_map_encoder() {
  static const TensorMapEncoder encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t status =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
    return status == cudaSuccess && found == cudaDriverEntryPointSuccess
               ? reinterpret_cast<TensorMapEncoder>(fn)
               : nullptr;
  }();
  return encode;
}

}  // namespace tileattn::cuda
