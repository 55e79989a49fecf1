// The five tile products of one backward step on Hopper's wgmma: both operands read from shared
// memory by the tensor cores through descriptors (no ldmatrix, no operand registers), which is
// what limited the mma.sync version on the H200 (ncu: L1 71% busy, tensor pipe 42%).  The same
// interface as bwd_products_sm80.cuh; the kernel (bwd_fa2_kernel.cuh) fences its shared-memory
// writes for the async proxy because kAsyncProxyOperands is set.
//
// Each call issues its wgmma groups and waits for them, so the elementwise work between products
// is not overlapped within a warpgroup (a warp-specialized pipeline would be the next step).
#pragma once

#include <cute/tensor.hpp>

#include "cuda/backward/bwd_fa2_traits.h"
#include "cuda/cute_utils.h"
#include "cuda/sm90/bwd_traits_sm90.h"
#include "cuda/sm90/softmax_sm90.h"  // gmma_acc_rowcol_layout
#include "cuda/sm90/wgmma_gemm.h"

namespace tileattn::cuda::sm90 {

template <typename Traits_>
struct Sm90Products {
  using Traits = Traits_;
  using Element = typename Traits::Element;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr bool kAsyncProxyOperands = true;

  char* smem;
  int tid;
  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmadKV mma_dkv;
  typename Traits::TiledMmadQ mma_dq;

  __device__ Sm90Products(char* smem_, int tid_) : smem(smem_), tid(tid_) {}

  template <typename Layout>
  __device__ auto tile(int offset, Layout layout) const {
    return cute::make_tensor(cute::make_smem_ptr(reinterpret_cast<Element*>(smem + offset)), layout);
  }

  __device__ auto acc_sdp() const {
    return cute::partition_fragment_C(mma_sdp, cute::Shape<cute::Int<kBlockM>, cute::Int<kBlockN>>{});
  }
  __device__ auto acc_dkv() const {
    return cute::partition_fragment_C(mma_dkv, cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>>{});
  }
  __device__ auto acc_dq() const {
    return cute::partition_fragment_C(mma_dq, cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>>{});
  }
  template <typename Layout>
  __device__ static auto rowcol(Layout acc) {
    return gmma_acc_rowcol_layout(acc);
  }
  template <typename Tensor>
  __device__ auto partition_sdp(Tensor const& t) const {
    return mma_sdp.get_thread_slice(tid).partition_C(t);
  }
  template <typename Tensor>
  __device__ auto partition_dkv(Tensor const& t) const {
    return mma_dkv.get_thread_slice(tid).partition_C(t);
  }
  template <typename Tensor>
  __device__ auto partition_dq(Tensor const& t) const {
    return mma_dq.get_thread_slice(tid).partition_C(t);
  }

  // S = Q K^T and dP = dO V^T, two wgmma groups in flight together.
  template <typename Acc>
  __device__ void scores(Acc& acc_s, Acc& acc_dp, int stage) {
    using namespace cute;
    auto thr = mma_sdp.get_thread_slice(tid);
    const int q_stage = stage * Traits::kQBytes;
    Tensor rQ = thr.partition_fragment_A(tile(Traits::kOffsetQ + q_stage, typename Traits::GmmaQ{}));
    Tensor rdO = thr.partition_fragment_A(tile(Traits::kOffsetdO + q_stage, typename Traits::GmmaQ{}));
    Tensor rK = thr.partition_fragment_B(tile(Traits::kOffsetK, typename Traits::GmmaKV{}));
    Tensor rV = thr.partition_fragment_B(tile(Traits::kOffsetV, typename Traits::GmmaKV{}));
    wgmma_issue<true>(mma_sdp, rQ, rK, acc_s);
    wgmma_issue<true>(mma_sdp, rdO, rV, acc_dp);
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_s);
    warpgroup_fence_operand(acc_dp);
  }

  // A (kBlockN, d) tile of 16-bit dK or dV -> shared memory at `offset` (the epilogue's staging).
  template <typename Frag>
  __device__ void store_dkv(Frag const& r, int offset) {
    auto copy = cute::make_tiled_copy_C(typename Traits::SmemCopyAtomPdS{}, mma_dkv);
    auto thr = copy.get_thread_slice(tid);
    cute::copy(copy, thr.retile_S(r), thr.partition_D(tile(offset, typename Traits::SmemLayoutKV{})));
  }

  // P and dS -> shared memory as column pairs (the kernel then fences and syncs the CTA).
  template <typename Frag>
  __device__ void store_p_ds(Frag const& rP, Frag const& rdS) {
    auto copy_pds = cute::make_tiled_copy_C(typename Traits::SmemCopyAtomPdS{}, mma_sdp);
    auto thr = copy_pds.get_thread_slice(tid);
    cute::copy(copy_pds, thr.retile_S(rP), thr.partition_D(tile(Traits::kOffsetP, typename Traits::SmemLayoutPdS{})));
    cute::copy(copy_pds, thr.retile_S(rdS), thr.partition_D(tile(Traits::kOffsetdS, typename Traits::SmemLayoutPdS{})));
  }

  // dQ = dS K, dV += P^T dO, dK += dS^T Q: three wgmma groups, dQ's first, so use_dq(acc_dq)
  // (the dQ atomics, bound by the load/store unit) runs while the tensor cores do dV and dK.
  template <typename AccKV, typename AccQ, typename UseDq>
  __device__ void key_and_query_grads(AccKV& acc_dv, AccKV& acc_dk, AccQ& acc_dq, int stage, UseDq&& use_dq) {
    using namespace cute;
    auto thr_dkv = mma_dkv.get_thread_slice(tid);
    auto thr_dq = mma_dq.get_thread_slice(tid);
    const int q_stage = stage * Traits::kQBytes;
    Tensor rPt = thr_dkv.partition_fragment_A(tile(Traits::kOffsetP, typename Traits::GmmaPdSt{}));
    Tensor rdSt = thr_dkv.partition_fragment_A(tile(Traits::kOffsetdS, typename Traits::GmmaPdSt{}));
    Tensor rdOt = thr_dkv.partition_fragment_B(tile(Traits::kOffsetdO + q_stage, typename Traits::GmmaQt{}));
    Tensor rQt = thr_dkv.partition_fragment_B(tile(Traits::kOffsetQ + q_stage, typename Traits::GmmaQt{}));
    Tensor rdS = thr_dq.partition_fragment_A(tile(Traits::kOffsetdS, typename Traits::GmmaPdS{}));
    Tensor rKt = thr_dq.partition_fragment_B(tile(Traits::kOffsetK, typename Traits::GmmaKt{}));
    wgmma_issue<true>(mma_dq, rdS, rKt, acc_dq);
    wgmma_issue<false>(mma_dkv, rPt, rdOt, acc_dv);
    wgmma_issue<false>(mma_dkv, rdSt, rQt, acc_dk);
    warpgroup_wait<2>();
    warpgroup_fence_operand(acc_dq);
    use_dq(acc_dq);
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_dv);
    warpgroup_fence_operand(acc_dk);
  }
};

}  // namespace tileattn::cuda::sm90
