// The sm90 forward's tail split (src/cuda/sm90/tail_split.h): every CTA's pieces replayed on the
// host as the kernels walk them.  A slip would leave key blocks of a tile out of its output or count
// them twice, or make two pieces share a workspace slot or disagree on a tile's piece count (the
// last arrival would then never merge, or merge early), all silently.  Also the auto rule's model
// on the sweep's shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "cuda/sm90/tail_split.h"
#include "cuda/sm90/tail_split_choice.h"

namespace {

using tileattn::cuda::sm90::PieceMerge;
using tileattn::cuda::sm90::piece_merge;
using tileattn::cuda::sm90::TailSplit;
using tileattn::cuda::sm90::key_split_parts;
using tileattn::cuda::sm90::TailSplitMode;
using tileattn::cuda::sm90::TilePiece;

// The pieces CTA `cta` runs after its whole-tile rounds, in order.
std::vector<TilePiece> pieces_of_cta(const TailSplit& s, int cta, int num_tiles) {
  std::vector<TilePiece> out;
  for (int index = 0;; ++index) {
    const TilePiece p = s.piece(index, cta);
    if (p.tile >= num_tiles) break;
    out.push_back(p);
  }
  return out;
}

void check_split(int num_tiles, int blocks, int slots) {
  SCOPED_TRACE(testing::Message() << num_tiles << " tiles of " << blocks << " blocks on " << slots << " SMs");
  int grid = 0;
  const TailSplit s = TailSplit::make(num_tiles, blocks, slots, &grid);
  ASSERT_GE(grid, 1);
  ASSERT_LE(grid, slots);
  ASSERT_EQ(s.first_tile, s.dp_rounds * slots);
  ASSERT_LE(s.first_tile, num_tiles);
  // Whole-tile rounds use the full grid: a split with fewer CTAs has none.
  if (s.dp_rounds > 0) ASSERT_EQ(grid, slots);
  const int split_tiles = num_tiles - s.first_tile;
  ASSERT_GT(split_tiles, 0);

  std::vector<std::vector<int>> covered(static_cast<size_t>(split_tiles), std::vector<int>(blocks, 0));
  std::map<int, std::set<int>> ctas_of_tile;  // local tile -> CTAs with a piece of it
  std::map<int, int> pieces_of_tile;
  std::set<int> slots_used;
  for (int cta = 0; cta < grid; ++cta) {
    const std::vector<TilePiece> pieces = pieces_of_cta(s, cta, num_tiles);
    ASSERT_FALSE(pieces.empty()) << "cta " << cta;  // every CTA has at least one step
    for (size_t i = 0; i < pieces.size(); ++i) {
      const TilePiece& p = pieces[i];
      const int t = p.tile - s.first_tile;
      ASSERT_GE(t, 0);
      ASSERT_LT(t, split_tiles);
      ASSERT_LT(p.n_lo, p.n_hi);
      ASSERT_GE(p.n_lo, 0);
      ASSERT_LE(p.n_hi, blocks);
      // Pieces between a CTA's first and last are whole tiles.
      if (i > 0 && i + 1 < pieces.size()) ASSERT_EQ(p.n_hi - p.n_lo, blocks);
      for (int n = p.n_lo; n < p.n_hi; ++n) ++covered[static_cast<size_t>(t)][static_cast<size_t>(n)];
      ctas_of_tile[t].insert(cta);
      pieces_of_tile[t] = s.pieces_of(t);
      // The kernels take a piece shorter than its tile for a cut one (tail_merge_sm90.h).
      ASSERT_EQ(p.n_hi - p.n_lo < blocks, s.pieces_of(t) > 1) << "tile " << t;
      if (s.pieces_of(t) > 1) {
        const int slot = s.slot_of(cta, t);
        ASSERT_TRUE(slots_used.insert(slot).second) << "slot " << slot << " twice";
        ASSERT_GE(slot, 0);
        ASSERT_LT(slot, 2 * grid);
      }
    }
  }
  for (int t = 0; t < split_tiles; ++t) {
    for (int n = 0; n < blocks; ++n) ASSERT_EQ(covered[t][n], 1) << "tile " << t << " block " << n;
    ASSERT_EQ(static_cast<int>(ctas_of_tile[t].size()), pieces_of_tile[t]) << "tile " << t;
    // The merge walks CTAs cta_of(first step) .. cta_of(last step): exactly the tile's CTAs.
    const int64_t first = static_cast<int64_t>(t) * blocks;
    const int lo = s.cta_of(first), hi = s.cta_of(first + blocks - 1);
    ASSERT_EQ(*ctas_of_tile[t].begin(), lo);
    ASSERT_EQ(*ctas_of_tile[t].rbegin(), hi);
    ASSERT_EQ(hi - lo + 1, pieces_of_tile[t]);
  }
  // From three rounds on, each CTA takes more than a tile's steps: no tile is cut more than in two.
  if ((num_tiles + slots - 1) / slots > 2) {
    for (const auto& [t, count] : pieces_of_tile) ASSERT_LE(count, 2) << "tile " << t;
  }
}

TEST(Sm90TailSplit, EveryKeyBlockRunsExactlyOnce) {
  constexpr int kSms = 132;  // the H200's; 66 clusters of two for the K/V-multicast kernel
  for (int slots : {kSms, 66, 7, 1}) {
    // The sweep's non-causal tiles (2048 at d128, 1024 at d256, 2731-3072 at d64 over 192 rows)
    // and their key blocks from 512 to 16k tokens; odd counts below, at and above the grid.
    for (int num_tiles : {1, 2, 5, 17, 66, 67, 131, 132, 133, 200, 263, 264, 265, 1000, 1024, 2048, 2731}) {
      for (int blocks : {1, 2, 3, 4, 7, 16, 64, 128, 256}) check_split(num_tiles, blocks, slots);
    }
  }
}

// The key split (sequence-bounds kernels): every (tile, part) unit run by exactly one CTA, each
// writing its own slot, the merge's slots exactly the tile's pieces in part order, and the shares of
// any device range [lo, hi) covering it once, in order, empty ranges (hi <= lo) giving empty shares.
TEST(Sm90TailSplit, KeySplitRunsEveryPieceOnceAndSharesCoverTheRange) {
  for (int slots : {132, 7, 1}) {
    for (int num_tiles : {1, 2, 3, 8, 32, 65, 66, 200}) {
      for (int parts : {2, 3, 4, 16}) {
        SCOPED_TRACE(testing::Message() << num_tiles << " tiles x " << parts << " parts on " << slots << " SMs");
        int grid = 0;
        const TailSplit s = TailSplit::key_split(num_tiles, parts, slots, &grid);
        ASSERT_EQ(grid, std::min(num_tiles * parts, slots));
        ASSERT_EQ(s.first_tile, 0);
        ASSERT_EQ(s.slots(), static_cast<int64_t>(num_tiles) * parts);
        std::map<std::pair<int, int>, int> runs;
        std::set<int> slots_used;
        for (int cta = 0; cta < grid; ++cta) {
          const std::vector<TilePiece> pieces = pieces_of_cta(s, cta, num_tiles);
          ASSERT_FALSE(pieces.empty());
          for (const TilePiece& p : pieces) {
            ASSERT_EQ(p.parts, parts);
            ASSERT_GE(p.part, 0);
            ASSERT_LT(p.part, parts);
            ASSERT_EQ(s.pieces_of(p.tile), parts);
            ++runs[{p.tile, p.part}];
            const int slot = s.own_slot(cta, p.tile, p);
            ASSERT_TRUE(slots_used.insert(slot).second) << "slot " << slot << " twice";
            ASSERT_EQ(slot, s.slot_at(p.tile, p.part));  // the merge reads it back in part order
          }
        }
        ASSERT_EQ(static_cast<int>(runs.size()), num_tiles * parts);
        for (const auto& [unit, count] : runs) ASSERT_EQ(count, 1) << unit.first << "/" << unit.second;
      }
    }
  }
  for (int parts : {2, 3, 5, 16}) {
    for (int lo : {0, 3}) {
      for (int hi : {-1, 0, 1, 2, 3, 4, 7, 17, 128, 1000}) {
        int next = lo;
        for (int part = 0; part < parts; ++part) {
          const TailSplit::Share share = TailSplit::share_of(lo, hi, part, parts);
          ASSERT_EQ(share.first, next) << lo << ".." << hi << " part " << part;
          ASSERT_LE(share.first, share.last);
          next = share.last;
        }
        ASSERT_EQ(next, std::max(lo, hi)) << lo << ".." << hi;
      }
    }
  }
}

// Auto's key split: only calls whose tiles fill at most half of the 132 slots, over at least 8 key
// blocks of the longest sequence, into as many parts as fit, each at least 4 blocks, at most 16;
// `on` cuts every call, `off` none.
TEST(Sm90TailSplit, KeySplitPartsFollowTheRule) {
  const TailSplitMode a = TailSplitMode::kAuto;
  EXPECT_EQ(key_split_parts(a, 32, 128, 132), 4);   // 32 route tiles over 16k keys: 128 CTAs
  EXPECT_EQ(key_split_parts(a, 8, 128, 132), 16);   // capped at 16 parts
  EXPECT_EQ(key_split_parts(a, 8, 32, 132), 8);     // 4 blocks a part at least
  EXPECT_EQ(key_split_parts(a, 66, 128, 132), 2);   // half the slots
  EXPECT_EQ(key_split_parts(a, 67, 128, 132), 0);   // more than half
  EXPECT_EQ(key_split_parts(a, 8, 7, 132), 0);      // short keys
  EXPECT_EQ(key_split_parts(a, 8, 8, 132), 2);
  EXPECT_EQ(key_split_parts(TailSplitMode::kOn, 132, 1, 132), 2);  // two rounds of pieces
  EXPECT_EQ(key_split_parts(TailSplitMode::kOn, 133, 1, 132), 0);  // its workspace bound
  EXPECT_EQ(key_split_parts(TailSplitMode::kOn, 3, 1, 132), 16);
  EXPECT_EQ(key_split_parts(TailSplitMode::kOff, 8, 128, 132), 0);
}

// The merge of a cut tile's pieces (piece_merge, folded in CTA order as tail_merge_sm90.h does) gives
// one softmax over the whole row: each piece's exps are taken against its own offset, as the
// kernels' reference step leaves it (somewhere at or above its running max, log2 units), and a
// piece that sees no key (offset -inf, sums 0) may come first, in the middle or last.
TEST(Sm90TailSplit, MergedPiecesAreOneSoftmax) {
  std::mt19937 rng(20261203);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> jitter(0.0, 3.0);
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const double scale_log2 = 0.0883883 * 1.4426950408889634;  // 1/sqrt(128) in log2 units
  for (int trial = 0; trial < 50; ++trial) {
    const int keys = 1 + trial * 37 % 1000, width = 1 + trial % 7;
    std::vector<double> score(keys), value(keys);
    for (int k = 0; k < keys; ++k) score[k] = 8.0 * normal(rng), value[k] = normal(rng);
    // The keys cut at random places into up to `width` pieces, plus an empty piece at trial % 3.
    std::vector<int> cuts = {0, keys};
    for (int c = 1; c < width; ++c) cuts.push_back(static_cast<int>(rng() % keys));
    std::sort(cuts.begin(), cuts.end());
    cuts.insert(cuts.begin() + 1 + trial % 3 % (cuts.size() - 1), cuts[trial % 3 % (cuts.size() - 1)]);
    float offset = -kInf, sum = 0.f, out = 0.f;
    for (size_t p = 0; p + 1 < cuts.size(); ++p) {
      float piece_offset = -kInf, piece_sum = 0.f, piece_out = 0.f;
      if (cuts[p] < cuts[p + 1]) {
        double max = -INFINITY;
        for (int k = cuts[p]; k < cuts[p + 1]; ++k) max = std::max(max, score[k]);
        piece_offset = static_cast<float>(max * scale_log2 + jitter(rng));
        for (int k = cuts[p]; k < cuts[p + 1]; ++k) {
          const float e = std::exp2(static_cast<float>(score[k] * scale_log2) - piece_offset);
          piece_sum += e;
          piece_out += e * static_cast<float>(value[k]);
        }
      }
      const PieceMerge m = piece_merge(offset, piece_offset);
      sum = sum * m.keep + piece_sum * m.add;
      out = out * m.keep + piece_out * m.add;
      offset = m.offset;
    }
    double max = -INFINITY, ref_sum = 0.0, ref_out = 0.0;
    for (int k = 0; k < keys; ++k) max = std::max(max, score[k] * scale_log2);
    for (int k = 0; k < keys; ++k) {
      const double e = std::exp2(score[k] * scale_log2 - max);
      ref_sum += e;
      ref_out += e * value[k];
    }
    SCOPED_TRACE(testing::Message() << "trial " << trial << ", " << keys << " keys, " << cuts.size() - 1 << " pieces");
    ASSERT_TRUE(std::isfinite(sum) && std::isfinite(out));
    EXPECT_NEAR(out / sum, ref_out / ref_sum, 1e-5 * (1.0 + std::fabs(ref_out / ref_sum)));
    EXPECT_NEAR(offset + std::log2(sum), max + std::log2(ref_sum), 1e-5 * (1.0 + std::fabs(max)));
  }
  // No piece sees a key: the merged row stays empty (sum 0, offset -inf), with no NaN on the way.
  const PieceMerge empty = piece_merge(-kInf, -kInf);
  EXPECT_EQ(empty.keep, 0.f);
  EXPECT_EQ(empty.add, 0.f);
  EXPECT_EQ(empty.offset, -kInf);
}

// The auto rule's model (blocks of 128 keys at d128, 64 at d256): a split only where it gains at
// least kMinGain, i.e. calls that leave most SMs idle; none for the FA sweep's many-round calls.
TEST(Sm90TailSplit, ModelSplitsOnlyCallsThatLeaveMostSmsIdle) {
  constexpr int kSms = 132;
  EXPECT_TRUE(TailSplit::worth_it(16, 256, 66));     // 1 x 128 queries x 32k keys x 16 heads, clusters of two
  EXPECT_TRUE(TailSplit::worth_it(32, 256, 66));     // 1 x 512 x 32k x 16
  EXPECT_TRUE(TailSplit::worth_it(32, 64, 66));      // one head of 8k: half the clusters idle whole
  EXPECT_TRUE(TailSplit::worth_it(64, 64, kSms));    // the same without clusters
  EXPECT_FALSE(TailSplit::worth_it(1024, 64, 66));   // d128 8k: 15.5 rounds of work for 16, +3% modelled
  EXPECT_FALSE(TailSplit::worth_it(2048, 64, kSms));
  EXPECT_FALSE(TailSplit::worth_it(1024, 128, kSms));  // d256 8k
  EXPECT_FALSE(TailSplit::worth_it(64, 64, 66));     // 64 tiles on 66 clusters: level
  EXPECT_FALSE(TailSplit::worth_it(2048, 4, kSms));  // d128 512: pieces of a block or two
  EXPECT_FALSE(TailSplit::worth_it(2 * kSms, 64, kSms));  // whole rounds
  EXPECT_FALSE(TailSplit::worth_it(1000, 1, kSms));  // a block cannot be cut
  int grid = 0;
  const TailSplit s = TailSplit::make(2048, 64, kSms, &grid);
  EXPECT_EQ(s.dp_rounds, 14);
  EXPECT_EQ(grid, kSms);
  // Modelled gain at d128 8k: ~3% (15.5 rounds of work for 16), under kMinGain.
  EXPECT_LT(s.split_time(), 0.975 * TailSplit::whole_time(2048, 64, kSms));
  EXPECT_GT(s.split_time(), (1.0 - TailSplit::kMinGain) * TailSplit::whole_time(2048, 64, kSms));
  // One 8k head: ~1.8x modelled.
  const TailSplit one_head = TailSplit::make(32, 64, 66, &grid);
  EXPECT_EQ(grid, 66);
  EXPECT_LT(one_head.split_time(), 0.6 * TailSplit::whole_time(32, 64, 66));
}

}  // namespace
