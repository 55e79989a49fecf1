// The epilogue of one consumer warpgroup: O (normalized) converted to the input type, written by
// stmatrix into this consumer's staging half (its own buffer, or its half of the Q buffer, whose
// rows are dead once its last QK^T has completed), then stored by one TMA bulk copy, which clips
// rows past seqlen_q and columns past head_dim.  The LSE goes straight from registers to global
// memory.
// With its own buffer, the previous tile's store must have finished reading it before stmatrix
// overwrites it (the wait is here, a tile later, so the store overlaps the next tile's mainloop);
// the consumer released Q when its last QK^T landed.  Over Q, the consumer's arrival on q_empty
// (after the TMA store has read smem) lets the producer load the next tile's Q.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/cute_utils.h"
#include "cuda/sm90/kernel_params_sm90.h"
#include "cuda/sm90/pipeline_sm90.h"
#include "cuda/sm90/sequence_bounds_sm90.h"
#include "cuda/sm90/softmax_sm90.h"

namespace tileattn::cuda::sm90 {

template <typename Traits, typename TensorO, int kRowsPerThread>
__device__ __forceinline__ void store_tile_output(Sm90Params<Traits> const& prm, typename Traits::SharedStorage& ss,
                                                  int consumer, int tid, TileCoords const& tc,
                                                  SequenceView const& seq, float* lse_rows, int q_rows,
                                                  TensorO const& acc_o,
                                                  const float (&lse)[kRowsPerThread]) {
  using namespace cute;
  using Element = typename Traits::Element;
  using Rows = typename Traits::Rows;
  using HeadDim = typename Traits::HeadDim;
  typename Traits::TiledMmaPV tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(tid);

  // LSE: the quad's first thread holds column 0 of its two rows.
  Tensor cO = thr_mma.partition_C(make_identity_tensor(Shape<Rows, HeadDim>{}));
  Tensor coords = make_tensor(cO.data(), gmma_acc_rowcol_layout(cO.layout()));
  if (get<1>(coords(0, 0)) == 0) {
    CUTE_UNROLL
    for (int r = 0; r < kRowsPerThread; ++r) {
      const int row = get<0>(coords(r, 0));
      if (row < q_rows) lse_rows[row] = lse[r];
    }
  }

  if (q_rows <= 0) {  // a ragged last tile's padding consumer (consumer.h): nothing to store
    if constexpr (!Traits::kSeparateO) EmptyBarrier::arrive(&ss.q_empty);
    return;
  }
  if constexpr (Traits::kSeqBounds) {
    if (q_rows < kRowsPerConsumer) {  // ends inside the tensor: a TMA box would write the next rows
      const ForwardParams& p = prm.args.params;
      Tensor rO = convert_fragment<Element>(acc_o);
      Tensor rO_rows = make_tensor(rO.data(), gmma_acc_rowcol_layout(rO.layout()));
      const int row0 = tc.m_block * Traits::kBlockM + consumer * kRowsPerConsumer;
      CUTE_UNROLL
      for (int r = 0; r < kRowsPerThread; ++r) {
        const int row = get<0>(coords(r, 0));
        if (row >= q_rows) continue;
        Element* dst = static_cast<Element*>(p.out) +
                       q_offset(seq, p.out_batch_stride, p.out_row_stride, p.out_head_stride, row0 + row, tc.head);
        CUTE_UNROLL
        for (int c = 0; c < size<1>(rO_rows); ++c) {
          const int col = get<1>(coords(r, c));
          if (col < p.head_dim) dst[col] = rO_rows(r, c);
        }
      }
      if constexpr (!Traits::kSeparateO) EmptyBarrier::arrive(&ss.q_empty);
      return;
    }
  }

  Tensor sO = make_tensor(make_smem_ptr(Traits::o_staging(ss, consumer)), typename Traits::SmemLayoutQHalf{});
  if constexpr (Traits::kSeparateO) {
    if (tid == 0) tma_store_wait<0>();
    named_barrier_sync(kEpilogueBarrierBase + consumer, 128);
  }
  Tensor rO = convert_fragment<Element>(acc_o);
  auto smem_tiled_copy = make_tiled_copy_C(typename Traits::SmemCopyAtomO{}, tiled_mma);
  auto smem_thr_copy = smem_tiled_copy.get_thread_slice(tid);
  copy(smem_tiled_copy, smem_thr_copy.retile_S(rO), smem_thr_copy.partition_D(sO));
  // Generic-proxy smem writes -> visible to the TMA (async proxy), then all 128 threads' rows.
  cutlass::arch::fence_view_async_shared();
  named_barrier_sync(kEpilogueBarrierBase + consumer, 128);
  if (tid == 0) {
    Tensor mO = prm.tma_o.get_tma_tensor(prm.q_shape);
    const int batch = Traits::kSeqBounds ? tma_batch(seq) : tc.batch;
    Tensor gO = local_tile(rows_from<Traits::kSeqBounds>(mO(_, _, tc.head, batch), seq.q_base_row),
                           Shape<Rows, HeadDim>{}, make_coord(_, _0{}));
    auto parts = tma_partition(prm.tma_o, _0{}, Layout<_1>{}, group_modes<0, 2>(sO), group_modes<0, 2>(gO));
    Tensor tOgO = get<0>(parts);  // (TMA, 64-row block)
    Tensor tOsO = get<1>(parts);  // (TMA)
    copy(prm.tma_o, tOsO, tOgO(_, Traits::kConsumers * tc.m_block + consumer));
    tma_store_arrive();
    if constexpr (!Traits::kSeparateO) tma_store_wait<0>();  // smem read by the TMA engine: Q may be refilled
  }
  if constexpr (!Traits::kSeparateO) EmptyBarrier::arrive(&ss.q_empty);
}

}  // namespace tileattn::cuda::sm90
