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

// The key split's pieces a tile for a sequence-bounds call of num_tiles tiles whose longest sequence
// has key_blocks key blocks (the host knows only that bound); 0: no split.  Auto cuts where the
// tiles fill at most half the slots and the longest sequence has at least kMinKeyBlocks blocks, into
// as many pieces as fit the slots, each of at least kMinBlocksPerPiece blocks of the longest
// sequence, at most kMaxParts (each piece pays a tile's boundary and a slot of partials: tail_split.h).
// On cuts every such call of at most `slots` tiles in two at least, one-block and key-less tiles
// included (the tests' way to pieces that see no key); larger calls stay whole, so the partials'
// workspace stays within two slots a CTA, as the tail split's (10,000 tiles in two at d128 would
// ask ~1.4 GB).
// The thresholds are first guesses, not A/B'd one by one; the split as a whole measured on the
// KV-cache route (H100, session 69): 1 x 16k keys x 16-128 rows 131-163 -> 52-64 us, 1 x 4k 38-47
// -> 24-29.
inline int key_split_parts(TailSplitMode mode, int num_tiles, int key_blocks, int slots) {
  constexpr int kMinKeyBlocks = 8, kMinBlocksPerPiece = 4, kMaxParts = 16;
  if (mode == TailSplitMode::kOff || num_tiles < 1) return 0;
  const int fit = slots / num_tiles;
  if (mode == TailSplitMode::kOn) return num_tiles > slots ? 0 : (fit < 2 ? 2 : (fit < kMaxParts ? fit : kMaxParts));
  if (2 * num_tiles > slots || key_blocks < kMinKeyBlocks) return 0;
  int parts = fit < kMaxParts ? fit : kMaxParts;
  if (parts > key_blocks / kMinBlocksPerPiece) parts = key_blocks / kMinBlocksPerPiece;
  return parts >= 2 ? parts : 0;
}

}  // namespace tileattn::cuda::sm90
