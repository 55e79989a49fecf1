// Tile sizes and CuTe types of the register-level backward (FA2 Algorithm 2) for one (head-dim
// bucket, dtype): the three tiled MMAs, the swizzled shared-memory layouts and their transposed
// views, the copy atoms, and where each tile sits in dynamic shared memory.  Holds no logic.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "cuda/kernel_traits.h"  // MmaAtomFor<Element>

namespace tileattn::cuda::bwd {

// One CTA owns kBlockN keys and walks the query blocks of kBlockM rows.  Choices per bucket, with
// their register and smem budgets at 8 warps (256 threads, one CTA per SM, <= 255 registers):
//   d64:  128 x 128.  dK, dV 32 + 32 floats/thread, S and dP 64 + 64; smem 160 KB.
//   d128:  64 x 128.  dK, dV 64 + 64, S and dP 32 + 32, dQ 32;         smem 160 KB.
//   d256:  64 x  64.  dK, dV 64 + 64, S and dP 16 + 16, dQ 64;         smem 208 KB.
// Warp grids (rows x cols of warps) per product: S/dP (kBlockM x kBlockN), dK/dV (kBlockN x d),
// dQ (kBlockM x d); each grid gives every warp a 32 x 32 or larger rectangle so an ldmatrix.x4
// feeds at least two MMAs.
struct Fa2BwdTileConfig {
  int block_m, block_n;
  int warps_m_sdp;  // warps along the query rows of S and dP (the rest along the keys)
  int warps_n_dkv;  // warps along the key rows of dK and dV (the rest along the head dim)
  int warps_m_dq;   // warps along the query rows of dQ
};

constexpr Fa2BwdTileConfig fa2_bwd_tile_config(int head_dim) {
  if (head_dim <= 64) return Fa2BwdTileConfig{128, 128, 4, 4, 4};
  if (head_dim <= 128) return Fa2BwdTileConfig{64, 128, 2, 4, 2};
  return Fa2BwdTileConfig{64, 64, 4, 2, 2};
}

// Dynamic shared memory of one CTA (16-bit elements): Q and dO in two stages, K, V, P and dS.
constexpr int fa2_bwd_smem_bytes(int head_dim_bucket) {
  const Fa2BwdTileConfig c = fa2_bwd_tile_config(head_dim_bucket);
  return 2 * (4 * c.block_m * head_dim_bucket + 2 * c.block_n * head_dim_bucket + 2 * c.block_m * c.block_n);
}

template <int kHeadDim_, typename Element_>
struct Fa2BwdTraits {
  using Element = Element_;
  static constexpr Fa2BwdTileConfig kConfig = fa2_bwd_tile_config(kHeadDim_);
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kConfig.block_m;
  static constexpr int kBlockN = kConfig.block_n;
  static constexpr int kNWarps = 8;
  static constexpr int kNThreads = kNWarps * 32;

  template <int kWarpsM>
  using TiledMmaFor = cute::TiledMMA<
      cute::MMA_Atom<typename MmaAtomFor<Element>::type>,
      cute::Layout<cute::Shape<cute::Int<kWarpsM>, cute::Int<kNWarps / kWarpsM>, cute::_1>>,
      // Tile sizes, no permutation: the warps along N take 8-column atoms in turn (with 4 of them,
      // warp w holds columns 8w .. 8w+7 of every 32; CuTe's partition_C printed on the host).
      cute::Tile<cute::Int<16 * kWarpsM>, cute::Int<16 * (kNWarps / kWarpsM)>, cute::_16>>;
  using TiledMmaSdP = TiledMmaFor<kConfig.warps_m_sdp>;  // S = Q K^T, dP = dO V^T
  using TiledMmadKV = TiledMmaFor<kConfig.warps_n_dkv>;  // dV += P^T dO, dK += dS^T Q
  using TiledMmadQ = TiledMmaFor<kConfig.warps_m_dq>;    // dQ = dS K

  // Rows of 64 elements (128 B) swizzled with Swizzle<3,3,3>: the 8 rows of one ldmatrix phase
  // (plain or transposed) and the 16-byte cp.async stores hit 8 distinct 16-byte bank groups.
  using SmemLayoutAtom = decltype(cute::composition(
      cute::Swizzle<3, 3, 3>{},
      cute::Layout<cute::Shape<cute::_8, cute::_64>, cute::Stride<cute::_64, cute::_1>>{}));
  static_assert(kHeadDim % 64 == 0 && kBlockN % 64 == 0, "64-element swizzle rows");

  template <typename Atom, int kRows, int kCols>
  using TileOf = decltype(cute::tile_to_shape(Atom{}, cute::Shape<cute::Int<kRows>, cute::Int<kCols>>{}));
  template <int kRows, int kCols>
  using SmemTile = TileOf<SmemLayoutAtom, kRows, kCols>;
  // The transpose of a (rows, cols) tile: the same bytes seen as (cols, rows), read with
  // ldmatrix.trans when it is the operand whose contiguous mode is not the MMA's k.
  template <typename Tile, int kRows, int kCols>
  using Transposed = decltype(cute::composition(
      Tile{}, cute::make_layout(cute::Shape<cute::Int<kCols>, cute::Int<kRows>>{}, cute::GenRowMajor{})));

  using SmemLayoutQ = SmemTile<kBlockM, kHeadDim>;  // Q and dO
  using SmemLayoutKV = SmemTile<kBlockN, kHeadDim>;
  using SmemLayoutPdS = SmemTile<kBlockM, kBlockN>;
  using SmemLayoutQt = Transposed<SmemLayoutQ, kBlockM, kHeadDim>;      // (d, kBlockM)
  using SmemLayoutKt = Transposed<SmemLayoutKV, kBlockN, kHeadDim>;     // (d, kBlockN)
  using SmemLayoutPdSt = Transposed<SmemLayoutPdS, kBlockM, kBlockN>;   // (kBlockN, kBlockM)
  using SmemLayoutQtNoSwizzle = decltype(cute::get_nonswizzle_portion(SmemLayoutQt{}));
  using SmemLayoutKtNoSwizzle = decltype(cute::get_nonswizzle_portion(SmemLayoutKt{}));
  using SmemLayoutPdStNoSwizzle = decltype(cute::get_nonswizzle_portion(SmemLayoutPdSt{}));

  // Byte offsets in dynamic shared memory.  Q and dO are double buffered (the next query block
  // loads during this one's five products); K and V stay for the CTA's lifetime.
  static constexpr int kQBytes = kBlockM * kHeadDim * int(sizeof(Element));
  static constexpr int kKVBytes = kBlockN * kHeadDim * int(sizeof(Element));
  static constexpr int kPdSBytes = kBlockM * kBlockN * int(sizeof(Element));
  static constexpr int kOffsetQ = 0;                       // 2 stages
  static constexpr int kOffsetdO = kOffsetQ + 2 * kQBytes;  // 2 stages
  static constexpr int kOffsetK = kOffsetdO + 2 * kQBytes;
  static constexpr int kOffsetV = kOffsetK + kKVBytes;
  static constexpr int kOffsetP = kOffsetV + kKVBytes;
  static constexpr int kOffsetdS = kOffsetP + kPdSBytes;
  static constexpr int kSmemBytes = kOffsetdS + kPdSBytes;
  static_assert(kSmemBytes <= 227 * 1024, "exceeds the H100/H200 opt-in shared memory per block");
  static_assert(kSmemBytes == fa2_bwd_smem_bytes(kHeadDim), "the host's smem check must agree");

  using SmemCopyAtom = cute::Copy_Atom<cute::SM75_U32x4_LDSM_N, Element>;
  using SmemCopyAtomTransposed = cute::Copy_Atom<cute::SM75_U16x8_LDSM_T, Element>;
  // Register P / dS -> smem: each thread holds column pairs, stored 4 bytes at a time.
  using SmemCopyAtomPdS = cute::Copy_Atom<cute::AutoVectorizingCopyWithAssumedAlignment<32>, Element>;

  // global -> smem: cp.async.cg of 16 bytes, 8 threads per 64-element row so a warp reads whole
  // 128-byte lines.
  static constexpr int kGmemElemsPerLoad = int(sizeof(cute::uint128_t) / sizeof(Element));
  static constexpr int kGmemThreadsPerRow = 64 / kGmemElemsPerLoad;
  using GmemLayoutAtom =
      cute::Layout<cute::Shape<cute::Int<kNThreads / kGmemThreadsPerRow>, cute::Int<kGmemThreadsPerRow>>,
                   cute::Stride<cute::Int<kGmemThreadsPerRow>, cute::_1>>;
  using GmemTiledCopy = decltype(cute::make_tiled_copy(
      cute::Copy_Atom<cute::SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>, Element>{}, GmemLayoutAtom{},
      cute::Layout<cute::Shape<cute::_1, cute::Int<kGmemElemsPerLoad>>>{}));
  // smem -> global for the dK / dV epilogue: the same thread layout, plain 16-byte stores.
  using GmemTiledCopyStore = decltype(cute::make_tiled_copy(
      cute::Copy_Atom<cute::UniversalCopy<cute::uint128_t>, Element>{}, GmemLayoutAtom{},
      cute::Layout<cute::Shape<cute::_1, cute::Int<kGmemElemsPerLoad>>>{}));
};

}  // namespace tileattn::cuda::bwd
