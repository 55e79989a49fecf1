// The epilogue of one consumer warpgroup: O (normalized) converted to the input type, written by
// stmatrix into this consumer's staging buffer and stored by TMA bulk copies, which clip rows past
// seqlen_q and columns past head_dim; the LSE goes straight from registers to global memory.  The
// consumer released Q when its last QK^T landed (consumer.h), so the next tile's Q loads meanwhile.
// The previous store must have finished reading the buffer before stmatrix overwrites it: the wait
// is here, a tile later, so a store overlaps the next tile's mainloop; at d256 the buffer holds half
// the columns and the second pass waits for the first pass's store to have read it.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "common/sequence.h"
#include "cuda/cute_utils.h"
#include "cuda/sm90/kernel_params_sm90.h"
#include "cuda/sm90/pipeline_sm90.h"
#include "cuda/sm90/sequence_bounds_sm90.h"
#include "cuda/sm90/softmax_sm90.h"

namespace tileattn::cuda::sm90 {

// Each thread's O fragments straight to global memory, for a ragged tile of a packed sequence.
// Columns (c, c + 1) of the accumulator's row view are adjacent head-dim columns, head_dim is a
// multiple of 8 and rows are 16-byte aligned on this path (TMA's rules), so each pair is one aligned
// 4-byte store.
template <typename Traits, typename TensorO, typename TensorC>
__device__ __forceinline__ void store_o_pairs(Sm90Params<Traits> const& prm, TileCoords const& tc,
                                              SequenceView const& seq, int row0, int q_rows, TensorO const& acc_o,
                                              TensorC const& coords) {
  using namespace cute;
  using Element = typename Traits::Element;
  const ForwardParams& p = prm.args.params;
  Tensor rO = convert_fragment<Element>(acc_o);
  Tensor rO_rows = make_tensor(rO.data(), gmma_acc_rowcol_layout(rO.layout()));
  CUTE_UNROLL
  for (int r = 0; r < size<0>(rO_rows); ++r) {
    const int row = get<0>(coords(r, 0));
    if (row >= q_rows) continue;
    Element* dst = static_cast<Element*>(p.out) +
                   q_offset(seq, p.out_batch_stride, p.out_row_stride, p.out_head_stride, row0 + row, tc.head);
    CUTE_UNROLL
    for (int c = 0; c < size<1>(rO_rows); c += 2) {
      const int col = get<1>(coords(r, c));
      if (col < p.head_dim) {
        const Element pair[2] = {rO_rows(r, c), rO_rows(r, c + 1)};
        *reinterpret_cast<uint32_t*>(dst + col) = *reinterpret_cast<const uint32_t*>(pair);
      }
    }
  }
}

// Stores consumer `consumer`'s O and LSE rows, its 64 rows starting at query row row0 of the
// sequence (negative: the padding above a shifted first tile, consumer.h, which stores nothing).
template <typename Traits, typename TensorO, int kRowsPerThread>
__device__ __forceinline__ void store_tile_output(Sm90Params<Traits> const& prm, typename Traits::SharedStorage& ss,
                                                  int consumer, int tid, TileCoords const& tc,
                                                  SequenceView const& seq, int row0, TensorO const& acc_o,
                                                  const float (&lse)[kRowsPerThread]) {
  using namespace cute;
  using Element = typename Traits::Element;
  using Rows = typename Traits::Rows;
  using HeadDim = typename Traits::HeadDim;
  typename Traits::TiledMmaPV tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(tid);
  const ForwardParams& p = prm.args.params;
  // Rows of this consumer inside the sequence: none for padding, fewer than 64 at its end.
  const int q_rows = row0 >= 0 && row0 < seq.seqlen_q ? seq.seqlen_q - row0 : 0;
  float* lse_rows = p.softmax_lse + lse_offset(p, seq, max(row0, 0), tc.head);

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

  if (q_rows <= 0) return;  // a ragged tile's padding consumer (consumer.h): nothing to store
  if constexpr (Traits::kSeqBounds) {
    if (q_rows < kRowsPerConsumer) {  // ends inside the tensor: a TMA box would write the next rows
      store_o_pairs<Traits>(prm, tc, seq, row0, q_rows, acc_o, coords);
      return;
    }
  }

  using OCols = typename Traits::OCols;
  Tensor rO = convert_fragment<Element>(acc_o);
  Tensor sO = make_tensor(make_smem_ptr(Traits::o_staging(ss, consumer)), typename Traits::SmemLayoutO{});
  typename Traits::TiledMmaOPass pass_mma;
  auto smem_tiled_copy = make_tiled_copy_C(typename Traits::SmemCopyAtomO{}, pass_mma);
  auto smem_thr_copy = smem_tiled_copy.get_thread_slice(tid);
  auto pass_layout = partition_fragment_C(pass_mma, Shape<Rows, OCols>{}).layout();
  static_assert(decltype(size(pass_layout))::value * Traits::kOPasses == decltype(size(rO))::value);
  CUTE_UNROLL
  for (int pass = 0; pass < Traits::kOPasses; ++pass) {
    if (tid == 0) tma_store_wait<0>();
    named_barrier_sync(kEpilogueBarrierBase + consumer, 128);
    Tensor rO_pass = make_tensor(rO.data() + pass * size(pass_layout), pass_layout);
    copy(smem_tiled_copy, smem_thr_copy.retile_S(rO_pass), smem_thr_copy.partition_D(sO));
    // Generic-proxy smem writes -> visible to the TMA (async proxy), then all 128 threads' rows.
    cutlass::arch::fence_view_async_shared();
    named_barrier_sync(kEpilogueBarrierBase + consumer, 128);
    if (tid == 0) {
      Tensor mO = prm.tma_o.get_tma_tensor(prm.q_shape);
      const int batch = Traits::kSeqBounds ? tma_batch(seq) : tc.batch;
      Tensor gO = local_tile(rows_from<Traits::kSeqBounds>(mO(_, _, tc.head, batch), seq.q_base_row),
                             Shape<Rows, OCols>{}, make_coord(_, _));
      auto parts = tma_partition(prm.tma_o, _0{}, Layout<_1>{}, group_modes<0, 2>(sO), group_modes<0, 2>(gO));
      Tensor tOgO = get<0>(parts);  // (TMA, 64-row block, column block)
      Tensor tOsO = get<1>(parts);  // (TMA)
      copy(prm.tma_o, tOsO, tOgO(_, row0 / kRowsPerConsumer, pass));
      tma_store_arrive();
    }
  }
}

}  // namespace tileattn::cuda::sm90
