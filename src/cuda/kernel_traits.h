// The CuTe types of the forward kernel for one (head-dim bucket, dtype): the tensor-core MMA, the
// shared-memory layouts and the copy atoms.  Derived from FwdTileConfig; holds no logic.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "cuda/tile_config.h"

namespace tileattn::cuda {

template <typename Element>
struct MmaAtomFor;
template <>
struct MmaAtomFor<cutlass::half_t> {
  using type = cute::SM80_16x8x16_F32F16F16F32_TN;
};
template <>
struct MmaAtomFor<cutlass::bfloat16_t> {
  using type = cute::SM80_16x8x16_F32BF16BF16F32_TN;
};

template <int kHeadDim_, typename Element_>
struct FwdKernelTraits {
  using Element = Element_;
  static constexpr FwdTileConfig kConfig = fwd_tile_config(kHeadDim_);
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kConfig.block_m;
  static constexpr int kBlockN = kConfig.block_n;
  static constexpr int kNWarps = kConfig.num_warps;
  static constexpr int kNThreads = kNWarps * 32;
  static_assert(kBlockM == 16 * kNWarps * (kBlockM / (16 * kNWarps)), "warps split the rows evenly");

  // Tensor cores: mma.sync m16n8k16 with float accumulators.  The warps tile the M (query row)
  // mode only (FA2 change 2: no split of the keys across warps, so no smem reduction of the
  // softmax statistics).  The N permutation of 16 makes one B-operand ldmatrix.x4 feed two atoms.
  using TiledMma = cute::TiledMMA<cute::MMA_Atom<typename MmaAtomFor<Element>::type>,
                                  cute::Layout<cute::Shape<cute::Int<kNWarps>, cute::_1, cute::_1>>,
                                  cute::Tile<cute::Int<16 * kNWarps>, cute::_16, cute::_16>>;

  // Shared memory: rows of 64 elements (128 B) swizzled with Swizzle<3,3,3> so that ldmatrix
  // (8 rows x 16 B) and the 16-byte cp.async stores touch 8 distinct bank groups.  Head dims that
  // are not a multiple of 64 (the 32 and 96 buckets) use 32-element rows and Swizzle<2,3,3>.
  static constexpr int kBlockKSmem = kHeadDim % 64 == 0 ? 64 : 32;
  static constexpr int kSwizzleBits = kBlockKSmem == 32 ? 2 : 3;
  using SmemLayoutAtom = decltype(cute::composition(
      cute::Swizzle<kSwizzleBits, 3, 3>{},
      cute::Layout<cute::Shape<cute::_8, cute::Int<kBlockKSmem>>,
                   cute::Stride<cute::Int<kBlockKSmem>, cute::_1>>{}));
  using SmemLayoutQ = decltype(cute::tile_to_shape(
      SmemLayoutAtom{}, cute::Shape<cute::Int<kBlockM>, cute::Int<kHeadDim>>{}));
  using SmemLayoutKV = decltype(cute::tile_to_shape(
      SmemLayoutAtom{}, cute::Shape<cute::Int<kBlockN>, cute::Int<kHeadDim>>{}));
  // V read as the B operand of P V: the same bytes seen as (D, kBlockN); ldmatrix.trans loads it.
  using SmemLayoutVt = decltype(cute::composition(
      SmemLayoutKV{},
      cute::make_layout(cute::Shape<cute::Int<kHeadDim>, cute::Int<kBlockN>>{}, cute::GenRowMajor{})));
  using SmemLayoutVtNoSwizzle = decltype(cute::get_nonswizzle_portion(SmemLayoutVt{}));
  // The epilogue stages O through the Q buffer (Q is dead by then).
  using SmemLayoutO = SmemLayoutQ;

  static constexpr int kSmemQBytes = int(cute::cosize(SmemLayoutQ{})) * int(sizeof(Element));
  static constexpr int kSmemKVBytes = int(cute::cosize(SmemLayoutKV{})) * int(sizeof(Element));
  static constexpr int kSmemBytes = kSmemQBytes + 2 * kSmemKVBytes;

  // smem -> registers.
  using SmemCopyAtom = cute::Copy_Atom<cute::SM75_U32x4_LDSM_N, Element>;
  using SmemCopyAtomTransposed = cute::Copy_Atom<cute::SM75_U16x8_LDSM_T, Element>;
  using SmemCopyAtomO = cute::Copy_Atom<cute::AutoVectorizingCopyWithAssumedAlignment<128>, Element>;

  // global <-> smem: 16-byte accesses (8 elements), a row of kBlockKSmem covered by consecutive
  // threads so each warp reads whole 128 B lines.
  static constexpr int kGmemElemsPerLoad = int(sizeof(cute::uint128_t) / sizeof(Element));
  static constexpr int kGmemThreadsPerRow = kBlockKSmem / kGmemElemsPerLoad;
  using GmemLayoutAtom =
      cute::Layout<cute::Shape<cute::Int<kNThreads / kGmemThreadsPerRow>, cute::Int<kGmemThreadsPerRow>>,
                   cute::Stride<cute::Int<kGmemThreadsPerRow>, cute::_1>>;
  // cp.async.cg: bypasses L1, the tiles are read once per CTA (FA2 change 4: asynchronous copies
  // so that the next K/V tile loads while the tensor cores work on the current one).
  using GmemTiledCopyQKV = decltype(cute::make_tiled_copy(
      cute::Copy_Atom<cute::SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>, Element>{}, GmemLayoutAtom{},
      cute::Layout<cute::Shape<cute::_1, cute::Int<kGmemElemsPerLoad>>>{}));
  using GmemTiledCopyO = decltype(cute::make_tiled_copy(
      cute::Copy_Atom<cute::UniversalCopy<cute::uint128_t>, Element>{}, GmemLayoutAtom{},
      cute::Layout<cute::Shape<cute::_1, cute::Int<kGmemElemsPerLoad>>>{}));
};

}  // namespace tileattn::cuda
