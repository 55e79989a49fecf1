// Key blocks from pages that do not hold whole key blocks (the KV-cache route, pages of 16-112 rows
// or any size that is not a multiple of block_n; vLLM's pages are 16 rows).  A block of kBlockN
// keys then spans several pages, so it comes in boxes of
//   box_rows = gcd(kBlockN, page_size)
// rows: a box starts at a multiple of box_rows, which divides page_size, so it never crosses a page.
// Each box is one TMA load per 64 columns (the 128-byte swizzle's width) through a tensor map of the
// pages as (D, page_size, Hk, num_blocks), landing at its rows of the stage's swizzled tile: box_rows
// is a multiple of 16 (validate.cpp: pages are multiples of 16 rows), so every box starts on a
// 1 KB boundary of 8 swizzled 128-byte rows and TMA's address-based swizzle writes the same bytes
// the whole block's load would.  Pages of 16 at d128: 8 boxes x 2 loads a key block instead of 2.
// Boxes wholly past the sequence's keys are not loaded (their block_table entries need not be
// pages); the consumers mask those rows as they mask a whole block's rows past the keys
// (sequence_bounds_sm90.h), whatever the stage held before.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <numeric>
#include <type_traits>

#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "cuda/launch_api.h"
#include "cuda/sm90/pipeline_sm90.h"
#include "cuda/tensor_map_encoder.h"
#include "tileattn/tileattn.hpp"

namespace tileattn::cuda::sm90 {

// Rows of one box for pages of page_size rows under kBlockN-key blocks; 0 when pages hold whole
// blocks (the producer's one-load-a-block path reads them).
template <int kBlockN>
inline int page_box_rows(int page_size) {
  return page_size % kBlockN == 0 ? 0 : std::gcd(kBlockN, page_size);
}

// The pages (num_blocks, page_size, Hk, D) of k or v as TMA's (D, page_size, Hk, num_blocks), boxes
// of (64, box_rows, 1, 1) with the 128-byte swizzle (the forward's K/V tiles).  Columns past
// head_dim (a smaller head dim in its bucket) come in as zeros, as through the whole-block load.
// L2 promotion of 128 bytes, as CuTe's maps of the whole-block load.
template <typename Element>
void encode_page_box_map(CUtensorMap* map, const void* pages, int head_dim, int page_size,
                                int heads_k, int num_blocks, int64_t row_stride, int64_t head_stride,
                                int64_t page_stride, int box_rows, const char* argument) {
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(page_size),
                              static_cast<cuuint64_t>(heads_k), static_cast<cuuint64_t>(num_blocks)};
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(box_rows), 1, 1};
  const CUtensorMapDataType type = std::is_same_v<Element, cutlass::bfloat16_t> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                                               : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  // The route asked sm90_forward_serves first, whose TMA rules (16-byte base and strides) are the
  // ones the driver checks here, so a refusal is the library's fault, not the caller's.
  if (!encode_swizzled_map_4d(map, type, pages, dims, {row_stride, head_stride, page_stride}, box,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_128B)) {
    throw Error(ErrorCode::kInternal, argument, "sm90 forward: the driver refused the pages' TMA tensor map");
  }
}

// One lane's box of a key block: box `lane` of block n, boxes of box_rows rows (page_box_rows),
// each lane of the warp that issues a tensor's loads taking one (at most kBlockN / 16 = 8 boxes a
// block, pages being multiples of 16 rows).  `live` is false for a lane past the block's boxes or
// a box wholly past the sequence's keys, whose table entry need not be a page and is not read.
struct PageBox {
  int page;
  int page_row;
  bool live;
};

// Where lane `lane`'s box of key block n of cache entry `entry` (keys [n kBlockN, (n + 1)
// kBlockN), of which `keys` exist) lies.  The producer reads it before it waits for the stage the
// box goes to: the table entry is a global read (~550 cycles on an H100 by session 64's numbers),
// and read after the stage's release it stood on every block's critical path (docs/perf-log.md).
template <typename Traits>
__device__ __forceinline__ PageBox page_box_of_lane(KvIndex const& kv, int box_rows, int entry, int n, int keys,
                                                    int lane) {
  static_assert(Traits::kBlockN / 16 <= 32, "a box a lane: kBlockN / 16 boxes at most");
  const int row = n * Traits::kBlockN + lane * box_rows;
  PageBox box{0, 0, lane * box_rows < Traits::kBlockN && row < keys};
  if (box.live) {
    const int page_index = row / kv.page_size;
    box.page_row = row - page_index * kv.page_size;
    box.page = kv.block_table[static_cast<int64_t>(entry) * kv.table_stride + page_index];
  }
  return box;
}

// Key block n into the stage at `stage_tile` (the stage's first element, kKVTileElems a stage),
// its transaction counted on `full`: called by every lane of the issuing warp with its own box
// (page_box_of_lane); lane 0 also arrives with the bytes of all the block's live boxes.  A box
// needs no order against the others or against lane 0's arrival: the barrier's phase cannot
// complete before that arrival, and the transaction count may dip below zero until then.
template <typename Traits>
__device__ __forceinline__ void load_page_box(CUtensorMap const& map, PageBox const& box, int box_rows, int n,
                                              int keys, int kv_head, typename Traits::Element* stage_tile,
                                              uint64_t& full, int lane) {
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kColumnSlabs = Traits::kHeadDim / 64;
  // The stage's tile is 8 x 64 swizzle atoms stacked down the rows first, then across the column
  // slabs (tile_to_shape's column-major order): row r of slab c starts at element r * 64 + c *
  // kBlockN * 64 for rows r that are multiples of 8, where the swizzle leaves offsets alone.
  constexpr int kSlabElems = kBlockN * 64;
  using Grid = decltype(typename Traits::SmemLayoutKV{}.layout_b());  // the tile's layout before the swizzle
  static_assert(decltype(Grid{}(cute::Int<8>{}, cute::_0{}, cute::_0{}))::value == 8 * 64,
                "a stage's rows of one column slab are 64 elements apart");
  static_assert(kColumnSlabs == 1 ||
                    decltype(Grid{}(cute::_0{}, cute::Int<64>{}, cute::_0{}))::value ==
                        kSlabElems,
                "a stage's column slabs are kBlockN rows apart");
  static_assert(decltype(Grid{}(cute::_0{}, cute::_0{}, cute::_1{}))::value ==
                    Traits::kKVTileElems,
                "stages are kKVTileElems apart");
  if (lane == 0) {
    const int first = n * kBlockN;
    const int boxes = min(kBlockN / box_rows, (keys - first + box_rows - 1) / box_rows);
    constexpr uint32_t kSlabRowBytes = 64 * sizeof(typename Traits::Element);
    FullBarrier::arrive_and_expect_tx(&full, static_cast<uint32_t>(boxes * box_rows) * kSlabRowBytes * kColumnSlabs);
  }
  if (!box.live) return;
  typename Traits::Element* box_tile = stage_tile + lane * box_rows * 64;
#pragma unroll
  for (int c = 0; c < kColumnSlabs; ++c) {
    cute::SM90_TMA_LOAD_4D::copy(&map, &full, static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL),
                                 box_tile + c * kSlabElems, c * 64, box.page_row, kv_head, box.page);
  }
}

}  // namespace tileattn::cuda::sm90
