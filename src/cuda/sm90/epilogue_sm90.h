// The epilogue of one consumer warpgroup: O (normalized) converted to the input type, written by
// stmatrix into this consumer's half of the Q buffer (its Q rows are dead: its last QK^T has
// completed), then stored by one TMA bulk copy, which clips rows past seqlen_q and columns past
// head_dim.  The LSE goes straight from registers to global memory.
// The consumer's arrival on q_empty (after the TMA store has finished reading smem) lets the
// producer load the next tile's Q over it.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "cuda/cute_utils.h"
#include "cuda/sm90/kernel_params_sm90.h"
#include "cuda/sm90/pipeline_sm90.h"
#include "cuda/sm90/softmax_sm90.h"

namespace tileattn::cuda::sm90 {

template <typename Traits, typename TensorO, int kRowsPerThread>
__device__ __forceinline__ void store_tile_output(Sm90Params<Traits> const& prm, typename Traits::SharedStorage& ss,
                                                  int consumer, int tid, TileCoords const& tc,
                                                  float* lse_rows, int q_rows, TensorO const& acc_o,
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

  Tensor sO = make_tensor(make_smem_ptr(ss.q.data() + consumer * Traits::kQHalfElems),
                          typename Traits::SmemLayoutQHalf{});
  Tensor rO = convert_fragment<Element>(acc_o);
  auto smem_tiled_copy = make_tiled_copy_C(typename Traits::SmemCopyAtomO{}, tiled_mma);
  auto smem_thr_copy = smem_tiled_copy.get_thread_slice(tid);
  copy(smem_tiled_copy, smem_thr_copy.retile_S(rO), smem_thr_copy.partition_D(sO));
  // Generic-proxy smem writes -> visible to the TMA (async proxy), then all 128 threads' rows.
  cutlass::arch::fence_view_async_shared();
  named_barrier_sync(kEpilogueBarrierBase + consumer, 128);
  if (tid == 0) {
    Tensor mO = prm.tma_o.get_tma_tensor(prm.q_shape);
    Tensor gO = local_tile(mO(_, _, tc.head, tc.batch), Shape<Rows, HeadDim>{}, make_coord(_, _0{}));
    auto parts = tma_partition(prm.tma_o, _0{}, Layout<_1>{}, group_modes<0, 2>(sO), group_modes<0, 2>(gO));
    Tensor tOgO = get<0>(parts);  // (TMA, 64-row block)
    Tensor tOsO = get<1>(parts);  // (TMA)
    copy(prm.tma_o, tOsO, tOgO(_, 2 * tc.m_block + consumer));
    tma_store_arrive();
    tma_store_wait<0>();  // smem read by the TMA engine: the buffer may be refilled
  }
  EmptyBarrier::arrive(&ss.q_empty);
}

}  // namespace tileattn::cuda::sm90
