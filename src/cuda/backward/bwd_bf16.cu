// The bfloat16 instantiations of the CUDA backward.
#include "cuda/backward/bwd_launch.cuh"

namespace tileattn::cuda::bwd {
TILEATTN_INSTANTIATE_BWD(__nv_bfloat16)
}  // namespace tileattn::cuda::bwd
