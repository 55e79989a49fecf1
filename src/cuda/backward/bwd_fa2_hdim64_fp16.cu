// The FA2 backward for head dims up to 64, fp16: one translation unit per instance so they build in parallel.
#include "cuda/backward/bwd_fa2_launch.cuh"

namespace tileattn::cuda::bwd {
TILEATTN_INSTANTIATE_FA2_BWD(64, cutlass::half_t)
}  // namespace tileattn::cuda::bwd
