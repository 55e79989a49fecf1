// The forward mainloop of one CTA: one query tile against its key blocks, from the last block down
// (FA2, Algorithm 1 lines 6-13).  Per key block n:
//   wait for K(n); start loading V(n)        -- overlaps the QK^T MMAs below
//   S = Q K(n)^T                              -- ldmatrix + mma.sync, Q and K from smem
//   score transform; mask (masked blocks only)
//   wait for V(n); start loading K(n-1)       -- overlaps the softmax and the PV MMAs below
//   online softmax update, dropout
//   O += P V(n)                               -- P reused from registers as the A operand
// so one K and one V buffer give a two-deep cp.async pipeline in which every load has a full
// GEMM to hide behind (FA2 change 4).
#pragma once

#include <cute/tensor.hpp>

#include "cuda/cute_utils.h"
#include "cuda/mask_policy.h"

namespace tileattn::cuda {

// Where the mainloop reads from: pointers at row 0 of this CTA's query tile and of this head's keys.
template <typename Element>
struct MainloopInputs {
  const Element* q;  // row m0 of the sequence, this head
  const Element* k;  // row 0 of the sequence, this KV head
  const Element* v;
  int64_t q_row_stride, k_row_stride, v_row_stride;
  int q_rows;  // valid query rows in this tile (seqlen_q - m0, may exceed kBlockM)
  int seqlen_k;
  int head_dim;
  int m0;  // first query row of the tile, within the sequence
};

// acc += A B^T over the K mode, both operands from smem, with the next k-slice's ldmatrix issued
// before the current slice's MMAs.
template <typename TiledMma, typename TensorAcc, typename TensorA, typename TensorB,
          typename TensorSA, typename TensorSB, typename CopyA, typename CopyB, typename ThrCopyA,
          typename ThrCopyB>
__device__ __forceinline__ void gemm_smem_smem(TiledMma const& tiled_mma, TensorAcc& acc, TensorA& tCrA,
                                               TensorB& tCrB, TensorSA const& tCsA, TensorSB const& tCsB,
                                               CopyA const& copy_a, CopyB const& copy_b,
                                               ThrCopyA const& thr_copy_a, ThrCopyB const& thr_copy_b) {
  auto tCrA_view = thr_copy_a.retile_D(tCrA);
  auto tCrB_view = thr_copy_b.retile_D(tCrB);
  cute::copy(copy_a, tCsA(cute::_, cute::_, cute::_0{}), tCrA_view(cute::_, cute::_, cute::_0{}));
  cute::copy(copy_b, tCsB(cute::_, cute::_, cute::_0{}), tCrB_view(cute::_, cute::_, cute::_0{}));
  CUTE_UNROLL
  for (int i = 0; i < cute::size<2>(tCrA); ++i) {
    if (i + 1 < cute::size<2>(tCrA)) {
      cute::copy(copy_a, tCsA(cute::_, cute::_, i + 1), tCrA_view(cute::_, cute::_, i + 1));
      cute::copy(copy_b, tCsB(cute::_, cute::_, i + 1), tCrB_view(cute::_, cute::_, i + 1));
    }
    cute::gemm(tiled_mma, tCrA(cute::_, cute::_, i), tCrB(cute::_, cute::_, i), acc);
  }
}

// acc += A B^T with A already in registers (the probabilities P) and B from smem.
template <typename TiledMma, typename TensorAcc, typename TensorA, typename TensorB, typename TensorSB,
          typename CopyB, typename ThrCopyB>
__device__ __forceinline__ void gemm_reg_smem(TiledMma const& tiled_mma, TensorAcc& acc, TensorA const& tCrA,
                                              TensorB& tCrB, TensorSB const& tCsB, CopyB const& copy_b,
                                              ThrCopyB const& thr_copy_b) {
  auto tCrB_view = thr_copy_b.retile_D(tCrB);
  cute::copy(copy_b, tCsB(cute::_, cute::_, cute::_0{}), tCrB_view(cute::_, cute::_, cute::_0{}));
  CUTE_UNROLL
  for (int i = 0; i < cute::size<2>(tCrA); ++i) {
    if (i + 1 < cute::size<2>(tCrA)) {
      cute::copy(copy_b, tCsB(cute::_, cute::_, i + 1), tCrB_view(cute::_, cute::_, i + 1));
    }
    cute::gemm(tiled_mma, tCrA(cute::_, cute::_, i), tCrB(cute::_, cute::_, i), acc);
  }
}

// Runs the key blocks of `range` and leaves the unnormalized O in acc_o and the row statistics in
// softmax.  smem holds Q, then K, then V (Traits::kSmemBytes).
template <typename Traits, typename TensorO, typename Softmax, typename ScorePolicy, typename DropoutPolicy>
__device__ __forceinline__ void fwd_mainloop(MainloopInputs<typename Traits::Element> const& in,
                                             KeyBlockRange const& range, char* smem, TensorO& acc_o,
                                             Softmax& softmax, VisibilityMask const& mask,
                                             ScorePolicy const& score_policy,
                                             DropoutPolicy const& dropout) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  const int tid = threadIdx.x;

  Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem)), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(sQ.data() + size(sQ), typename Traits::SmemLayoutKV{});
  Tensor sV = make_tensor(sK.data() + size(sK), typename Traits::SmemLayoutKV{});
  Tensor sVt = make_tensor(sV.data(), typename Traits::SmemLayoutVt{});
  Tensor sVtNoSwizzle = make_tensor(sV.data(), typename Traits::SmemLayoutVtNoSwizzle{});

  Tensor gQ = make_tensor(make_gmem_ptr(in.q),
                          make_layout(Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_stride(in.q_row_stride, _1{})));
  // (kBlockN, kHeadDim, block index): block n starts at key row n * kBlockN.
  const int num_blocks = range.n_block_max;
  Tensor gK = make_tensor(make_gmem_ptr(in.k),
                          make_layout(make_shape(Int<kBlockN>{}, Int<kHeadDim>{}, num_blocks),
                                      make_stride(in.k_row_stride, _1{}, in.k_row_stride * kBlockN)));
  Tensor gV = make_tensor(make_gmem_ptr(in.v),
                          make_layout(make_shape(Int<kBlockN>{}, Int<kHeadDim>{}, num_blocks),
                                      make_stride(in.v_row_stride, _1{}, in.v_row_stride * kBlockN)));

  // global -> smem (cp.async), with (row, col) coordinates for the bounds predicates.
  typename Traits::GmemTiledCopyQKV gmem_tiled_copy;
  auto gmem_thr_copy = gmem_tiled_copy.get_thread_slice(tid);
  Tensor tQgQ = gmem_thr_copy.partition_S(gQ);
  Tensor tQsQ = gmem_thr_copy.partition_D(sQ);
  Tensor tKgK = gmem_thr_copy.partition_S(gK);
  Tensor tKsK = gmem_thr_copy.partition_D(sK);
  Tensor tVgV = gmem_thr_copy.partition_S(gV);
  Tensor tVsV = gmem_thr_copy.partition_D(sV);
  Tensor tQcQ = gmem_thr_copy.partition_S(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  Tensor tKVcKV = gmem_thr_copy.partition_S(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  // Head dims below the bucket: the extra columns are zero-filled, so they add 0 to Q K^T.
  Tensor tQpCol = make_tensor<bool>(make_shape(size<2>(tQsQ)));
  Tensor tKVpCol = make_tensor<bool>(make_shape(size<2>(tKsK)));
  CUTE_UNROLL
  for (int k = 0; k < size(tQpCol); ++k) tQpCol(k) = get<1>(tQcQ(0, 0, k)) < in.head_dim;
  CUTE_UNROLL
  for (int k = 0; k < size(tKVpCol); ++k) tKVpCol(k) = get<1>(tKVcKV(0, 0, k)) < in.head_dim;

  // smem -> registers (ldmatrix) and the MMA fragments.
  typename Traits::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(tid);
  Tensor tSrQ = thr_mma.partition_fragment_A(sQ);
  Tensor tSrK = thr_mma.partition_fragment_B(sK);
  Tensor tOrVt = thr_mma.partition_fragment_B(sVtNoSwizzle);
  auto smem_tiled_copy_Q = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_thr_copy_Q = smem_tiled_copy_Q.get_thread_slice(tid);
  Tensor tSsQ = smem_thr_copy_Q.partition_S(sQ);
  auto smem_tiled_copy_K = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto smem_thr_copy_K = smem_tiled_copy_K.get_thread_slice(tid);
  Tensor tSsK = smem_thr_copy_K.partition_S(sK);
  auto smem_tiled_copy_V = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, tiled_mma);
  auto smem_thr_copy_V = smem_tiled_copy_V.get_thread_slice(tid);
  Tensor tOsVt = smem_thr_copy_V.partition_S(sVt);

  // Tile-local (row, col) of every score this thread holds, as a (rows, cols) view.
  Tensor tScS = thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
  Tensor coords = make_tensor(tScS.data(), acc_rowcol_layout(tScS.layout()));
  Tensor acc_o_rows = make_tensor(acc_o.data(), acc_rowcol_layout(acc_o.layout()));

  // Prologue: Q and the last key block (the only one that can be ragged, so rows are checked).
  int n_block = range.n_block_max - 1;
  copy_tile_predicated<true>(gmem_tiled_copy, tQgQ, tQsQ, tQcQ, tQpCol, in.q_rows);
  copy_tile_predicated<true>(gmem_tiled_copy, tKgK(_, _, _, n_block), tKsK, tKVcKV, tKVpCol,
                             in.seqlen_k - n_block * kBlockN);
  cp_async_fence();

  // always_inline: a lambda the compiler outlines takes acc_o by reference and forces the whole
  // accumulator to local memory (seen: a 2.4 KB stack frame per thread).
  auto process_block = [&](auto masked_tag, int n) __attribute__((always_inline)) {
    constexpr bool kMasked = decltype(masked_tag)::value;
    const int n0 = n * kBlockN;
    Tensor acc_s = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
    clear(acc_s);
    cp_async_wait<0>();
    __syncthreads();  // K(n) visible to all warps; all warps are done reading V(n+1)
    // Only masked blocks can hold rows past seqlen_k (the ragged last block is always masked).
    copy_tile_predicated<kMasked>(gmem_tiled_copy, tVgV(_, _, _, n), tVsV, tKVcKV, tKVpCol,
                                  in.seqlen_k - n0);
    cp_async_fence();

    // S = Q K^T
    gemm_smem_smem(tiled_mma, acc_s, tSrQ, tSrK, tSsQ, tSsK, smem_tiled_copy_Q, smem_tiled_copy_K,
                   smem_thr_copy_Q, smem_thr_copy_K);
    Tensor scores = make_tensor(acc_s.data(), acc_rowcol_layout(acc_s.layout()));
    score_policy.apply(scores, coords, in.m0, n0);
    if constexpr (kMasked) mask.apply(scores, coords, in.m0, n0);

    cp_async_wait<0>();
    __syncthreads();  // V(n) visible; all warps are done reading K(n)
    if (n > range.n_block_min) {
      copy_tile_predicated<false>(gmem_tiled_copy, tKgK(_, _, _, n - 1), tKsK, tKVcKV, tKVpCol, 0);
      cp_async_fence();
    }

    // P = exp2(S scale_log2 - m), with O and the row sums rescaled to the new row max.
    softmax.update(scores, acc_o_rows);
    dropout.apply(scores, coords, in.m0, n0);

    // O += P V, P converted to the input type and kept in registers.
    Tensor rP = convert_fragment<Element>(acc_s);
    Tensor tOrP = make_tensor(rP.data(), acc_as_operand_a_layout(rP.layout()));
    gemm_reg_smem(tiled_mma, acc_o, tOrP, tOrVt, tOsVt, smem_tiled_copy_V, smem_thr_copy_V);
  };

  // Masked blocks sit at both ends of the range (the diagonal / ragged end on the right, the
  // sliding window's edge on the left); the clean middle runs without any mask code.
#ifdef TILEATTN_FWD_MASK_ALL_BLOCKS
  // Off by default: every block takes the masked path, so bench/ can measure what the split buys
  // (docs/fa2-code-notes.md).  The loops below then find no block left.
  for (; n_block >= range.n_block_min; --n_block) process_block(cute::true_type{}, n_block);
#endif
  for (; n_block >= range.n_block_min && range.needs_mask(n_block, kBlockN); --n_block) {
    process_block(cute::true_type{}, n_block);
  }
  for (; n_block >= range.n_block_min && !range.needs_mask(n_block, kBlockN); --n_block) {
    process_block(cute::false_type{}, n_block);
  }
  for (; n_block >= range.n_block_min; --n_block) {
    process_block(cute::true_type{}, n_block);
  }
}

}  // namespace tileattn::cuda
