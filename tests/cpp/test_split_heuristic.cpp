// The decode split count (src/cuda/decode/split_heuristic.h) decides how many CTAs stream a call's
// cache and how many blocks the busiest warp of a split waits for.  The H200 measurements behind it
// (docs/perf-log.md, session 21) are pinned here as the counts they led to, with the rules every
// count must keep.
#include <gtest/gtest.h>

#include "cuda/decode/split_heuristic.h"

namespace {

using tileattn::cuda::decode::choose_num_splits;
using tileattn::cuda::decode::kMaxSplits;
using tileattn::cuda::decode::kWarps;

constexpr int kTmaResident = 2 * 132;       // TMA loop: two CTAs an SM on 132 SMs
constexpr int kRegisterResident = 3 * 132;  // register loop: three
constexpr int kBlock = 16;                  // keys a chunk at d128, both loops

TEST(SplitHeuristic, BatchOneFillsOneWaveWithEvenWarps) {
  // 1 sequence x 8 KV heads: 32 splits give every warp the same number of 16-key blocks up to
  // 32k keys (the old rule's 30 gave the first warp of a 4k split 3 blocks and the others 2).
  for (int keys : {2048, 4096, 8192, 32768}) {
    EXPECT_EQ(choose_num_splits(0, 8, kTmaResident, keys, kBlock), 32) << keys;
  }
  // 128k: 8192 blocks, 33 splits' busiest warp has 63 where 32 splits' has 64.
  EXPECT_EQ(choose_num_splits(0, 8, kTmaResident, 131072, kBlock), 33);
  // Three CTAs an SM: up to 49 splits in one wave; 47 is the fewest whose busiest warp has 11.
  EXPECT_EQ(choose_num_splits(0, 8, kRegisterResident, 32768, kBlock), 47);
}

TEST(SplitHeuristic, LargerBatchesKeepOneOrFewWaves) {
  for (int keys : {2048, 8192, 131072}) {
    EXPECT_EQ(choose_num_splits(0, 8 * 8, kTmaResident, keys, kBlock), 4) << keys;    // 256 of 264 slots
    EXPECT_EQ(choose_num_splits(0, 16 * 8, kTmaResident, keys, kBlock), 2) << keys;   // 256 again
    EXPECT_EQ(choose_num_splits(0, 32 * 8, kTmaResident, keys, kBlock), 1) << keys;   // already a wave
    EXPECT_EQ(choose_num_splits(0, 128 * 8, kTmaResident, keys, kBlock), 1) << keys;  // four waves
  }
}

TEST(SplitHeuristic, APoorlyFilledLastWaveIsSplit) {
  // 300 unsplit CTAs on 264 slots leave the second wave 14% full; splitting evens the waves out.
  EXPECT_EQ(choose_num_splits(0, 300, kTmaResident, 8192, kBlock), 5);
}

TEST(SplitHeuristic, EveryWarpOfASplitHasAChunk) {
  for (int keys : {1, 16, 17, 63, 64, 65, 1000, 4096, 100000}) {
    for (int64_t ctas : {1, 7, 8, 64, 1000}) {
      const int splits = choose_num_splits(0, ctas, kTmaResident, keys, kBlock);
      const int chunks = (keys + kBlock - 1) / kBlock;
      EXPECT_GE(splits, 1);
      EXPECT_LE(splits, kMaxSplits);
      if (splits > 1) EXPECT_GE(chunks, splits * kWarps) << keys << " keys, " << ctas << " CTAs";
    }
  }
}

TEST(SplitHeuristic, RequestedCountIsHonouredWithinBounds) {
  EXPECT_EQ(choose_num_splits(5, 8, kTmaResident, 32768, kBlock), 5);
  EXPECT_EQ(choose_num_splits(500, 8, kTmaResident, 1 << 20, kBlock), kMaxSplits);
  EXPECT_EQ(choose_num_splits(8, 8, kTmaResident, 48, kBlock), 3);  // 3 chunks
}

}  // namespace
