// What the two sets of backward tile products (bwd_products_sm80.cuh: mma.sync;
// src/cuda/sm90/bwd_products_sm90.cuh: wgmma) share: the thread's tiled MMAs, views of the
// shared-memory tiles, the accumulators and their partitions, and the stores of 16-bit register
// tiles (P, dS, and the epilogue's dK, dV) into shared memory as column pairs.  A policy derives
// from it and adds rowcol(), kAsyncProxyOperands, scores() and key_and_query_grads().
#pragma once

#include <cute/tensor.hpp>

namespace tileattn::cuda::bwd {

template <typename Traits_>
struct BwdProductsBase {
  using Traits = Traits_;
  using Element = typename Traits::Element;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kHeadDim = Traits::kHeadDim;

  char* smem;
  int tid;
  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmadKV mma_dkv;
  typename Traits::TiledMmadQ mma_dq;

  __device__ BwdProductsBase(char* smem_, int tid_) : smem(smem_), tid(tid_) {}

  template <typename Layout>
  __device__ auto tile(int offset, Layout layout) const {
    return cute::make_tensor(cute::make_smem_ptr(reinterpret_cast<Element*>(smem + offset)), layout);
  }

  // Accumulators (each product zeroes or accumulates as it says) and partitions of (row, col)
  // tensors in the same layouts.
  __device__ auto acc_sdp() const {
    return cute::partition_fragment_C(mma_sdp, cute::Shape<cute::Int<kBlockM>, cute::Int<kBlockN>>{});
  }
  __device__ auto acc_dkv() const {
    return cute::partition_fragment_C(mma_dkv, cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>>{});
  }
  __device__ auto acc_dq() const {
    return cute::partition_fragment_C(mma_dq, cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>>{});
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

  // P and dS (16-bit copies of S and dP's accumulators) -> shared memory; the kernel then fences
  // (for wgmma) and syncs the CTA.
  template <typename Frag>
  __device__ void store_p_ds(Frag const& rP, Frag const& rdS) {
    auto copy_pds = cute::make_tiled_copy_C(typename Traits::SmemCopyAtomPdS{}, mma_sdp);
    auto thr = copy_pds.get_thread_slice(tid);
    cute::copy(copy_pds, thr.retile_S(rP), thr.partition_D(tile(Traits::kOffsetP, typename Traits::SmemLayoutPdS{})));
    cute::copy(copy_pds, thr.retile_S(rdS), thr.partition_D(tile(Traits::kOffsetdS, typename Traits::SmemLayoutPdS{})));
  }

  // A (kBlockN, d) tile of 16-bit dK or dV -> shared memory at `offset` (the epilogue's staging).
  template <typename Frag>
  __device__ void store_dkv(Frag const& r, int offset) {
    auto copy = cute::make_tiled_copy_C(typename Traits::SmemCopyAtomPdS{}, mma_dkv);
    auto thr = copy.get_thread_slice(tid);
    cute::copy(copy, thr.retile_S(r), thr.partition_D(tile(offset, typename Traits::SmemLayoutKV{})));
  }
};

}  // namespace tileattn::cuda::bwd
