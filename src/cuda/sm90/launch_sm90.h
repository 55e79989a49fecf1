// Host side of one sm90 (head-dim bucket, dtype): builds the TMA descriptors for this call's
// tensors, the tile order, and launches one persistent CTA per SM.  Included only by the
// generated fwd_sm90_<dtype>_hdim<D>.cu files.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>

#include <cute/tensor.hpp>

#include "cuda/check.h"
#include "cuda/smem_opt_in.h"
#include "cuda/device_checks.h"  // sm_count
#include "cuda/mask_policy.h"
#include "cuda/sm90/fwd_kernel_sm90.h"
#include "cuda/sm90/gmem_view.h"
#include "cuda/sm90/kernel_traits_sm90.h"
#include "cuda/sm90/launch_api_sm90.h"
#include "cuda/sm90/sequence_bounds_sm90.h"

namespace tileattn::cuda::sm90 {

template <typename Traits, typename ScorePolicy, typename DropoutPolicy>
void launch_fwd_sm90_variant(const FwdKernelArgs& args, cudaStream_t stream) {
  using namespace cute;
  using Element = typename Traits::Element;
  using Rows = typename Traits::Rows;
  using BlockN = typename Traits::BlockN;
  using HeadDim = typename Traits::HeadDim;
  const ForwardParams& p = args.params;

  Sm90Params<Traits> prm;
  prm.args = args;
  // Varlen: one packed batch of total_q / total_k rows (sm90_supports checked they fit int32);
  // its batch stride is never used, only required to be a valid TMA stride.
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int q_rows = varlen ? static_cast<int>(p.total_q) : p.seqlen_q;
  const int kv_rows = varlen ? static_cast<int>(p.total_k) : p.seqlen_k;
  const int batch = varlen ? 1 : p.batch;
  auto batch_stride = [&](int64_t stride, int rows, int64_t row_stride) { return varlen ? rows * row_stride : stride; };
  prm.q_shape = make_shape(q_rows, p.head_dim, p.num_heads, batch);
  prm.kv_shape = make_shape(kv_rows, p.head_dim, p.num_heads_k, batch);
  auto q = gmem_view(static_cast<const Element*>(p.q), q_rows, p.head_dim, p.num_heads, batch,
                             p.q_row_stride, p.q_head_stride, batch_stride(p.q_batch_stride, q_rows, p.q_row_stride));
  auto k = gmem_view(static_cast<const Element*>(p.k), kv_rows, p.head_dim, p.num_heads_k, batch,
                             p.k_row_stride, p.k_head_stride, batch_stride(p.k_batch_stride, kv_rows, p.k_row_stride));
  auto v = gmem_view(static_cast<const Element*>(p.v), kv_rows, p.head_dim, p.num_heads_k, batch,
                             p.v_row_stride, p.v_head_stride, batch_stride(p.v_batch_stride, kv_rows, p.v_row_stride));
  auto o = gmem_view(static_cast<Element*>(p.out), q_rows, p.head_dim, p.num_heads, batch,
                             p.out_row_stride, p.out_head_stride,
                             batch_stride(p.out_batch_stride, q_rows, p.out_row_stride));
  prm.tma_q = make_tma_copy(SM90_TMA_LOAD{}, q, typename Traits::SmemLayoutQHalf{}, Shape<Rows, HeadDim>{}, _1{});
  prm.tma_k = make_tma_copy(SM90_TMA_LOAD{}, k, take<0, 2>(typename Traits::SmemLayoutKV{}),
                            Shape<BlockN, HeadDim>{}, _1{});
  prm.tma_v = make_tma_copy(SM90_TMA_LOAD{}, v, take<0, 2>(typename Traits::SmemLayoutKV{}),
                            Shape<BlockN, HeadDim>{}, _1{});
  prm.tma_o = make_tma_copy(SM90_TMA_STORE{}, o, typename Traits::SmemLayoutO{}, Shape<Rows, typename Traits::OCols>{},
                            _1{});

  const int num_m_blocks = (p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  const int64_t kv_bytes_per_head = 2ll * p.seqlen_k * p.head_dim * static_cast<int64_t>(sizeof(Element));
  // Causal or windowed tiles differ in length: the longest go first.
  const bool uneven = p.window_left >= 0 || p.window_right >= 0;
  const int grid = std::min(num_m_blocks * p.batch * p.num_heads, sm_count());
  prm.scheduler =
      TileScheduler::make(num_m_blocks, p.batch, p.num_heads, p.num_heads_k, kv_bytes_per_head, uneven, grid);

  auto kernel = &fwd_kernel_sm90<Traits, ScorePolicy, DropoutPolicy>;
  constexpr int kSmem = Traits::kSmemBytes;
  static SmemOptIn opt_in;
  opt_in_smem(opt_in, kernel, kSmem, "cudaFuncSetAttribute(sm90 forward, max dynamic shared memory)");
  kernel<<<grid, Traits::kThreads, kSmem, stream>>>(prm);
  check_cuda(cudaGetLastError(), "sm90 forward kernel launch");
}

template <int kHeadDim, typename Element>
int fwd_smem_bytes_sm90() {
  return Sm90Traits<kHeadDim, Element>::kSmemBytes;
}

// Eight kernels per bucket: plain scores (scale folded into exp2) and transformed scores (softcap,
// ALiBi, a negative scale), each with and without dropout, and each of those with and without
// sequence bounds inside the tensors (varlen, seqused_k; sequence_bounds_sm90.h).  Dropout with
// plain scores has its own kernel: through the transformed one it spilled (ptxas at d64: 1076
// bytes a thread against 8 for plain scores).
template <int kHeadDim, typename Element>
void run_fwd_sm90(const FwdKernelArgs& args, const FwdVariant& variant, cudaStream_t stream) {
  using Traits = Sm90Traits<kHeadDim, Element>;
  using BoundsTraits = SequenceBoundsTraits<Traits>;
  const ForwardParams& p = args.params;
  const bool bounds = p.cu_seqlens_q != nullptr || p.seqused_k != nullptr;
  const auto launch = [&](auto scores, auto dropout) {
    using Scores = decltype(scores);
    using Dropout = decltype(dropout);
    bounds ? launch_fwd_sm90_variant<BoundsTraits, Scores, Dropout>(args, stream)
           : launch_fwd_sm90_variant<Traits, Scores, Dropout>(args, stream);
  };
  if (variant.transformed_scores) {
    variant.dropout ? launch(ModifiedScores{}, PhiloxDropout{}) : launch(ModifiedScores{}, NoDropout{});
  } else {
    variant.dropout ? launch(PlainScores{}, PhiloxDropout{}) : launch(PlainScores{}, NoDropout{});
  }
}

}  // namespace tileattn::cuda::sm90

#define TILEATTN_INSTANTIATE_FWD_SM90(HEAD_DIM, ELEMENT)                                                     \
  template void tileattn::cuda::sm90::run_fwd_sm90<HEAD_DIM, ELEMENT>(const tileattn::cuda::FwdKernelArgs&, \
                                                                      const tileattn::cuda::FwdVariant&,   \
                                                                      cudaStream_t);                       \
  template int tileattn::cuda::sm90::fwd_smem_bytes_sm90<HEAD_DIM, ELEMENT>();
