// One warpgroup GEMM on the tensor cores: C (+)= A B over the K mode with wgmma.  The call issues
// the wgmma instructions and commits them as one group; it does not wait, so the caller decides
// what overlaps them (warpgroup_wait<N> lets N later groups stay in flight).
#pragma once

#include <cute/tensor.hpp>

namespace tileattn::cuda::sm90 {

// kZeroInit: C = A B (the first k-step overwrites the accumulator), else C += A B.
// A is either smem descriptors (ss) or a register fragment (rs); a register A must be fenced so
// the compiler does not reuse its registers while the asynchronous wgmma still reads them.
template <bool kZeroInit, typename TiledMma, typename TensorA, typename TensorB, typename TensorC>
__device__ __forceinline__ void wgmma_issue(TiledMma& tiled_mma, TensorA const& tCrA, TensorB const& tCrB,
                                            TensorC& tCrC) {
  constexpr bool kRegisterA =
      !cute::is_base_of<cute::GMMA::DescriptorIterator, typename TiledMma::FrgTypeA>::value;
  if constexpr (kRegisterA) cute::warpgroup_fence_operand(const_cast<TensorA&>(tCrA));
  cute::warpgroup_fence_operand(tCrC);
  cute::warpgroup_arrive();
  if constexpr (kZeroInit) tiled_mma.accumulate_ = cute::GMMA::ScaleOut::Zero;
  CUTE_UNROLL
  for (int k = 0; k < cute::size<2>(tCrA); ++k) {
    cute::gemm(tiled_mma, tCrA(cute::_, cute::_, k), tCrB(cute::_, cute::_, k), tCrC);
    tiled_mma.accumulate_ = cute::GMMA::ScaleOut::One;
  }
  cute::warpgroup_commit_batch();
  cute::warpgroup_fence_operand(tCrC);
  if constexpr (kRegisterA) cute::warpgroup_fence_operand(const_cast<TensorA&>(tCrA));
}

}  // namespace tileattn::cuda::sm90
