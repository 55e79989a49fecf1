// What the sm90 kernel receives (one __grid_constant__ struct): the four TMA descriptors, the
// global shapes they were built for, the tile order, and the sm80 family's per-call arguments.
#pragma once

#include <cuda.h>

#include <cute/tensor.hpp>

#include "cuda/launch_api.h"
#include "cuda/sm90/tail_split.h"
#include "cuda/sm90/tile_scheduler.h"

namespace tileattn::cuda::sm90 {

template <typename Traits>
struct Sm90Params {
  typename Traits::TmaQ tma_q;
  typename Traits::TmaKV tma_k;
  typename Traits::TmaKV tma_v;
  typename Traits::TmaO tma_o;
  // (rows, head_dim, heads, batch) of q/out and of k/v: get_tma_tensor needs them again.
  cute::Shape<int32_t, int32_t, int32_t, int32_t> q_shape;
  cute::Shape<int32_t, int32_t, int32_t, int32_t> kv_shape;
  TileScheduler scheduler;
  FwdKernelArgs args;
  // Pages that do not hold whole key blocks (paged_boxes_sm90.h): the rows of a box, 0 otherwise,
  // and the pages of k and v as its tensor maps (encoded only when page_box_rows > 0).
  int page_box_rows;
  CUtensorMap k_pages;
  CUtensorMap v_pages;
  // The tail split (tail_split.h; TailSplit::off() when the call runs whole tiles only): the
  // pieces' partial results, (2 x grid slots, cluster rank, consumer, value, thread) floats, and
  // the cut tiles' arrival counters, (tile, cluster rank, consumer) ints, zeroed per call.
  TailSplit split;
  float* split_partials;
  int* split_counters;
};

}  // namespace tileattn::cuda::sm90
