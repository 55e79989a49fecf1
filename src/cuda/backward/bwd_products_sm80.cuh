// The five tile products of one backward step on mma.sync (sm80 and later): every operand read
// from shared memory through ldmatrix (plain, or transposed for the P^T / dS^T / Q^T / dO^T / K^T
// views), P and dS written back to shared memory as column pairs.  bwd_fa2_kernel.cuh calls these
// through the same interface as the wgmma version (src/cuda/sm90/bwd_products_sm90.cuh).
#pragma once

#include <cute/tensor.hpp>

#include "cuda/backward/bwd_fa2_gemm.cuh"
#include "cuda/backward/bwd_fa2_traits.h"
#include "cuda/backward/bwd_products_common.cuh"
#include "cuda/cute_utils.h"

namespace tileattn::cuda::bwd {

template <typename Traits_>
struct Sm80Products : BwdProductsBase<Traits_> {
  using Base = BwdProductsBase<Traits_>;
  using typename Base::Element;
  using typename Base::Traits;
  using Base::mma_dkv;
  using Base::mma_dq;
  using Base::mma_sdp;
  using Base::tid;
  using Base::tile;
  // mma.sync reads its operands through registers: no async-proxy fence after smem writes.
  static constexpr bool kAsyncProxyOperands = false;

  __device__ Sm80Products(char* smem, int tid) : Base(smem, tid) {}

  template <typename Layout>
  __device__ static auto rowcol(Layout acc) {
    return acc_rowcol_layout(acc);
  }

  // S = Q K^T and dP = dO V^T for the query block in `stage`.
  template <typename Acc>
  __device__ void scores(Acc& acc_s, Acc& acc_dp, int stage) {
    using namespace cute;
    auto copy_a = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, mma_sdp);
    auto copy_b = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, mma_sdp);
    auto thr = mma_sdp.get_thread_slice(tid);
    Tensor sQ = tile(Traits::kOffsetQ + stage * Traits::kQBytes, typename Traits::SmemLayoutQ{});
    Tensor sdO = tile(Traits::kOffsetdO + stage * Traits::kQBytes, typename Traits::SmemLayoutQ{});
    Tensor sK = tile(Traits::kOffsetK, typename Traits::SmemLayoutKV{});
    Tensor sV = tile(Traits::kOffsetV, typename Traits::SmemLayoutKV{});
    Tensor rA = thr.partition_fragment_A(sQ);
    Tensor rB = thr.partition_fragment_B(sK);
    clear(acc_s);
    clear(acc_dp);
    gemm_smem(mma_sdp, acc_s, rA, rB, copy_a.get_thread_slice(tid).partition_S(sQ),
              copy_b.get_thread_slice(tid).partition_S(sK), copy_a, copy_b);
    gemm_smem(mma_sdp, acc_dp, rA, rB, copy_a.get_thread_slice(tid).partition_S(sdO),
              copy_b.get_thread_slice(tid).partition_S(sV), copy_a, copy_b);
  }

  // dV += P^T dO, dK += dS^T Q (accumulating), and dQ = dS K (overwritten), then use_dq(acc_dq).
  template <typename AccKV, typename AccQ, typename UseDq>
  __device__ void key_and_query_grads(AccKV& acc_dv, AccKV& acc_dk, AccQ& acc_dq, int stage, UseDq&& use_dq) {
    using namespace cute;
    auto copy_a_dkv = make_tiled_copy_A(typename Traits::SmemCopyAtomTransposed{}, mma_dkv);
    auto copy_b_dkv = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, mma_dkv);
    auto copy_a_dq = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, mma_dq);
    auto copy_b_dq = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, mma_dq);
    auto thr_dkv = mma_dkv.get_thread_slice(tid);
    auto thr_dq = mma_dq.get_thread_slice(tid);
    Tensor rPt = thr_dkv.partition_fragment_A(tile(Traits::kOffsetP, typename Traits::SmemLayoutPdStNoSwizzle{}));
    Tensor rQt = thr_dkv.partition_fragment_B(tile(Traits::kOffsetQ, typename Traits::SmemLayoutQtNoSwizzle{}));
    auto sQt = [&](int offset) { return tile(offset + stage * Traits::kQBytes, typename Traits::SmemLayoutQt{}); };
    auto part_a_dkv = copy_a_dkv.get_thread_slice(tid);
    auto part_b_dkv = copy_b_dkv.get_thread_slice(tid);
    gemm_smem(mma_dkv, acc_dv, rPt, rQt, part_a_dkv.partition_S(tile(Traits::kOffsetP, typename Traits::SmemLayoutPdSt{})),
              part_b_dkv.partition_S(sQt(Traits::kOffsetdO)), copy_a_dkv, copy_b_dkv);
    gemm_smem(mma_dkv, acc_dk, rPt, rQt, part_a_dkv.partition_S(tile(Traits::kOffsetdS, typename Traits::SmemLayoutPdSt{})),
              part_b_dkv.partition_S(sQt(Traits::kOffsetQ)), copy_a_dkv, copy_b_dkv);

    Tensor sdS = tile(Traits::kOffsetdS, typename Traits::SmemLayoutPdS{});
    Tensor rdS = thr_dq.partition_fragment_A(sdS);
    Tensor rKt = thr_dq.partition_fragment_B(tile(Traits::kOffsetK, typename Traits::SmemLayoutKtNoSwizzle{}));
    clear(acc_dq);
    gemm_smem(mma_dq, acc_dq, rdS, rKt, copy_a_dq.get_thread_slice(tid).partition_S(sdS),
              copy_b_dq.get_thread_slice(tid).partition_S(tile(Traits::kOffsetK, typename Traits::SmemLayoutKt{})),
              copy_a_dq, copy_b_dq);
    use_dq(acc_dq);
  }
};

}  // namespace tileattn::cuda::bwd
