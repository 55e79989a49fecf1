// TILEATTN_FORWARD_PAIR_MAJOR = auto (default) | on | off: whether the sm90 forward's tile scheduler
// runs the tiles of a causal or windowed call's two-round groups (batch, head) pair by pair
// (tile_scheduler.h), read on every call like TILEATTN_FORWARD_STAGGER, so an A/B or a test can take
// either order in one process.  auto: where a group's K/V exceed the L2 (queries a few blocks long
// over long keys), on: wherever a group is two rounds (staggered halves then never apply), off:
// never.
#pragma once

#include "common/env_choice.h"
#include "cuda/sm90/tile_scheduler.h"

namespace tileattn::cuda::sm90 {

inline PairMajor pair_major_choice() {
  const int mode = env_choice("TILEATTN_FORWARD_PAIR_MAJOR", {"auto", "on", "off"});
  return mode == 1 ? PairMajor::kOn : mode == 2 ? PairMajor::kOff : PairMajor::kAuto;
}

}  // namespace tileattn::cuda::sm90
