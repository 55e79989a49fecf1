// Definitions of the launchers in bwd_launch.h, included by the per-dtype instantiation files.
#pragma once

#include "cuda/backward/bwd_kernels.cuh"
#include "cuda/backward/bwd_launch.h"
#include "cuda/check.h"
#include "cuda/smem_opt_in.h"

namespace tileattn::cuda::bwd {

inline unsigned ceil_div(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

// `opt_in` is the kernel's own record (a static beside each call): the main and dQ kernels share
// one function-pointer type, so a static in here would serve both.
template <typename Kernel>
void launch_with_smem(Kernel kernel, SmemOptIn& opt_in, dim3 grid, int threads, size_t smem, const BwdArgs& args,
                      cudaStream_t stream, const char* name) {
  opt_in_smem(opt_in, kernel, static_cast<int>(smem), name);
  kernel<<<grid, threads, smem, stream>>>(args);
  check_cuda(cudaGetLastError(), name);
}

template <int kHeadDim, typename Element>
void run_bwd_tiles(const BwdArgs& args, cudaStream_t stream) {
  using C = BwdConfig<kHeadDim>;
  using L = BwdSmem<kHeadDim>;
  const tileattn_fwd_params& f = args.p.fwd;
  const dim3 key_blocks(ceil_div(f.seqlen_k, C::kBlockN), f.batch, f.num_heads);
  if (key_blocks.x > 0) {
    static SmemOptIn main_opt_in;
    launch_with_smem(bwd_main_kernel<kHeadDim, Element>, main_opt_in, key_blocks, C::kThreads, L::bytes, args,
                     stream, "bwd_main_kernel");
  }
  if (args.deterministic && f.seqlen_q > 0) {
    const dim3 query_blocks(ceil_div(f.seqlen_q, C::kBlockM), f.batch, f.num_heads);
    static SmemOptIn dq_opt_in;
    launch_with_smem(bwd_dq_kernel<kHeadDim, Element>, dq_opt_in, query_blocks, C::kThreads, L::bytes, args,
                     stream, "bwd_dq_kernel");
  }
}

template <typename Element>
void run_bwd_delta(const BwdArgs& args, cudaStream_t stream) {
  const tileattn_fwd_params& f = args.p.fwd;
  if (f.seqlen_q == 0) return;
  const dim3 grid(ceil_div(f.seqlen_q, rows_per_row_block(f.head_dim)), f.batch, f.num_heads);
  bwd_delta_kernel<Element><<<grid, kRowKernelThreads, 0, stream>>>(args);
  check_cuda(cudaGetLastError(), "bwd_delta_kernel");
}

template <typename Element>
void run_bwd_finish(const BwdArgs& args, cudaStream_t stream) {
  const tileattn_fwd_params& f = args.p.fwd;
  if (args.dq_accum != nullptr && f.seqlen_q > 0) {
    const dim3 grid(ceil_div(f.seqlen_q, rows_per_row_block(f.head_dim)), f.batch, f.num_heads);
    bwd_finish_dq_kernel<Element><<<grid, kRowKernelThreads, 0, stream>>>(args);
    check_cuda(cudaGetLastError(), "bwd_finish_dq_kernel");
  }
  if (args.dk_expanded != nullptr && f.seqlen_k > 0) {
    const dim3 grid(ceil_div(f.seqlen_k, kRowsPerWarpKernel), f.batch, f.num_heads_k);
    bwd_finish_dkdv_kernel<Element><<<grid, kRowsPerWarpKernel * 32, 0, stream>>>(args);
    check_cuda(cudaGetLastError(), "bwd_finish_dkdv_kernel");
  }
}

// One dtype's instantiations: every bucket plus the dtype-only kernels.
#define TILEATTN_INSTANTIATE_BWD(Element)                                           \
  template void run_bwd_tiles<64, Element>(const BwdArgs&, cudaStream_t);          \
  template void run_bwd_tiles<128, Element>(const BwdArgs&, cudaStream_t);         \
  template void run_bwd_tiles<256, Element>(const BwdArgs&, cudaStream_t);         \
  template void run_bwd_delta<Element>(const BwdArgs&, cudaStream_t);              \
  template void run_bwd_finish<Element>(const BwdArgs&, cudaStream_t);

}  // namespace tileattn::cuda::bwd
