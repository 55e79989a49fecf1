// The forward epilogue: O (already normalized by OnlineSoftmax::finalize) converted to the input
// type, staged through shared memory so global stores are 16-byte and row-contiguous, and the LSE
// of each query row.
#pragma once

#include <cute/tensor.hpp>

#include "cuda/cute_utils.h"

namespace tileattn::cuda {

template <typename Element>
struct EpilogueOutputs {
  Element* out;  // row m0 of the sequence, this head
  int64_t out_row_stride;
  float* lse;    // the LSE of row m0, this head (rows are contiguous)
  int q_rows;    // valid query rows in this tile (may exceed kBlockM)
  int head_dim;
};

template <typename Traits, typename TensorO, int kRows>
__device__ __forceinline__ void store_output(EpilogueOutputs<typename Traits::Element> const& dst,
                                             TensorO const& acc_o, const float (&lse)[kRows], char* smem) {
  using namespace cute;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kHeadDim = Traits::kHeadDim;
  const int tid = threadIdx.x;
  typename Traits::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(tid);

  // Registers -> smem.  O reuses the Q buffer: each warp only ever read its own Q rows, and the
  // mainloop's last barrier came after the last Q read, so no extra barrier is needed here.
  Tensor rO = convert_fragment<Element>(acc_o);
  Tensor sO = make_tensor(make_smem_ptr(reinterpret_cast<Element*>(smem)), typename Traits::SmemLayoutO{});
  auto smem_tiled_copy_O = make_tiled_copy_C(typename Traits::SmemCopyAtomO{}, tiled_mma);
  auto smem_thr_copy_O = smem_tiled_copy_O.get_thread_slice(tid);
  Tensor taccOrO = smem_thr_copy_O.retile_S(rO);
  Tensor taccOsO = smem_thr_copy_O.partition_D(sO);
  cute::copy(smem_tiled_copy_O, taccOrO, taccOsO);

  // LSE: the quad's first thread holds column 0 of its rows.
  Tensor tOcO = thr_mma.partition_C(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  Tensor coords = make_tensor(tOcO.data(), acc_rowcol_layout(tOcO.layout()));
  static_assert(decltype(size<0>(coords))::value == kRows);
  if (get<1>(coords(0, 0)) == 0) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int row = get<0>(coords(r, 0));
      if (row < dst.q_rows) dst.lse[row] = lse[r];
    }
  }
  __syncthreads();

  // smem -> global, 16 bytes per thread, rows past the sequence and padded columns skipped.
  Tensor gO = make_tensor(make_gmem_ptr(dst.out),
                          make_layout(Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_stride(dst.out_row_stride, _1{})));
  typename Traits::GmemTiledCopyO gmem_tiled_copy_O;
  auto gmem_thr_copy_O = gmem_tiled_copy_O.get_thread_slice(tid);
  Tensor tOsO = gmem_thr_copy_O.partition_S(sO);
  Tensor tOgO = gmem_thr_copy_O.partition_D(gO);
  Tensor tOcOg = gmem_thr_copy_O.partition_D(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  Tensor tOrO = make_tensor<Element>(shape(tOgO));
  cute::copy(gmem_tiled_copy_O, tOsO, tOrO);
  CUTE_UNROLL
  for (int m = 0; m < size<1>(tOgO); ++m) {
    if (get<0>(tOcOg(0, m, 0)) < dst.q_rows) {
      CUTE_UNROLL
      for (int k = 0; k < size<2>(tOgO); ++k) {
        if (get<1>(tOcOg(0, m, k)) < dst.head_dim) cute::copy(gmem_tiled_copy_O, tOrO(_, m, k), tOgO(_, m, k));
      }
    }
  }
}

}  // namespace tileattn::cuda
