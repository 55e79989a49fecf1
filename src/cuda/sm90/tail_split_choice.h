// Host side of the tail split (tail_split.h): whether a call runs it.
#pragma once

#include "common/env_choice.h"
#include "cuda/sm90/tail_split.h"

namespace tileattn::cuda::sm90 {

enum class TailSplitMode { kAuto, kOn, kOff };

// TILEATTN_FORWARD_TAIL_SPLIT = auto (default) | on | off, read at every sm90 forward call like
// TILEATTN_FORWARD_KV_MULTICAST (cluster_launch.h), so a test or an A/B can force either walk in
// one process, and a typo raises whatever the call.
inline TailSplitMode tail_split_mode() {
  return static_cast<TailSplitMode>(env_choice("TILEATTN_FORWARD_TAIL_SPLIT", {"auto", "on", "off"}));
}

// Only calls whose tiles are of equal length (no causal or window mask, no sequence bounds) with
// plain scores and no dropout can split (tail_split_built); auto splits where TailSplit's model
// gains at least kMinGain (20%: calls that leave most SMs idle); on splits every such call, a whole
// number of rounds and one-block tiles included, which is how the tests reach tiles cut in many
// pieces.  The d64 short-walk kernel never splits (launch_sm90.h): its calls under auto are masked.
inline bool use_tail_split(TailSplitMode mode, int num_tiles, int key_blocks, int slots) {
  if (mode == TailSplitMode::kOff || key_blocks < 1 || num_tiles < 1) return false;
  if (mode == TailSplitMode::kOn) return true;
  return TailSplit::worth_it(num_tiles, key_blocks, slots);
}

}  // namespace tileattn::cuda::sm90
