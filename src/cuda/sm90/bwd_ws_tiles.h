// The Q, dO, K and V tiles of the warp-specialized Hopper backward, shared by both consumer layouts
// (bwd_ws_traits.h: keys split between the consumers; bwd_ws_cols_traits.h: head-dim columns):
// their shared-memory layouts, the transposed views wgmma reads as MN-major B operands, and the
// TMA copy types that fill them and write dK, dV back.
#pragma once

#include <cute/arch/copy_sm90.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

namespace tileattn::cuda::sm90 {

// kBlockM query rows a step in kStages buffers, kBlockN keys a CTA, kHeadDim columns.
template <typename Element, int kBlockM, int kBlockN, int kHeadDim, int kStages>
struct BwdWsTiles {
  using _M = cute::Int<kBlockM>;
  using _N = cute::Int<kBlockN>;
  using _D = cute::Int<kHeadDim>;
  using _S = cute::Int<kStages>;

  // (rows, head dim) tiles K-major with the 128-byte swizzle: what TMA writes and wgmma reads.
  using Atom = cute::GMMA::Layout_K_SW128_Atom<Element>;
  using SmemLayoutQ = decltype(cute::tile_to_shape(Atom{}, cute::Shape<_M, _D, _S>{}));  // Q and dO
  using SmemLayoutKV = decltype(cute::tile_to_shape(Atom{}, cute::Shape<_N, _D, cute::_1>{}));  // one stage
  // (head dim, rows) views of the same bytes, the MN-major B operands of dV, dK (dO^T, Q^T) and
  // of dQ (K^T).
  using SmemLayoutQt = decltype(cute::composition(
      SmemLayoutQ{}, cute::make_ordered_layout(cute::Shape<_D, _M, _S>{}, cute::Step<cute::_2, cute::_1, cute::_3>{})));
  using SmemLayoutKt = decltype(cute::composition(
      SmemLayoutKV{}, cute::make_ordered_layout(cute::Shape<_D, _N, cute::_1>{}, cute::Step<cute::_2, cute::_1, cute::_3>{})));

  // Global tensors as TMA sees them: (rows, head dim, heads, batch), head dim contiguous.
  using GmemLayout = cute::Layout<cute::Shape<int32_t, int32_t, int32_t, int32_t>,
                                  cute::Stride<int64_t, cute::_1, int64_t, int64_t>>;
  using TmaQ = decltype(cute::make_tma_copy(
      cute::SM90_TMA_LOAD{}, cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(nullptr)), GmemLayout{}),
      cute::take<0, 2>(SmemLayoutQ{}), cute::Shape<_M, _D>{}, cute::_1{}));
  using TmaKV = decltype(cute::make_tma_copy(
      cute::SM90_TMA_LOAD{}, cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(nullptr)), GmemLayout{}),
      cute::take<0, 2>(SmemLayoutKV{}), cute::Shape<_N, _D>{}, cute::_1{}));
  // dK and dV leave as K and V came: one (kBlockN, head dim) box from the K / V tile's bytes.
  using TmaKVStore = decltype(cute::make_tma_copy(
      cute::SM90_TMA_STORE{}, cute::make_tensor(cute::make_gmem_ptr(static_cast<Element*>(nullptr)), GmemLayout{}),
      cute::take<0, 2>(SmemLayoutKV{}), cute::Shape<_N, _D>{}, cute::_1{}));

  // Accumulator-layout registers (dS^T, P^T, dK, dV) into these swizzled tiles: stmatrix, four 8 x 8
  // tiles an instruction.  A plain copy through the pointer-swizzled layouts applied the swizzle to
  // 64-bit generic addresses: 16 ST.E of 4 bytes and ~60 address instructions a thread for one dS
  // block (session 77).
  using SmemCopyAtomC = cute::Copy_Atom<cute::SM90_U32x4_STSM_N, Element>;

  static constexpr uint32_t kQTileBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKVTileBytes = kBlockN * kHeadDim * sizeof(Element);
};

}  // namespace tileattn::cuda::sm90
