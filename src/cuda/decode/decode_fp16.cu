// The float16 instantiation of the CUDA decode.
#include "cuda/decode/decode_launch.cuh"

namespace tileattn::cuda::decode {
TILEATTN_INSTANTIATE_DECODE(__half)
}  // namespace tileattn::cuda::decode
