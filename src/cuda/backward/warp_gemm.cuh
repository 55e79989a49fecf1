// Tile products in shared memory on the tensor cores, through WMMA (16 x 16 x 16 fragments, float
// accumulation).  Each warp owns a rectangle of 16 x 16 output blocks and keeps its accumulators
// in registers (WarpTile), so operands loaded once feed several blocks: a 2 x 2 rectangle loads
// 4 fragments per k-step for 4 MMAs, where one block per warp would load 8.
#pragma once

#include <mma.h>

#include <type_traits>

namespace tileattn::cuda::bwd {

namespace wmma = nvcuda::wmma;

// Whether an operand is stored row-major (element (r, c) at r * pitch + c) or column-major
// ((r, c) at c * pitch + r).  A transposed operand is the same storage read column-major.
using RowMajor = wmma::row_major;
using ColMajor = wmma::col_major;

template <typename Layout>
__device__ __forceinline__ int element_offset(int row, int col, int pitch) {
  if constexpr (std::is_same_v<Layout, RowMajor>) {
    return row * pitch + col;
  } else {
    return col * pitch + row;
  }
}

// How the warps of a CTA split an M x N product: each warp a kRowBlocks x kColBlocks rectangle of
// 16 x 16 blocks (2 x 2 when there are blocks enough for every warp, else narrower), warps laid
// out kWarpRows x kWarpCols; warps past that grid sit the product out.
template <int M, int N, int kWarps>
struct WarpLayout {
  static constexpr int kBlocksM = M / 16, kBlocksN = N / 16;
  static constexpr int kBlocks = kBlocksM * kBlocksN;
  static constexpr int kRowBlocks = kBlocks >= 4 * kWarps && kBlocksM % 2 == 0 ? 2 : 1;
  static constexpr int kColBlocks = kBlocks >= 2 * kWarps && kBlocksN % 2 == 0 ? 2 : 1;
  static constexpr int kWarpRows = kBlocksM / kRowBlocks;
  static constexpr int kWarpCols = kBlocksN / kColBlocks;
  static_assert(M % 16 == 0 && N % 16 == 0, "WMMA works on 16 x 16 blocks");
  static_assert(kWarpRows * kWarpCols <= kWarps, "more warp rectangles than warps");

  __device__ static bool active(int warp) { return warp < kWarpRows * kWarpCols; }
  __device__ static int row0(int warp) { return warp / kWarpCols * kRowBlocks * 16; }
  __device__ static int col0(int warp) { return warp % kWarpCols * kColBlocks * 16; }
};

// One warp's accumulators of an M x N product, laid out by WarpLayout<M, N, kWarps>.
template <int M, int N, int kWarps>
struct WarpTile {
  using Layout = WarpLayout<M, N, kWarps>;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[Layout::kRowBlocks][Layout::kColBlocks];

  __device__ void zero() {
    for (auto& row : acc)
      for (auto& frag : row) wmma::fill_fragment(frag, 0.0f);
  }

  // acc += A (M x K) B (K x N), A and B in shared memory.
  template <int K, typename LayoutA, typename LayoutB, typename Element>
  __device__ void mma(const Element* a, int pitch_a, const Element* b, int pitch_b, int warp) {
    static_assert(K % 16 == 0, "WMMA works on k-steps of 16");
    if (!Layout::active(warp)) return;
    const int row0 = Layout::row0(warp), col0 = Layout::col0(warp);
    for (int k = 0; k < K; k += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, Element, LayoutA> frag_a[Layout::kRowBlocks];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, Element, LayoutB> frag_b[Layout::kColBlocks];
      for (int i = 0; i < Layout::kRowBlocks; ++i) {
        wmma::load_matrix_sync(frag_a[i], a + element_offset<LayoutA>(row0 + 16 * i, k, pitch_a), pitch_a);
      }
      for (int j = 0; j < Layout::kColBlocks; ++j) {
        wmma::load_matrix_sync(frag_b[j], b + element_offset<LayoutB>(k, col0 + 16 * j, pitch_b), pitch_b);
      }
      for (int i = 0; i < Layout::kRowBlocks; ++i)
        for (int j = 0; j < Layout::kColBlocks; ++j) wmma::mma_sync(acc[i][j], frag_a[i], frag_b[j], acc[i][j]);
    }
  }

  // C (M x N, float, row-major, in shared memory) <- acc.
  __device__ void store(float* c, int pitch_c, int warp) const {
    if (!Layout::active(warp)) return;
    const int row0 = Layout::row0(warp), col0 = Layout::col0(warp);
    for (int i = 0; i < Layout::kRowBlocks; ++i)
      for (int j = 0; j < Layout::kColBlocks; ++j)
        wmma::store_matrix_sync(c + (row0 + 16 * i) * pitch_c + col0 + 16 * j, acc[i][j], pitch_c,
                                wmma::mem_row_major);
  }
};

}  // namespace tileattn::cuda::bwd
