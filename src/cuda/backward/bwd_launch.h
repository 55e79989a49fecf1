// Host side of the CUDA backward: the launchers each (head-dim bucket, dtype) instantiation
// provides.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "tileattn/tileattn.h"

namespace tileattn::cuda::bwd {

struct BwdArgs;

// The FA2 register-level main kernel for one bucket (64, 128, 256) and dtype (cutlass::half_t,
// cutlass::bfloat16_t).  Needs 16-byte aligned rows (BwdArgs' vector_* flags all true).
template <int kHeadDim, typename Element>
void run_fa2_bwd(const BwdArgs& args, cudaStream_t stream);

// The fallback for inputs that are not 16-byte aligned: the WMMA main kernel (and, when
// deterministic, the dQ kernel) for one bucket and dtype (__half, __nv_bfloat16).
template <int kHeadDim, typename Element>
void run_bwd_tiles(const BwdArgs& args, cudaStream_t stream);

// The delta and finishing kernels, templated on the dtype only.
template <typename Element>
void run_bwd_delta(const BwdArgs& args, cudaStream_t stream);
template <typename Element>
void run_bwd_finish(const BwdArgs& args, cudaStream_t stream);

}  // namespace tileattn::cuda::bwd
