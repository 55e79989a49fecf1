// Where the sm90 forward's query tiles start (sm90_tile_first_row in src/cuda/sm90/tile_config_sm90.h).
// Under a right-edged mask the tiles are aligned to the sequence's end, the padding moved into the
// first tile in whole 64-row consumers.  A slip here would leave rows unwritten, write rows twice or
// split a consumer's 64 rows between real and padding (its TMA box would then clip or overwrite),
// silently: so every row is checked to land in exactly one tile, and the shift must never lengthen
// a causal call's walk.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "cuda/sm90/tile_config_sm90.h"

namespace {

using tileattn::cuda::sm90::kRowsPerConsumer;
using tileattn::cuda::sm90::sm90_tile_first_row;

int num_m_blocks(int seqlen_q, int block_m) { return (seqlen_q + block_m - 1) / block_m; }

// Key blocks of `block_n` that a causal (Sq == Sk) tile starting at `first` walks: up to its last row's.
int causal_blocks(int first, int block_m, int block_n, int seqlen_q) {
  const int last_row = std::min(first + block_m, seqlen_q) - 1;
  return last_row / block_n + 1;
}

TEST(TileFirstRow, EveryRowInExactlyOneTileAndConsumersWhole) {
  for (int block_m : {128, 192}) {
    for (bool right_edge : {false, true}) {
      for (int seqlen_q = 1; seqlen_q <= 2100; ++seqlen_q) {
        std::vector<int> hits(seqlen_q, 0);
        const int tiles = num_m_blocks(seqlen_q, block_m);
        for (int m = 0; m < tiles; ++m) {
          const int first = sm90_tile_first_row(m, block_m, seqlen_q, right_edge);
          ASSERT_EQ(first % kRowsPerConsumer, 0) << "block_m " << block_m << " seqlen_q " << seqlen_q << " m " << m;
          if (!right_edge) ASSERT_EQ(first, m * block_m);
          for (int r = first; r < first + block_m; ++r) {
            if (r >= 0 && r < seqlen_q) ++hits[r];
          }
          // Every tile holds at least one real consumer, and padding below the end is under 64 rows
          // when the tiles are end-aligned.
          ASSERT_GT(first + block_m, 0);
          ASSERT_LT(first, seqlen_q);
          if (right_edge && m == tiles - 1) ASSERT_LT(first + block_m - seqlen_q, kRowsPerConsumer);
        }
        for (int r = 0; r < seqlen_q; ++r) {
          ASSERT_EQ(hits[r], 1) << "block_m " << block_m << " seqlen_q " << seqlen_q << " row " << r;
        }
      }
    }
  }
}

TEST(TileFirstRow, EndAlignedCausalWalkIsNeverLonger) {
  // d64 (192-row tiles, 128-key blocks): 512 tokens 9 -> 8 tile-blocks, 1k 32 -> 27.
  for (int seqlen_q = 1; seqlen_q <= 8192; ++seqlen_q) {
    for (int block_m : {128, 192}) {
      for (int block_n : {64, 128}) {
        int top = 0, end = 0;
        for (int m = 0; m < num_m_blocks(seqlen_q, block_m); ++m) {
          top += causal_blocks(sm90_tile_first_row(m, block_m, seqlen_q, false), block_m, block_n, seqlen_q);
          end += causal_blocks(sm90_tile_first_row(m, block_m, seqlen_q, true), block_m, block_n, seqlen_q);
        }
        ASSERT_LE(end, top) << "seqlen_q " << seqlen_q << " block_m " << block_m << " block_n " << block_n;
        if (seqlen_q == 512 && block_m == 192 && block_n == 128) EXPECT_EQ(top - end, 1);
        if (seqlen_q == 1024 && block_m == 192 && block_n == 128) EXPECT_EQ(top - end, 5);
      }
    }
  }
}

}  // namespace
