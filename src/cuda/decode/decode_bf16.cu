// The bfloat16 instantiation of the CUDA decode.
#include "cuda/decode/decode_launch.cuh"

namespace tileattn::cuda::decode {
TILEATTN_INSTANTIATE_DECODE(__nv_bfloat16)
}  // namespace tileattn::cuda::decode
