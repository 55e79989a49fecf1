// Host side of one (head-dim bucket, dtype): picks the kernel variant for the options in use,
// raises the shared-memory limit and launches over the (query tiles, batch, heads) grid.
// Included only by the generated fwd_<dtype>_hdim<D>.cu files (see CMakeLists.txt).
#pragma once

#include <cuda_runtime.h>

#include "cuda/check.h"
#include "cuda/smem_opt_in.h"
#include "cuda/fwd_kernel.h"
#include "cuda/kernel_traits.h"
#include "cuda/launch_api.h"

namespace tileattn::cuda {

template <typename Traits, typename ScorePolicy, typename DropoutPolicy>
void launch_fwd_variant(const FwdKernelArgs& args, cudaStream_t stream) {
  const ForwardParams& p = args.params;
  auto kernel = &fwd_kernel<Traits, ScorePolicy, DropoutPolicy>;
  constexpr int kSmem = Traits::kSmemBytes;
  if (kSmem > 48 * 1024) {
    static SmemOptIn opt_in;
    opt_in_smem(opt_in, kernel, kSmem, "cudaFuncSetAttribute(forward, max dynamic shared memory)");
  }
  const dim3 grid((p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM, p.batch, p.num_heads);
  kernel<<<grid, Traits::kNThreads, kSmem, stream>>>(args);
  check_cuda(cudaGetLastError(), "forward kernel launch");
}

template <int kHeadDim, typename Element>
int fwd_smem_bytes() {
  return FwdKernelTraits<kHeadDim, Element>::kSmemBytes;
}

// Three variants per bucket keep the build small: the common path (scores scaled inside exp2,
// no dropout), transformed scores (softcap / ALiBi / a negative scale), and the same with dropout.
template <int kHeadDim, typename Element>
void run_fwd(const FwdKernelArgs& args, const FwdVariant& variant, cudaStream_t stream) {
  using Traits = FwdKernelTraits<kHeadDim, Element>;
  if (variant.dropout) {
    launch_fwd_variant<Traits, ModifiedScores, PhiloxDropout>(args, stream);
  } else if (variant.transformed_scores) {
    launch_fwd_variant<Traits, ModifiedScores, NoDropout>(args, stream);
  } else {
    launch_fwd_variant<Traits, PlainScores, NoDropout>(args, stream);
  }
}

}  // namespace tileattn::cuda

// Explicit instantiation for one bucket, used by the generated translation units.
#define TILEATTN_INSTANTIATE_FWD(HEAD_DIM, ELEMENT)                                              \
  template void tileattn::cuda::run_fwd<HEAD_DIM, ELEMENT>(const tileattn::cuda::FwdKernelArgs&, \
                                                           const tileattn::cuda::FwdVariant&,   \
                                                           cudaStream_t);                       \
  template int tileattn::cuda::fwd_smem_bytes<HEAD_DIM, ELEMENT>();
