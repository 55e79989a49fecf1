// The decode split count (src/cuda/decode/split_heuristic.h) decides how many CTAs stream a call's
// cache and how many blocks the busiest warp of a split waits for.  The H200 measurements behind it
// (docs/perf-log.md, session 21) are pinned here as the counts they led to, with the rules every
// count must keep.
#include <gtest/gtest.h>

#include "cuda/decode/split_heuristic.h"

namespace {

using tileattn::cuda::decode::choose_num_splits;
using tileattn::cuda::decode::choose_split_plan;
using tileattn::cuda::decode::kMaxSplits;
using tileattn::cuda::decode::kWarps;
using tileattn::cuda::decode::RingWave;

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

// The wide ring (32-key blocks at d128, one CTA an SM), which serves the grids of at most one CTA an
// SM (cuda_decode.cu, session 40): 12 and 16 sequences x 8 KV heads at 2k stay unsplit, one CTA a
// (sequence, KV head) as cuDNN runs them; batch 8 takes 2 splits (128 CTAs), batch 1 16.
TEST(SplitHeuristic, WideRingCounts) {
  constexpr int kWideResident = 132, kWideBlock = 32;
  EXPECT_EQ(choose_num_splits(0, 12 * 8, kWideResident, 2048, kWideBlock), 1);
  for (int keys : {2048, 8192, 32768}) {
    EXPECT_EQ(choose_num_splits(0, 16 * 8, kWideResident, keys, kWideBlock), 1) << keys;
    EXPECT_EQ(choose_num_splits(0, 8 * 8, kWideResident, keys, kWideBlock), 2) << keys;
    EXPECT_EQ(choose_num_splits(0, 8, kWideResident, keys, kWideBlock), 16) << keys;
  }
}

// Grids that fit one CTA an SM unsplit but whose wide-ring plan takes a second wave: there the
// wide ring lost 1-30% to the narrow one on the H200, so cuda_decode.cu's ring_chosen gives
// them the narrow ring (session 45).  10 x 8 KV heads x 2k: 3 splits, 240 CTAs on 132 SMs; 12 x 4k:
// 4 splits.  The grids it keeps fit: 12 x 2k (96), 16 x 8k (128), 8 x 2k (2 splits, 128).
TEST(SplitHeuristic, WideRingPlansThatTakeASecondWave) {
  constexpr int kWideResident = 132, kWideBlock = 32;
  auto ctas_of_plan = [&](int ctas, int keys) {
    return ctas * choose_num_splits(0, ctas, kWideResident, keys, kWideBlock);
  };
  EXPECT_EQ(ctas_of_plan(10 * 8, 2048), 240);
  EXPECT_EQ(ctas_of_plan(12 * 8, 4096), 384);
  EXPECT_GT(ctas_of_plan(12 * 8, 8192), kWideResident);
  EXPECT_LE(ctas_of_plan(12 * 8, 2048), kWideResident);
  EXPECT_LE(ctas_of_plan(16 * 8, 8192), kWideResident);
  EXPECT_LE(ctas_of_plan(8 * 8, 2048), kWideResident);
}

// CTAs resident in clusters of s on the H200 at two CTAs an SM (cudaOccupancyMaxActiveClusters x s,
// measured in session 35): a GPC's SMs do not divide evenly from 3 up.
constexpr int kH200ClusterResident[9] = {0, 0, 264, 237, 248, 235, 234, 224, 240};

TEST(SplitHeuristic, ClusterMergeWhereItAddsNoWave) {
  // 16 x 8 KV heads at 2 splits: 128 clusters of 2 fit one wave; the cluster merge, no combine.
  for (int keys : {2048, 8192, 32768}) {
    const auto plan = choose_split_plan(0, 16 * 8, kTmaResident, kH200ClusterResident, keys, kBlock);
    EXPECT_EQ(plan.splits, 2) << keys;
    EXPECT_TRUE(plan.cluster) << keys;
  }
  // 8 x 8 KV heads at 4 splits: 64 clusters of 4 where 62 fit (a second wave cost 25% on the
  // H200), so the combine kernel keeps them.
  const auto eight = choose_split_plan(0, 8 * 8, kTmaResident, kH200ClusterResident, 8192, kBlock);
  EXPECT_EQ(eight.splits, 4);
  EXPECT_FALSE(eight.cluster);
  // 4 x 8 KV heads x 2k: 7 splits in clusters tie with 8 splits and the combine in the model; the
  // tie goes to the combine's 8 (15.7 us against 18.3 us a call on the H200).
  const auto four = choose_split_plan(0, 4 * 8, kTmaResident, kH200ClusterResident, 2048, kBlock);
  EXPECT_EQ(four.splits, 8);
  EXPECT_FALSE(four.cluster);
  // 1 x 8 KV heads x 2k: 32 splits, past a cluster's 8, so the combine.
  const auto one = choose_split_plan(0, 8, kTmaResident, kH200ClusterResident, 2048, kBlock);
  EXPECT_EQ(one.splits, 32);
  EXPECT_FALSE(one.cluster);
  // A requested count takes the cluster only within one wave; nullptr turns it off.
  EXPECT_TRUE(choose_split_plan(2, 16 * 8, kTmaResident, kH200ClusterResident, 8192, kBlock).cluster);
  EXPECT_FALSE(choose_split_plan(4, 8 * 8, kTmaResident, kH200ClusterResident, 8192, kBlock).cluster);
  EXPECT_FALSE(choose_split_plan(2, 16 * 8, kTmaResident, nullptr, 8192, kBlock).cluster);
  EXPECT_FALSE(choose_split_plan(16, 1, kTmaResident, kH200ClusterResident, 8192, kBlock).cluster);  // > 8
}

// The plans cuda_decode.cu's three-CTA ring rule compares (session 46): three CTAs an SM give 396
// slots on the H200, and the rule takes that ring where its plan fills at least 90% of one wave and
// the plan of the ring chosen before does not.
TEST(SplitHeuristic, ThreeCtaRingPlans) {
  constexpr int kThreeResident = 3 * 132, kWideResident = 132, kWideBlock = 32;
  auto wave = [](int ctas, int resident, int keys, int block) {
    const int splits = choose_num_splits(0, ctas, resident, keys, block);
    return RingWave{int64_t{ctas} * splits, splits, resident};
  };
  // 24 x 2k: 192 narrow CTAs fill 73% of 264; three CTAs an SM take 2 splits, 384 of 396.
  EXPECT_FALSE(wave(24 * 8, kTmaResident, 2048, kBlock).fills_one_wave());
  const RingWave three24 = wave(24 * 8, kThreeResident, 2048, kBlock);
  EXPECT_EQ(three24.splits, 2);
  EXPECT_TRUE(three24.fills_one_wave());
  // 12 x 4k: 96 wide CTAs (73% of 132); three CTAs an SM: 4 splits, 384.
  EXPECT_FALSE(wave(12 * 8, kWideResident, 4096, kWideBlock).fills_one_wave());
  const RingWave three12 = wave(12 * 8, kThreeResident, 4096, kBlock);
  EXPECT_EQ(three12.splits, 4);
  EXPECT_TRUE(three12.fills_one_wave());
  // 48 x 2k: the narrow plan (2 splits, 768 CTAs) runs three waves; three CTAs an SM, one unsplit.
  EXPECT_FALSE(wave(48 * 8, kTmaResident, 2048, kBlock).fills_one_wave());
  const RingWave three48 = wave(48 * 8, kThreeResident, 2048, kBlock);
  EXPECT_EQ(three48.splits, 1);
  EXPECT_TRUE(three48.fills_one_wave());
  // Plans that already fill their wave keep their ring: 32 x 2k (256 of 264), 16 x 8k (128 wide
  // CTAs), 8 x 2k (2 wide splits, 128).  20 x 4k: three CTAs an SM would fill only 320 of 396.
  EXPECT_TRUE(wave(32 * 8, kTmaResident, 2048, kBlock).fills_one_wave());
  EXPECT_TRUE(wave(16 * 8, kWideResident, 8192, kWideBlock).fills_one_wave());
  EXPECT_TRUE(wave(8 * 8, kWideResident, 2048, kWideBlock).fills_one_wave());
  EXPECT_FALSE(wave(20 * 8, kThreeResident, 4096, kBlock).fills_one_wave());
  // A second wave is never full: 397 CTAs on 396 slots.
  EXPECT_FALSE((RingWave{397, 1, 396}.fills_one_wave()));
}

}  // namespace
