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
#include "cuda/backward/bwd_products_common.cuh"
#include "cuda/cute_utils.h"
#include "cuda/sm90/bwd_traits_sm90.h"
#include "cuda/sm90/softmax_sm90.h"  // gmma_acc_rowcol_layout
#include "cuda/sm90/wgmma_gemm.h"

namespace tileattn::cuda::sm90 {

template <typename Traits_>
struct Sm90Products : bwd::BwdProductsBase<Traits_> {
  using Base = bwd::BwdProductsBase<Traits_>;
  using typename Base::Element;
  using typename Base::Traits;
  using Base::mma_dkv;
  using Base::mma_dq;
  using Base::mma_sdp;
  using Base::tid;
  using Base::tile;
  static constexpr bool kAsyncProxyOperands = true;

  __device__ Sm90Products(char* smem, int tid) : Base(smem, tid) {}

  template <typename Layout>
  __device__ static auto rowcol(Layout acc) {
    return gmma_acc_rowcol_layout(acc);
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
