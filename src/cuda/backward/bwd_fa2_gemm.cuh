// One warp-level tile product of the backward with both operands in shared memory:
// acc += A B^T over the k mode, A (M x K) and B (N x K) read through ldmatrix (plain or
// transposed, as the caller's copies say) into registers one k-slice ahead of the MMAs.
#pragma once

#include <cute/tensor.hpp>

namespace tileattn::cuda::bwd {

// acc += A B^T.  tCsA / tCsB: the smem operands partitioned by the ldmatrix copies; tCrA / tCrB:
// the MMA register fragments.  Loading slice k + 1 before the MMAs of slice k lets the ldmatrix
// latency hide behind them.
template <typename TiledMma, typename TensorAcc, typename TensorRA, typename TensorRB, typename TensorSA,
          typename TensorSB, typename CopyA, typename CopyB>
__device__ __forceinline__ void gemm_smem(TiledMma const& tiled_mma, TensorAcc& acc, TensorRA& tCrA,
                                          TensorRB& tCrB, TensorSA const& tCsA, TensorSB const& tCsB,
                                          CopyA const& copy_a, CopyB const& copy_b) {
  auto tCrA_view = copy_a.get_thread_slice(threadIdx.x).retile_D(tCrA);
  auto tCrB_view = copy_b.get_thread_slice(threadIdx.x).retile_D(tCrB);
  static_assert(decltype(cute::size<2>(tCrA) == cute::size<2>(tCrA_view))::value);
  cute::copy(copy_a, tCsA(cute::_, cute::_, cute::_0{}), tCrA_view(cute::_, cute::_, cute::_0{}));
  cute::copy(copy_b, tCsB(cute::_, cute::_, cute::_0{}), tCrB_view(cute::_, cute::_, cute::_0{}));
  CUTE_UNROLL
  for (int k = 0; k < cute::size<2>(tCrA); ++k) {
    if (k + 1 < cute::size<2>(tCrA)) {
      cute::copy(copy_a, tCsA(cute::_, cute::_, k + 1), tCrA_view(cute::_, cute::_, k + 1));
      cute::copy(copy_b, tCsB(cute::_, cute::_, k + 1), tCrB_view(cute::_, cute::_, k + 1));
    }
    cute::gemm(tiled_mma, tCrA(cute::_, cute::_, k), tCrB(cute::_, cute::_, k), acc);
  }
}

}  // namespace tileattn::cuda::bwd
