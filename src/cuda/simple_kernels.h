// Two plain CUDA kernels beside the tensor-core one, one warp per query row, float math:
//   - the probabilities pass that fills attn_probs (tests only) from the LSE the forward wrote;
//   - a fallback forward for inputs the tiled kernel cannot load with 16-byte copies (pointers or
//     strides not multiples of 8 elements, head dims not multiples of 8) or that do not fit the
//     device's shared memory.  Slow, but the same contract: every option, O and LSE.
#pragma once

#include <cuda_runtime.h>

#include "cuda/launch_api.h"

namespace tileattn::cuda {

void launch_attn_probs(const FwdKernelArgs& args, cudaStream_t stream);
void launch_fallback_forward(const FwdKernelArgs& args, cudaStream_t stream);

}  // namespace tileattn::cuda
