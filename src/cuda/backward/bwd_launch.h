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

namespace tileattn::cuda::sm90 {

// The same main kernel with wgmma products, for compute capability 9.0 only: defined by the
// generated bwd_sm90_<dtype>_hdim<D>.cu files (sm_90a); sm90_bwd_instances.inc lists those built.
template <int kHeadDim, typename Element>
void run_bwd_sm90(const bwd::BwdArgs& args, cudaStream_t stream);
// Floats per row of the dQ workspace the kernel run_bwd_sm90 picks for these arguments needs: the
// bucket, or the warp-specialized kernel's padded staging pitch.
template <int kHeadDim, typename Element>
int bwd_sm90_dq_pitch(const bwd::BwdArgs& args);

}  // namespace tileattn::cuda::sm90
