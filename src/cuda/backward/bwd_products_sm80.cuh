// The five tile products of one backward step on mma.sync (sm80 and later): every operand read
// from shared memory through ldmatrix (plain, or transposed for the P^T / dS^T / Q^T / dO^T / K^T
// views), P and dS written back to shared memory as column pairs.  bwd_fa2_kernel.cuh calls these
// through the same interface as the wgmma version (src/cuda/sm90/bwd_products_sm90.cuh).
#pragma once

#include <cute/tensor.hpp>

#include "cuda/backward/bwd_fa2_gemm.cuh"
#include "cuda/backward/bwd_fa2_traits.h"
#include "cuda/cute_utils.h"

namespace tileattn::cuda::bwd {

template <typename Traits_>
struct Sm80Products {
  using Traits = Traits_;
  using Element = typename Traits::Element;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kHeadDim = Traits::kHeadDim;
  // mma.sync reads its operands through registers: no async-proxy fence is needed after writes
  // to shared memory.
  static constexpr bool kAsyncProxyOperands = false;

  char* smem;
  int tid;
  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmadKV mma_dkv;
  typename Traits::TiledMmadQ mma_dq;

  __device__ Sm80Products(char* smem_, int tid_) : smem(smem_), tid(tid_) {}

  template <typename Layout>
  __device__ auto tile(int offset, Layout layout) const {
    return cute::make_tensor(cute::make_smem_ptr(reinterpret_cast<Element*>(smem + offset)), layout);
  }

  // Accumulators (zeroed where a product overwrites them) and the (row, col) of their values.
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
    return acc_rowcol_layout(acc);
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

  // A (kBlockN, d) tile of 16-bit dK or dV -> shared memory at `offset` (the epilogue's staging).
  template <typename Frag>
  __device__ void store_dkv(Frag const& r, int offset) {
    auto copy = cute::make_tiled_copy_C(typename Traits::SmemCopyAtomPdS{}, mma_dkv);
    auto thr = copy.get_thread_slice(tid);
    cute::copy(copy, thr.retile_S(r), thr.partition_D(tile(offset, typename Traits::SmemLayoutKV{})));
  }

  // P and dS (16-bit register copies of S and dP's accumulators) -> shared memory.
  template <typename Frag>
  __device__ void store_p_ds(Frag const& rP, Frag const& rdS) {
    auto copy_pds = cute::make_tiled_copy_C(typename Traits::SmemCopyAtomPdS{}, mma_sdp);
    auto thr = copy_pds.get_thread_slice(tid);
    cute::copy(copy_pds, thr.retile_S(rP), thr.partition_D(tile(Traits::kOffsetP, typename Traits::SmemLayoutPdS{})));
    cute::copy(copy_pds, thr.retile_S(rdS), thr.partition_D(tile(Traits::kOffsetdS, typename Traits::SmemLayoutPdS{})));
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
