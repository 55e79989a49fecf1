// The launcher of the register-level backward kernel (bwd_fa2_kernel.cuh) for one Products
// policy, included by the per-instance files: bwd_fa2_hdim*_*.cu (mma.sync) and the generated
// sm_90a ones (src/cuda/sm90/bwd_sm90_instance.cu.in, wgmma).
#pragma once

#include "cuda/backward/bwd_fa2_kernel.cuh"
#include "cuda/backward/bwd_launch.h"
#include "cuda/backward/bwd_products_sm80.cuh"
#include "cuda/check.h"
#include "cuda/smem_opt_in.h"

namespace tileattn::cuda::bwd {

template <typename Products, bool kTransforms, bool kDropout>
void launch_bwd_main(const BwdArgs& args, cudaStream_t stream) {
  using Traits = typename Products::Traits;
  const tileattn_fwd_params& f = args.p.fwd;
  auto kernel = fa2_bwd_kernel<Products, kTransforms, kDropout>;
  // Above 48 KB a kernel must opt in, on each device it runs on.
  static SmemOptIn opt_in;
  opt_in_smem(opt_in, kernel, Traits::kSmemBytes, "fa2_bwd_kernel smem opt-in");
  const dim3 grid((f.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN, f.batch, f.num_heads);
  kernel<<<grid, Traits::kNThreads, Traits::kSmemBytes, stream>>>(args);
  check_cuda(cudaGetLastError(), "fa2_bwd_kernel");
}

template <typename Products>
void run_bwd_main(const BwdArgs& args, cudaStream_t stream) {
  const tileattn_fwd_params& f = args.p.fwd;
  if (f.seqlen_k == 0) return;
  const bool transforms = f.softcap > 0.0f || f.alibi_slopes != nullptr;
  const bool dropout = f.dropout_p > 0.0f;
  if (dropout) {
    if (transforms) launch_bwd_main<Products, true, true>(args, stream);
    else launch_bwd_main<Products, false, true>(args, stream);
  } else {
    if (transforms) launch_bwd_main<Products, true, false>(args, stream);
    else launch_bwd_main<Products, false, false>(args, stream);
  }
}

template <int kHeadDim, typename Element>
void run_fa2_bwd(const BwdArgs& args, cudaStream_t stream) {
  run_bwd_main<Sm80Products<Fa2BwdTraits<kHeadDim, Element>>>(args, stream);
}

#define TILEATTN_INSTANTIATE_FA2_BWD(kHeadDim, Element) \
  template void run_fa2_bwd<kHeadDim, Element>(const BwdArgs&, cudaStream_t);

}  // namespace tileattn::cuda::bwd
