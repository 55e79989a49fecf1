// What the dispatcher (cuda_forward.cu) sees of the kernels: the per-bucket entry points, declared
// without any CuTe type so that the dispatcher compiles fast.  The generated translation units
// define them; fwd_instances.inc (generated too) lists those that were built.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "tileattn/tileattn.hpp"

namespace tileattn::cuda {

// Host-resolved values the kernel needs beside the params.
struct FwdKernelArgs {
  ForwardParams params;
  float scale_log2;    // softmax_scale * log2(e) (plain scores) or log2(e) (transformed scores)
  float output_scale;  // 1 / (1 - dropout_p), or 1
  uint32_t dropout_threshold;
};

struct FwdVariant {
  bool transformed_scores;  // softcap, ALiBi or a negative softmax scale
  bool dropout;
};

template <int kHeadDim, typename Element>
void run_fwd(const FwdKernelArgs& args, const FwdVariant& variant, cudaStream_t stream);

template <int kHeadDim, typename Element>
int fwd_smem_bytes();

}  // namespace tileattn::cuda
