// Host side of the CUDA backward: the launcher each (head-dim bucket, dtype) instantiation
// provides, and the arguments every kernel shares.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "tileattn/tileattn.h"

namespace tileattn::cuda::bwd {

struct BwdArgs;

// Runs the main kernel (and, when deterministic, the dQ kernel) for one bucket and dtype.
template <int kHeadDim, typename Element>
void run_bwd_tiles(const BwdArgs& args, cudaStream_t stream);

// The delta and finishing kernels, templated on the dtype only.
template <typename Element>
void run_bwd_delta(const BwdArgs& args, cudaStream_t stream);
template <typename Element>
void run_bwd_finish(const BwdArgs& args, cudaStream_t stream);

}  // namespace tileattn::cuda::bwd
