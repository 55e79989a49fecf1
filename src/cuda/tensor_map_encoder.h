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

// A 4-D tensor map of 16-bit elements (dims innermost first, element_strides of dims 1-3 in
// elements) read in boxes of `box` with the 128-byte swizzle, no interleave and no out-of-bounds
// fill: the decode kernels' cache maps and the sm90 forward's page boxes.  False when the driver
// has no encoder or refuses the map.
inline bool encode_swizzled_map_4d(CUtensorMap* map, CUtensorMapDataType type, const void* base,
                                   const cuuint64_t (&dims)[4], const int64_t (&element_strides)[3],
                                   const cuuint32_t (&box)[4], CUtensorMapL2promotion promotion) {
  const TensorMapEncoder encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(element_strides[0]) * 2,
                                 static_cast<cuuint64_t>(element_strides[1]) * 2,
                                 static_cast<cuuint64_t>(element_strides[2]) * 2};
  const cuuint32_t unit_steps[4] = {1, 1, 1, 1};
  return encode(map, type, 4, const_cast<void*>(base), dims, strides, box, unit_steps, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace tileattn::cuda
