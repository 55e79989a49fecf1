// The persistent tile scheduler: the grid is one CTA per SM; in round r the CTAs take the tiles
// r * grid .. r * grid + grid - 1 of one fixed order, CTA c the c-th of them in even rounds and
// the (grid - 1 - c)-th in odd rounds (a zigzag), so no CTA waits on a launch at the tail and every
// warp of the CTA (producer and consumers) derives the same sequence with no communication.
//
// Equal-length tiles (no causal or window mask) are ordered for L2 reuse: heads in groups whose K
// and V fit in 6 MB, query blocks inside a group, so the CTAs working at one time re-read K/V from
// L2 rather than HBM.  With groups of 25 MB (half the L2) a d128 call still read Q/K/V from HBM
// 1.6x (1k tokens) to 2.3x (8k) over; with 6 MB exactly once (Nsight Compute), and back to back
// every non-causal sweep point ran 0-7% faster (perf log, session 14; 12 MB: about the same,
// 50 MB: 1-7% slower).
// Uneven tiles (causal, window) go longest first (the bottom query blocks of a head see the most
// keys); the zigzag then pairs a CTA's long tile of one round with a short one of the next.  A model
// of the sweep's causal shapes (tile cost = key blocks + 1) gives 97-100% of the ideal balance over
// the whole call; L2 groups with plain round-robin gave 55-97% (d256 16k causal: 55%, measured 294
// TFLOP/s against 405 at 8k).  Over the whole call, though, a short sequence's tiles are spread over
// all of it (at 512 tokens each of a head's four query blocks a quarter of the call apart), so each
// reads the head's K/V from HBM again: causal d128 512 took as long as non-causal, K/V read ~2.5x.
// So with at most kMaxGroupedMBlocks query blocks a head, heads go in groups of exactly two (or
// four) rounds of tiles, longest first inside each group: a head's tiles run within those rounds,
// and the zigzag pairs the c-th longest tile of a group with its c-th shortest (their key blocks add
// up to a constant under a causal mask).  The model: 97-99.6% balance at 512-2k tokens.  Longer
// sequences keep the whole-call order, where a round covers a few neighbouring query blocks of
// each head, whose CTAs stream the same K/V blocks at about the same time.
// The zigzag's pairs add up to a constant only when a head's walks do (1, 2, .., M blocks).  d64's
// end-aligned 192-row tiles at 512 tokens walk 1, 3 and 4 blocks, so in every group of two rounds
// the same 88 CTAs ran 4 + 1 and the other 44 ran 3 + 3 (16% more in traced cycles), group after
// group: 0.91 of the ideal balance over the call.  Each group therefore shifts which CTA takes
// which slot by 0.618 of the grid (the golden ratio spreads successive shifts evenly over the
// CTAs), so a group's uneven pairs fall on different CTAs each time: 0.98 in the model
// (tests/cpp/test_tile_scheduler.cpp), and no shape of the sweep loses; measured, causal d64 512
// +10% (perf log, session 27).  The whole-call order keeps fixed slots: its rounds' pair sums
// vary smoothly and cancel between neighbouring rounds, which a shift would undo (d256 2k: 0.997 ->
// 0.983 in the model when every pair of rounds shifted).
// Staggered halves (`stagger`, where a group is two rounds, the grid even and a multiple of the
// query blocks): a two-round group loads all of its heads' K/V from HBM in its first round (its
// longest tiles walk every key block) and reads them from L2 in its second, so the call's HBM
// traffic comes in bursts every other round.  At causal 512 those bursts held the call: with 8:1
// GQA (an eighth of the K/V bytes, the same FLOPs) it ran 10-14% faster on the H200, and on the
// H100 (3.35 TB/s against 4.8) d128 took 115 us against cuDNN's 102 where the H200 takes ~100
// (session 55).  So the grid's two halves take half-groups (grid / M pairs, two rounds of half the
// grid each) one round apart: in every round one half starts new heads while the other finishes
// its heads from L2.  The second half's first half-group X goes short
// tiles first (round 0) and has its long tiles after its other half-groups, so neither half waits
// at the start; a half-group keeps the zigzag pairs of its two rounds, so each CTA's load stays
// what it was.  The last half-group, possibly partial, goes to the first half, so the CTAs of
// neither half idle between tiles (a CTA stops at its first tile >= num_tiles).
// Pair-major groups (`pair_major`): a two-round group's heads read their K/V in its first round
// and again in its second (their shortest tiles), from L2 where the group's K/V fit there.  Where
// they do not (more than the 50 MB L2: queries a few blocks long against long keys, as chunked
// prefill, or the KV-cache route's packed heads: 64 rows x 4 query heads over 4k keys, a group of
// 132 KV heads x 2 MB), the second round reads them from HBM again: that packed causal call took
// 425 us on the H100 against 267 non-causal (session 66).  There a group runs (batch, head) pair
// by pair, each pair's blocks longest first, so a head's tiles run side by side in one round and
// its K/V come from HBM once (that call: 264 us, session 67).  The zigzag's pairs still add up to
// a constant: two rounds hold 2 grid tiles, a multiple of the query blocks, so the slot that takes
// a head's c-th longest tile in the first round takes some head's c-th shortest in the second.
// The sweep's groups (at most 33 MB: d256 at 512 and 1k tokens) keep their order.
// Integer arithmetic with its divisors prepared on the host (common/fast_divisor.h), compiled
// for the host too: tests/cpp/test_tile_scheduler.cpp checks that every tile runs exactly once.
#pragma once

#include <stdint.h>

#include <initializer_list>

#include "common/fast_divisor.h"
#include "common/host_device.h"

namespace tileattn::cuda::sm90 {

struct TileCoords {
  int m_block, head, batch;
};

// Whether two-round groups go pair by pair (TILEATTN_FORWARD_PAIR_MAJOR, pair_major_order.h):
// kAuto where the group's K/V exceed the L2.
enum class PairMajor { kAuto, kOn, kOff };

struct TileScheduler {
  int num_m_blocks;
  int num_heads;    // query heads
  int num_pairs;    // batch * num_heads
  int group_pairs;  // (batch, head) pairs per L2 group
  int num_tiles;
  bool longest_first;
  bool pair_major;        // a group's tiles (batch, head) pair by pair (else query block by block)
  int rotation;           // slots a group of rounds shifts by (0: fixed slots)
  int group_rounds_log2;  // log2 of the rounds in a group (1 or 2) when rotation != 0
  // Staggered halves (0: off): half the grid's CTAs; then group_pairs is a half-group's.
  int half;
  int num_groups;  // (half-)groups, the last possibly partial
  FastDivisor by_group_tiles;  // group_pairs * num_m_blocks
  FastDivisor by_group_pairs;  // group_pairs
  FastDivisor by_last_pairs;   // the last group's pairs (fewer when groups do not divide num_pairs)
  FastDivisor by_heads;        // num_heads
  FastDivisor by_grid;         // the grid make() was given (the slot shift wraps around it)
  FastDivisor by_half;         // half (1 when not staggered)
  FastDivisor by_m_blocks;     // num_m_blocks

  static constexpr int kMaxGroupedMBlocks = 16;  // 2k tokens at d128 and d256, 3k at d64
  static constexpr int64_t kL2Bytes = 50ll << 20;  // H100's and H200's L2

  // Pairs in a group of exactly 2 or 4 rounds of `grid` tiles, or 0 when neither divides evenly.
  static int64_t round_group(int num_m_blocks, int grid) {
    for (int rounds : {2, 4}) {
      const int64_t tiles = static_cast<int64_t>(rounds) * grid;
      if (tiles % num_m_blocks == 0) return tiles / num_m_blocks;
    }
    return 0;
  }

  // Whether staggered halves can order a call: longest first in groups of exactly two rounds, an
  // even grid that the query blocks divide (a half-group is then grid / M pairs), and at least
  // three half-groups (the second half's X and one of each half's).
  static bool can_stagger(int num_m_blocks, int num_pairs, int grid) {
    if (num_m_blocks > kMaxGroupedMBlocks || grid % 2 != 0 || grid % num_m_blocks != 0) return false;
    if (round_group(num_m_blocks, grid) * num_m_blocks != 2ll * grid) return false;
    return num_pairs > 2 * (grid / num_m_blocks);
  }

  // Host side: the groups from the K/V bytes of one head (equal tiles) or the grid (uneven tiles),
  // pair by pair as `pair_major` says, else in staggered halves where `stagger` asks for them and
  // can_stagger allows.
  static TileScheduler make(int num_m_blocks, int batch, int num_heads, int num_heads_k,
                            int64_t kv_bytes_per_head, bool longest_first, int grid, bool stagger = false,
                            PairMajor pair_major = PairMajor::kAuto) {
    TileScheduler s;
    s.num_m_blocks = num_m_blocks;
    s.num_heads = num_heads;
    s.num_pairs = batch * num_heads;
    // Query heads sharing a KV head (GQA) share its bytes too.
    const int64_t per_pair = kv_bytes_per_head * num_heads_k / num_heads + 1;
    constexpr int64_t kL2Budget = 6ll << 20;
    int64_t group = kL2Budget / per_pair;
    s.rotation = 0;
    s.group_rounds_log2 = 0;
    s.half = 0;
    // Pairs in a group of whole rounds of longest-first tiles (0: the whole-call order).
    const int64_t grouped =
        longest_first && num_m_blocks <= kMaxGroupedMBlocks ? round_group(num_m_blocks, grid) : 0;
    const bool two_rounds = grouped * num_m_blocks == 2ll * grid;
    const bool past_l2 = grouped * per_pair > kL2Bytes;
    s.pair_major = two_rounds && (pair_major == PairMajor::kOn || (pair_major == PairMajor::kAuto && past_l2));
    if (longest_first && stagger && !s.pair_major && can_stagger(num_m_blocks, s.num_pairs, grid)) {
      s.half = grid / 2;
      group = grid / num_m_blocks;
      s.rotation = static_cast<int>(0.618 * s.half + 0.5) % s.half;
    } else if (longest_first) {
      group = grouped > 0 ? grouped : s.num_pairs;
      if (grouped > 0 && grouped < s.num_pairs) {
        s.rotation = static_cast<int>(0.618 * grid + 0.5) % grid;
        s.group_rounds_log2 = two_rounds ? 1 : 2;
      }
    }
    if (group < 1) group = 1;
    if (group > s.num_pairs) group = s.num_pairs;
    s.group_pairs = static_cast<int>(group);
    s.num_groups = (s.num_pairs + s.group_pairs - 1) / s.group_pairs;
    s.num_tiles = num_m_blocks * s.num_pairs;
    s.longest_first = longest_first;
    s.by_group_tiles = FastDivisor::make(s.group_pairs * num_m_blocks);
    s.by_group_pairs = FastDivisor::make(s.group_pairs);
    const int last_group = (s.num_pairs - 1) / s.group_pairs;
    s.by_last_pairs = FastDivisor::make(s.num_pairs - last_group * s.group_pairs);
    s.by_heads = FastDivisor::make(num_heads);
    s.by_grid = FastDivisor::make(grid);
    s.by_half = FastDivisor::make(s.half > 0 ? s.half : 1);
    s.by_m_blocks = FastDivisor::make(num_m_blocks);
    return s;
  }

  // The tile CTA `cta` (of the grid make() was given) runs in round `round`; >= num_tiles once the
  // CTA is done.  Its slot in the round is its index, shifted by `rotation` a group of rounds; slot
  // s takes the s-th tile of an even round and the s-th from the end of an odd one (the zigzag).
  // The wrap goes through by_grid: a runtime % is ~25 dependent instructions on every warp's path
  // into a tile (fast_divisor.h).
  TILEATTN_HOST_DEVICE int tile_of(int round, int cta) const {
    if (half != 0) return staggered_tile_of(round, cta);
    const int grid = static_cast<int>(by_grid.divisor);
    int slot = cta;
    if (rotation != 0) {
      const int shifted = cta + (round >> group_rounds_log2) * rotation;
      slot = by_grid.mod(shifted);
    }
    return round * grid + ((round & 1) ? grid - 1 - slot : slot);
  }

  // tile_of with staggered halves (see the file's comment).  The first half runs groups
  // first + 2j in rounds 2j and 2j + 1, first being the last group's parity; the second half runs
  // its first group X (= 1 - first) short tiles first in round 0, its groups X + 2 (j + 1) in
  // rounds 2j + 1 and 2j + 2, and X's long tiles in the round after those.  In its group a CTA takes
  // slot `local` of the longest tiles and slot 2 half - 1 - local of the shortest (the zigzag),
  // local being its index shifted by `rotation` a group.
  TILEATTN_HOST_DEVICE int staggered_tile_of(int round, int cta) const {
    const bool second = cta >= half;
    const int first_parity = (num_groups - 1) & 1;
    int group, phase, rank;
    if (!second) {
      rank = round >> 1;
      phase = round & 1;
      group = first_parity + 2 * rank;
      if (group >= num_groups) return num_tiles;
    } else if (round == 0) {
      rank = 0, phase = 1, group = 1 - first_parity;
    } else {
      // The second half takes the groups of the other parity than the last group's: num_groups / 2
      // of them below num_groups - 1.
      const int second_half_groups = num_groups >> 1;
      const int t = round - 1;
      rank = (t >> 1) + 1;
      phase = t & 1;
      group = 1 - first_parity + 2 * rank;
      if (rank >= second_half_groups) {
        if (t != 2 * (second_half_groups - 1)) return num_tiles;
        rank = 0, phase = 0, group = 1 - first_parity;
      }
    }
    const int local = by_half.mod((second ? cta - half : cta) + rank * rotation);
    const int in_group = phase ? 2 * half - 1 - local : local;
    const int tile = group * 2 * half + in_group;
    return tile < num_tiles ? tile : num_tiles;
  }

  // tile in [0, num_tiles): group-major, then query block, then (batch, head) pair; or with
  // pair_major, then pair, then query block.
  TILEATTN_HOST_DEVICE TileCoords coords(int tile) const {
    const int group_tiles = group_pairs * num_m_blocks;
    const int group = by_group_tiles.div(tile);
    const int in_group = tile - group * group_tiles;
    const int first_pair = group * group_pairs;
    int m_rank, pair;
    if (pair_major) {
      const int pair_rank = by_m_blocks.div(in_group);
      m_rank = in_group - pair_rank * num_m_blocks;
      pair = first_pair + pair_rank;
    } else {
      const bool short_group = num_pairs - first_pair < group_pairs;  // the last group may be short
      const FastDivisor& by_pairs = short_group ? by_last_pairs : by_group_pairs;
      m_rank = by_pairs.div(in_group);
      pair = first_pair + (in_group - m_rank * static_cast<int>(by_pairs.divisor));
    }
    TileCoords c;
    c.m_block = longest_first ? num_m_blocks - 1 - m_rank : m_rank;
    c.batch = by_heads.div(pair);
    c.head = pair - c.batch * num_heads;
    return c;
  }
};

}  // namespace tileattn::cuda::sm90
