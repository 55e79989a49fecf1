// TILEATTN_FORWARD_STAGGER = auto (default) | on | off: whether the sm90 forward's tile scheduler
// runs short causal or windowed calls in staggered halves (tile_scheduler.h), read on every call
// like TILEATTN_FORWARD_KV_MULTICAST, so an A/B or a test can take either order in one process.
// Wherever the scheduler can stagger (longest-first groups of exactly two rounds, an even grid that
// the query blocks divide: 512 tokens at 128-row tiles on 132 SMs, d64's 192-row tiles at 512-1k),
// auto takes it for the d128 and d256 buckets and leaves d64 on the plain two-round groups; on
// takes it for every bucket, off for none.  Measured on the H200 (session 55, two A/Bs of three
// runs a side in both orders, fa shapes, causal): d256 512 +4.7-4.9%, d128 512 +1.0-1.6% (its
// GQA 16/2 variant 97.4 -> 96.1 us, MHA 107.6 -> 100.5), d64 512 -0.3 to -0.5% and 1k -0.7 to -0.9%
// with both orders agreeing, so d64 keeps its order.  A d64 head's K/V are half a d128 head's
// bytes, so its first rounds load half as much.
#pragma once

#include "common/env_choice.h"

namespace tileattn::cuda::sm90 {

inline bool use_staggered_halves(int head_dim_bucket) {
  constexpr int kMinAutoHeadDim = 128;
  const int mode = env_choice("TILEATTN_FORWARD_STAGGER", {"auto", "on", "off"});
  if (mode != 0) return mode == 1;
  return head_dim_bucket >= kMinAutoHeadDim;
}

}  // namespace tileattn::cuda::sm90
