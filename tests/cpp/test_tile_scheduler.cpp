// The sm90 forward's persistent tile scheduler (src/cuda/sm90/tile_scheduler.h) is integer
// arithmetic shared by every warp of a CTA: a slip would skip or repeat a (query block, batch,
// head) tile, i.e. leave rows of the output unwritten or written twice, silently.  Here every CTA's
// sequence of tiles is replayed on the host, as the kernels walk it, for the sweep's shapes and odd
// ones: every tile must run exactly once, and longest-first order must put longer tiles first; for
// short causal calls the groups of whole rounds must keep the CTAs' loads balanced, with square
// tiles and with d64's end-aligned 192-row ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "cuda/sm90/tile_config_sm90.h"
#include "cuda/sm90/tile_scheduler.h"

namespace {

using tileattn::cuda::sm90::PairMajor;
using tileattn::cuda::sm90::TileCoords;
using tileattn::cuda::sm90::TileScheduler;

struct Shape {
  int m_blocks, batch, heads, heads_k;
  int64_t kv_bytes_per_head;
};

// The tiles CTA `cta` runs, in order: the kernels' loop (src/cuda/sm90/producer.h, consumer.h).
std::vector<int> tiles_of_cta(const TileScheduler& s, int cta) {
  std::vector<int> tiles;
  for (int round = 0;; ++round) {
    const int tile = s.tile_of(round, cta);
    if (tile >= s.num_tiles) break;
    tiles.push_back(tile);
  }
  return tiles;
}

// How many times each tile runs over all CTAs.
std::vector<int> visits(const TileScheduler& s, int grid) {
  std::vector<int> count(static_cast<size_t>(s.num_tiles), 0);
  for (int cta = 0; cta < grid; ++cta) {
    for (int tile : tiles_of_cta(s, cta)) ++count[static_cast<size_t>(tile)];
  }
  return count;
}

void check_shape(const Shape& shape, bool longest_first, int grid, bool stagger, PairMajor pair_major) {
  const TileScheduler s = TileScheduler::make(shape.m_blocks, shape.batch, shape.heads, shape.heads_k,
                                              shape.kv_bytes_per_head, longest_first, grid, stagger, pair_major);
  SCOPED_TRACE(testing::Message() << "m_blocks " << shape.m_blocks << " batch " << shape.batch << " heads "
                                  << shape.heads << "/" << shape.heads_k << " kv bytes "
                                  << shape.kv_bytes_per_head << " longest_first " << longest_first
                                  << " grid " << grid << " stagger " << stagger << " (on: " << (s.half != 0)
                                  << ") pair-major " << s.pair_major);
  ASSERT_EQ(s.num_tiles, shape.m_blocks * shape.batch * shape.heads);
  const std::vector<int> count = visits(s, grid);
  for (int tile = 0; tile < s.num_tiles; ++tile) ASSERT_EQ(count[tile], 1) << "tile " << tile;

  std::vector<int> seen(static_cast<size_t>(s.num_tiles), 0);
  int previous_m = shape.m_blocks;
  for (int tile = 0; tile < s.num_tiles; ++tile) {
    const TileCoords c = s.coords(tile);
    ASSERT_GE(c.m_block, 0);
    ASSERT_LT(c.m_block, shape.m_blocks);
    ASSERT_GE(c.batch, 0);
    ASSERT_LT(c.batch, shape.batch);
    ASSERT_GE(c.head, 0);
    ASSERT_LT(c.head, shape.heads);
    ++seen[static_cast<size_t>((c.batch * shape.heads + c.head) * shape.m_blocks + c.m_block)];
    if (longest_first) {
      // Under a causal mask the bottom query blocks see the most keys: they must come first in
      // each group, or
      // each pair's run of them with pair-major groups.
      const int run = s.pair_major ? shape.m_blocks : s.group_pairs * shape.m_blocks;
      if (tile % run == 0) previous_m = shape.m_blocks;
      ASSERT_LE(c.m_block, previous_m) << "tile " << tile;
      previous_m = c.m_block;
    }
  }
  for (int i = 0; i < s.num_tiles; ++i) ASSERT_EQ(seen[i], 1) << "coords " << i;
}

TEST(Sm90TileScheduler, EveryTileRunsExactlyOnce) {
  constexpr int kSms = 132;  // the H200's
  std::vector<Shape> shapes;
  // The FA sweep: 16k tokens (batch = 16384 / seqlen), hidden 2048, 128-row query tiles; K/V bytes
  // of one head at bf16.
  for (int seqlen : {512, 1024, 2048, 4096, 8192, 16384}) {
    for (int dim : {64, 128, 256}) {
      shapes.push_back({seqlen / 128, 16384 / seqlen, 2048 / dim, 2048 / dim, 4ll * seqlen * dim});
    }
  }
  // Odd shapes: one tile, fewer tiles than SMs, GQA, groups that do not divide the pairs.
  shapes.push_back({1, 1, 1, 1, 256});
  shapes.push_back({3, 1, 7, 1, 4ll * 300 * 64});
  shapes.push_back({8, 3, 14, 2, 30ll << 20});
  shapes.push_back({17, 5, 6, 3, 9ll << 20});
  shapes.push_back({128, 1, 8, 8, 4ll * 16384 * 256});
  // Staggered halves (tile_scheduler.h): half-groups that divide the pairs or leave a partial one
  // of every size, an odd and an even count of them, the fewest allowed (three), a cluster grid
  // (66 slots of two query blocks, as the K/V-multicast kernel schedules) and d64's three 192-row
  // blocks at 512 tokens.
  for (int pairs : {99, 100, 131, 132, 133, 165, 512, 1024}) shapes.push_back({4, 1, pairs, pairs, 1 << 19});
  for (int pairs : {67, 99, 100, 101, 512}) shapes.push_back({2, 1, pairs, pairs, 1 << 19});
  shapes.push_back({3, 32, 32, 32, 4ll * 512 * 64});
  // Pair-major groups (K/V past the L2): the packed KV-cache route's 2 blocks of 4 heads x 64 rows
  // over 4k keys, chunked prefill's 4 blocks over 8k keys with GQA, partial last groups.
  for (int pairs : {256, 131, 200}) shapes.push_back({2, 1, pairs, pairs, 4ll * 4096 * 128});
  shapes.push_back({4, 3, 32, 8, 4ll * 8192 * 128});
  shapes.push_back({6, 5, 7, 1, 4ll * 16384 * 128});
  int staggered = 0, pair_major = 0;
  for (const Shape& shape : shapes) {
    const int tiles = shape.m_blocks * shape.batch * shape.heads;
    for (bool longest_first : {false, true}) {
      for (int grid : {std::min(tiles, kSms), 1, std::min(tiles, 7), std::min(tiles, 66), std::min(tiles, 8)}) {
        for (bool stagger : {false, true}) {
          for (PairMajor choice : {PairMajor::kAuto, PairMajor::kOn, PairMajor::kOff}) {
            check_shape(shape, longest_first, grid, stagger, choice);
            const TileScheduler s = TileScheduler::make(shape.m_blocks, shape.batch, shape.heads, shape.heads_k,
                                                        shape.kv_bytes_per_head, longest_first, grid, stagger, choice);
            staggered += s.half != 0;
            pair_major += s.pair_major;
          }
        }
      }
    }
  }
  EXPECT_GE(staggered, 20);  // the shapes above reach the staggered order
  EXPECT_GE(pair_major, 10);  // and the pair-major one
}

// The busiest CTA's load over the mean, a tile costing walk(m_block) key blocks plus one (its
// prologue and epilogue).
template <typename Walk>
double max_load_over_mean(const TileScheduler& s, int grid, Walk walk) {
  std::vector<int> load(static_cast<size_t>(grid), 0);
  for (int cta = 0; cta < grid; ++cta) {
    for (int tile : tiles_of_cta(s, cta)) load[static_cast<size_t>(cta)] += walk(s.coords(tile).m_block) + 1;
  }
  const double mean = std::accumulate(load.begin(), load.end(), 0.0) / grid;
  return *std::max_element(load.begin(), load.end()) / mean;
}

// Short causal calls go in groups of two or four rounds (tile_scheduler.h), which must keep the
// loads of the CTAs even: under a causal mask with square tiles, query block m sees m + 1 key
// blocks.
TEST(Sm90TileScheduler, ShortCausalGroupsKeepTheLoadsEven) {
  constexpr int kSms = 132;
  for (int seqlen : {256, 512, 1024, 2048}) {
    for (int dim : {64, 128, 256}) {
      const int m_blocks = seqlen / 128, batch = 16384 / seqlen, heads = 2048 / dim;
      const int grid = std::min(m_blocks * batch * heads, kSms);
      for (bool stagger : {false, true}) {
        for (PairMajor choice : {PairMajor::kAuto, PairMajor::kOn}) {
          const TileScheduler s =
              TileScheduler::make(m_blocks, batch, heads, heads, 4ll * seqlen * dim, true, grid, stagger, choice);
          SCOPED_TRACE(testing::Message() << "seqlen " << seqlen << " d" << dim << " stagger " << stagger
                                          << " pair-major " << s.pair_major);
          ASSERT_LT(s.group_pairs, s.num_pairs);  // grouped, not the whole-call order
          EXPECT_LE(max_load_over_mean(s, grid, [](int m_block) { return m_block + 1; }), 1.05);
        }
      }
    }
  }
}

// The most key blocks the call's rounds bring in from HBM in one round over their mean, a head's
// block counted in the first round any of its tiles walks it (its K/V then stays in L2), a causal
// tile m walking blocks 0..m.  Round 0 is left out: every order starts cold there.
double max_round_loads_over_mean(const TileScheduler& s, int grid) {
  std::vector<int> loaded(static_cast<size_t>(s.num_pairs), 0);  // blocks of each pair in L2
  std::vector<int> per_round;
  for (int round = 0;; ++round) {
    int fresh = 0, running = 0;
    for (int cta = 0; cta < grid; ++cta) {
      const int tile = s.tile_of(round, cta);
      if (tile >= s.num_tiles) continue;
      ++running;
      const TileCoords c = s.coords(tile);
      int& have = loaded[static_cast<size_t>(c.batch * s.num_heads + c.head)];
      fresh += std::max(0, c.m_block + 1 - have);
      have = std::max(have, c.m_block + 1);
    }
    if (running == 0) break;
    if (round > 0) per_round.push_back(fresh);
  }
  const double mean = std::accumulate(per_round.begin(), per_round.end(), 0.0) / per_round.size();
  return *std::max_element(per_round.begin(), per_round.end()) / mean;
}

// Staggered halves exist to spread the HBM loads of short causal calls over the rounds: at 512
// tokens with square 128-row tiles (132 slots at d128 and d256; and a grid of 66 cluster slots of
// two query blocks) two-round groups bring in every block in their first round and none in their second
// (2.4x the mean at d256), staggered halves the same number every round (1.12x, the last rounds
// holding fewer tiles); the CTAs' loads stay as even.
TEST(Sm90TileScheduler, StaggeredHalvesSpreadTheLoads) {
  struct Case { int m_blocks, batch, heads, grid; };
  for (const Case& c : {Case{2, 32, 16, 66}, Case{4, 32, 8, 132}, Case{4, 32, 16, 132}}) {
    SCOPED_TRACE(testing::Message() << "m_blocks " << c.m_blocks << " pairs " << c.batch * c.heads << " grid " << c.grid);
    const TileScheduler grouped = TileScheduler::make(c.m_blocks, c.batch, c.heads, c.heads, 1 << 19, true, c.grid);
    const TileScheduler staggered =
        TileScheduler::make(c.m_blocks, c.batch, c.heads, c.heads, 1 << 19, true, c.grid, true);
    ASSERT_NE(staggered.half, 0);
    const double before = max_round_loads_over_mean(grouped, c.grid);
    const double after = max_round_loads_over_mean(staggered, c.grid);
    EXPECT_GE(before, 1.8);
    EXPECT_LE(after, 1.2);
    EXPECT_LE(max_load_over_mean(staggered, c.grid, [](int m_block) { return m_block + 1; }), 1.05);
    // Pair-major groups (forced on: these groups fit the L2) spread them as evenly, each round
    // starting grid / m_blocks heads whose tiles all run in it.
    const TileScheduler pair_major =
        TileScheduler::make(c.m_blocks, c.batch, c.heads, c.heads, 1 << 19, true, c.grid, true, PairMajor::kOn);
    ASSERT_TRUE(pair_major.pair_major);
    EXPECT_LE(max_round_loads_over_mean(pair_major, c.grid), 1.2);
  }
}

// d64's tiles are 192 rows over 128-key blocks, aligned to the sequence's end under a causal mask
// (sm90_tile_first_row), so a head's walks are uneven (1, 3 and 4 blocks at 512 tokens) and the
// zigzag's pairs differ in cost; the groups' shifted slots must spread that over the CTAs.  With
// fixed slots 512 tokens came to 1.09 of the mean.
TEST(Sm90TileScheduler, EndAlignedD64GroupsKeepTheLoadsEven) {
  using tileattn::cuda::sm90::sm90_tile_first_row;
  constexpr int kSms = 132, kBlockM = 192, kBlockN = 128;
  for (int seqlen : {512, 1024, 1536, 2048}) {
    const int m_blocks = (seqlen + kBlockM - 1) / kBlockM, batch = 16384 / seqlen, heads = 32;
    const int grid = std::min(m_blocks * batch * heads, kSms);
    const auto walk = [seqlen](int m_block) {  // key blocks up to the tile's last row's
      const int first = sm90_tile_first_row(m_block, kBlockM, seqlen, true);
      return (std::min(first + kBlockM, seqlen) - 1) / kBlockN + 1;
    };
    for (bool stagger : {false, true}) {
      for (PairMajor choice : {PairMajor::kAuto, PairMajor::kOn}) {
        const TileScheduler s =
            TileScheduler::make(m_blocks, batch, heads, heads, 4ll * seqlen * 64, true, grid, stagger, choice);
        SCOPED_TRACE(testing::Message() << "seqlen " << seqlen << " stagger " << stagger << " (on: " << (s.half != 0)
                                        << ") pair-major " << s.pair_major);
        ASSERT_LT(s.group_pairs, s.num_pairs);
        EXPECT_LE(max_load_over_mean(s, grid, walk), 1.05);
      }
    }
  }
}

// Two-round groups whose K/V exceed the L2 go pair by pair (tile_scheduler.h): every head's
// tiles must then run in one round (its K/V read from HBM once), the CTAs' loads staying as even as
// the query-block-major order keeps them; groups that fit (the sweep's d256 512 tokens, 33 MB)
// keep that order, where a head's longest and shortest tiles run a round apart.
TEST(Sm90TileScheduler, PairMajorGroupsRunAHeadInOneRound) {
  constexpr int kSms = 132;
  struct Case { int m_blocks, batch, heads, heads_k; int64_t kv_bytes_per_head; bool pair_major; };
  const Case cases[] = {
      {2, 32, 8, 8, 4ll * 4096 * 128, true},     // the packed route: 64 rows x 4 heads, 4k keys
      {4, 4, 32, 8, 4ll * 8192 * 128, true},     // chunked prefill: 512 rows over 8k keys, GQA 4:1
      {4, 32, 8, 8, 4ll * 512 * 256, false},     // the sweep's d256 512
      {4, 4, 32, 8, 4ll * 1024 * 128, false},    // the same chunk over 1k keys (16.5 MB a group)
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "m_blocks " << c.m_blocks << " pairs " << c.batch * c.heads << " kv bytes "
                                    << c.kv_bytes_per_head);
    const int grid = std::min(c.m_blocks * c.batch * c.heads, kSms);
    for (bool stagger : {false, true}) {
      const TileScheduler s =
          TileScheduler::make(c.m_blocks, c.batch, c.heads, c.heads_k, c.kv_bytes_per_head, true, grid, stagger);
      ASSERT_EQ(s.pair_major, c.pair_major);
      ASSERT_LT(s.group_pairs, s.num_pairs);
      // The rounds each pair's tiles run in.
      std::vector<int> first(static_cast<size_t>(s.num_pairs), -1), last(first);
      for (int cta = 0; cta < grid; ++cta) {
        const std::vector<int> tiles = tiles_of_cta(s, cta);
        for (int round = 0; round < static_cast<int>(tiles.size()); ++round) {
          const TileCoords t = s.coords(tiles[round]);
          const size_t pair = static_cast<size_t>(t.batch * c.heads + t.head);
          first[pair] = first[pair] < 0 ? round : std::min(first[pair], round);
          last[pair] = std::max(last[pair], round);
        }
      }
      int split_heads = 0;
      for (int pair = 0; pair < s.num_pairs; ++pair) split_heads += first[pair] != last[pair];
      // (The grid, 132, is a multiple of the query blocks: no head straddles two rounds.)
      EXPECT_EQ(split_heads, c.pair_major ? 0 : s.num_pairs);
      EXPECT_LE(max_load_over_mean(s, grid, [](int m_block) { return m_block + 1; }), 1.05);
    }
  }
}

}  // namespace
