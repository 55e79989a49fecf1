// Host side of the d64 short-walk forward kernel (tile_config_sm90.h, kSm90ShortWalkD64): its
// traits and whether a call runs it.
#pragma once

#include "common/env_choice.h"
#include "cuda/sm90/kernel_traits_sm90.h"

namespace tileattn::cuda::sm90 {

// Whether a bucket has the short-walk kernel: d64 only.  Its plain-scores kernels without dropout
// (with and without sequence bounds) are built; calls with transformed scores or dropout keep the
// bucket's tile.
template <int kHeadDim>
constexpr bool short_walk_built() {
  return kHeadDim == 64;
}

template <int kHeadDim, typename Element>
using ShortWalkTraits = Sm90Traits<kHeadDim, Element, kSm90ShortWalkD64.block_n, kSm90ShortWalkD64.stages>;

// TILEATTN_FORWARD_SHORT_WALK = auto (default) | on | off, read on every call like
// TILEATTN_FORWARD_KV_MULTICAST (cluster_launch.h), so a test or an A/B can force either kernel in
// one process.  auto takes it for the calls it measured faster on: a right edge (causal, or a right
// window) and at most kSm90ShortWalkMaxKeys keys (the longest sequence's, with varlen).  on takes
// it for every call it can serve, non-causal and long ones included, which is how the tests reach
// it at every shape; it serves no left window (its mask tests only the right edge:
// left_window_sm90.h), which run_fwd_sm90 checks before asking.
inline bool use_short_walk(int seqlen_k, bool right_edge) {
  const int mode = env_choice("TILEATTN_FORWARD_SHORT_WALK", {"auto", "on", "off"});
  if (mode != 0) return mode == 1;
  return right_edge && seqlen_k <= kSm90ShortWalkMaxKeys;
}

}  // namespace tileattn::cuda::sm90
