// What the dispatcher (cuda_forward.cu) sees of the sm90 kernels: per-bucket entry points declared
// without CuTe types.  The generated fwd_sm90_<dtype>_hdim<D>.cu files (compiled for sm_90a only)
// define them; sm90_fwd_instances.inc lists those that were built.
#pragma once

#include <cuda_runtime.h>

#include "cuda/launch_api.h"

namespace tileattn::cuda::sm90 {

// Runs the forward on the sm90 kernel.  The caller has checked sm90_supports().
template <int kHeadDim, typename Element>
void run_fwd_sm90(const FwdKernelArgs& args, const FwdVariant& variant, cudaStream_t stream);

template <int kHeadDim, typename Element>
int fwd_smem_bytes_sm90();

}  // namespace tileattn::cuda::sm90
