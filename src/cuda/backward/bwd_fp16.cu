// The float16 instantiations of the CUDA backward.
#include "cuda/backward/bwd_launch.cuh"

namespace tileattn::cuda::bwd {
TILEATTN_INSTANTIATE_BWD(__half)
}  // namespace tileattn::cuda::bwd
