// The wgmma types of the Hopper backward for one (head-dim bucket, dtype): the same tiles, shared
// memory offsets and cp.async loads as the mma.sync backward (Fa2BwdTraits), seen through GMMA
// shared-memory layouts, plus the five tiled MMAs.  Holds no logic.
//
// Each product runs on both warpgroups of the CTA (256 threads): split along M when its M is 128
// rows, else along N, since wgmma's M is 64 per warpgroup.  Per thread (d128, 64 x 128 tiles):
// S and dP 32 floats each, dK and dV 64 each, dQ 32: the same budget as the mma.sync version.
#pragma once

#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include "cuda/backward/bwd_fa2_traits.h"

namespace tileattn::cuda::sm90 {

template <int kHeadDim_, typename Element_>
struct BwdSm90Traits : bwd::Fa2BwdTraits<kHeadDim_, Element_> {
  using Base = bwd::Fa2BwdTraits<kHeadDim_, Element_>;
  using Element = Element_;
  static constexpr int kBlockM = Base::kBlockM;
  static constexpr int kBlockN = Base::kBlockN;
  static constexpr int kHeadDim = kHeadDim_;
  static_assert(Base::kNThreads == 256, "two warpgroups");

  using BlockM = cute::Int<kBlockM>;
  using BlockN = cute::Int<kBlockN>;
  using HeadDim = cute::Int<kHeadDim>;

  // The warpgroup grid of a product with M rows: (2, 1) when M = 128, else (1, 2).
  template <int kM>
  using WarpgroupGrid = cute::Layout<cute::Shape<cute::Int<kM / 64>, cute::Int<2 / (kM / 64)>, cute::_1>>;
  // N per warpgroup: all of N when the warpgroups split M, half of it otherwise.
  template <int kM, int kN, int kK, cute::GMMA::Major kMajorA, cute::GMMA::Major kMajorB>
  using TiledMmaSS = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float,
                                 cute::Shape<cute::_64, cute::Int<kN * (kM / 64) / 2>, cute::Int<kK>>,
                                 kMajorA, kMajorB>(),
      WarpgroupGrid<kM>{}));
  static constexpr auto K = cute::GMMA::Major::K;
  static constexpr auto MN = cute::GMMA::Major::MN;
  // S = Q K^T, dP = dO V^T: both operands with the head dim contiguous (K-major).
  using TiledMmaSdP = TiledMmaSS<kBlockM, kBlockN, kHeadDim, K, K>;
  // dV += P^T dO, dK += dS^T Q: A = P^T has the keys contiguous, B = dO^T the head dim (MN-major).
  using TiledMmadKV = TiledMmaSS<kBlockN, kHeadDim, kBlockM, MN, MN>;
  // dQ = dS K: A = dS with the keys (the k mode) contiguous, B = K^T with the head dim contiguous.
  using TiledMmadQ = TiledMmaSS<kBlockM, kHeadDim, kBlockN, K, MN>;

  // The GMMA views of Fa2BwdTraits' tiles: the same bytes (its Swizzle<3,3,3> on 64-element rows
  // is the 128-byte swizzle), in the pointer-swizzled form wgmma descriptors are built from.
  using Atom = cute::GMMA::Layout_K_SW128_Atom<Element>;
  using GmmaQ = typename Base::template TileOf<Atom, kBlockM, kHeadDim>;  // Q and dO
  using GmmaKV = typename Base::template TileOf<Atom, kBlockN, kHeadDim>;
  using GmmaPdS = typename Base::template TileOf<Atom, kBlockM, kBlockN>;
  using GmmaQt = typename Base::template Transposed<GmmaQ, kBlockM, kHeadDim>;     // (d, kBlockM)
  using GmmaKt = typename Base::template Transposed<GmmaKV, kBlockN, kHeadDim>;    // (d, kBlockN)
  using GmmaPdSt = typename Base::template Transposed<GmmaPdS, kBlockM, kBlockN>;  // (kBlockN, kBlockM)
};

}  // namespace tileattn::cuda::sm90
