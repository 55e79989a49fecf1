// Host side of the d64 short-walk forward kernel (tile_config_sm90.h, kSm90ShortWalkD64): its
// traits and whether a call runs it.
#pragma once

#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda/sm90/kernel_traits_sm90.h"
#include "tileattn/tileattn.hpp"

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
// it at every shape.
inline bool use_short_walk(int seqlen_k, bool right_edge) {
  constexpr const char* kVariable = "TILEATTN_FORWARD_SHORT_WALK";
  const char* mode = std::getenv(kVariable);
  if (mode == nullptr || mode[0] == '\0' || std::strcmp(mode, "auto") == 0) {
    return right_edge && seqlen_k <= kSm90ShortWalkMaxKeys;
  }
  if (std::strcmp(mode, "on") == 0) return true;
  if (std::strcmp(mode, "off") == 0) return false;
  throw Error(ErrorCode::kInvalidArgument, kVariable,
              std::string(kVariable) + " must be auto, on or off, got '" + mode + "'");
}

}  // namespace tileattn::cuda::sm90
