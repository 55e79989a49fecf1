// The tail split of the persistent sm90 forward (stream-K over its last rounds).
//
// The persistent grid runs the tiles in rounds of `grid` (tile_scheduler.h); when the tile count is
// not a multiple of the grid, the last round runs part full and the other SMs idle.  That costs
// most where a call has fewer tiles than the grid: a chunk of 128-512 query rows against a 32k
// cache, or one long head, keeps a quarter to a half of the SMs busy (3.7x and 1.4-1.7x faster
// split, session 42).  The FA sweep's calls (16 rounds with the last 52% full at d128, 8 with the
// last 76% full at d256) ran no faster split: the H200 runs them at its power cap.
//
// Tiles of equal length (no causal or window mask, no sequence bounds) can be cut along their key
// blocks: the last two rounds' tiles (W of them, grid < W <= 2 grid, or every tile when there are
// at most two rounds) are laid end to end as W x blocks key-block steps, and CTA c takes the steps
//   [begin(c), begin(c + 1)),  begin(c) = floor(c * W * blocks / grid)
// (Osama et al., "Stream-K", PPoPP 2023: their hybrid of data-parallel rounds first and about one
// tile's worth of stream-K a CTA after them).  A CTA's steps run as pieces, one per tile they
// touch, each piece a range of the tile's key blocks; a tile cut into pieces is finished by
// whichever of its CTAs arrives last: every piece writes its unnormalized O, its rows' exp offsets
// and sums to a slot of the workspace, counts itself in the tile's counter, and the CTA that brings
// the counter to the piece count reads every piece back in CTA order (the same sum whatever the
// arrival order: deterministic) and stores the tile.  No CTA waits on another, so the grid needs
// no co-residency beyond the persistent kernel's own.
//
// Integer arithmetic shared by the producer and the consumers, compiled for the host too:
// tests/cpp/test_tail_split.cpp checks that every key block of every tile runs exactly once, that
// the partial pieces' slots are distinct, the merge step against one softmax over the whole row,
// and the model below on the sweep's shapes.
#pragma once

#include <math.h>
#include <stdint.h>

#include "common/host_device.h"

namespace tileattn::cuda::sm90 {

// One step of a CTA's walk: the key blocks [n_lo, n_hi) of a tile, all of them (a whole tile) or
// fewer (a piece of a cut tile, whose slot and piece count slot_of and pieces_of give).
struct TilePiece {
  int tile;  // >= the scheduler's num_tiles: the CTA is done
  int n_lo, n_hi;
};

// One step of the merge of a cut tile's pieces (tail_merge_sm90.h), for a row whose pieces so far
// sum to (O, l) against exp offset `offset` (log2 units) and whose next piece has (O_p, l_p)
// against `piece_offset`:  merged = max of the two,  O = O keep + O_p add,  l = l keep + l_p add.
// A row no piece has seen a key of (offset -inf) scales by 0, not by exp2(-inf - -inf) = NaN.
struct PieceMerge {
  float keep, add, offset;
};
TILEATTN_HOST_DEVICE PieceMerge piece_merge(float offset, float piece_offset) {
  const float merged = fmaxf(offset, piece_offset);
  if (merged == -INFINITY) return {0.f, 0.f, merged};
  return {exp2f(offset - merged), exp2f(piece_offset - merged), merged};
}

struct TailSplit {
  int dp_rounds;    // rounds of whole tiles before the split ones (a large value: no split)
  int first_tile;   // dp_rounds * grid: the first split tile
  int blocks;       // key blocks of every tile
  int grid;
  int64_t steps;    // (num_tiles - first_tile) * blocks

  // Model of a call in key-block steps, for the auto rule: a piece costs its blocks plus
  // kPieceOverheadBlocks for the tile boundary (the last PV, finalize and store, the next tile's
  // decode, Q and first exact softmax: ~5,000 cycles a consumer at d128 against ~2,600 a loop
  // iteration, traced in session 27; docs/cuda-forward-sm90.md), the merge not counted; the A/B is
  // to settle it.
  static constexpr int kPieceOverheadBlocks = 2;
  // Split only when the model gains at least this fraction of the call.  Measured (session 42,
  // H200): calls with fewer tiles than slots gained about half the model's gain (16 tiles 3.6x,
  // 32 tiles 1.7x and 1.4x, against 3.9x, 2.0x and 1.8x modelled), but the FA sweep's
  // many-round calls, modelled +2.5-5%, ran -2% to +2% (the H200 at its power cap runs the same
  // work in about the same time however it is spread over the SMs), so only large gains count.
  static constexpr double kMinGain = 0.2;

  static TailSplit off() {
    TailSplit s{};
    s.dp_rounds = 1 << 30;
    s.first_tile = 1 << 30;
    s.blocks = 1;
    s.grid = 1;
    s.steps = 0;
    return s;
  }

  // The split for num_tiles equal tiles of `blocks` key blocks on a grid of `slots` CTAs;
  // `grid_out` receives the grid to launch (at most slots; fewer only when the steps are fewer).
  static TailSplit make(int num_tiles, int blocks, int slots, int* grid_out) {
    TailSplit s{};
    const int rounds = (num_tiles + slots - 1) / slots;
    s.dp_rounds = rounds > 2 ? rounds - 2 : 0;
    s.blocks = blocks;
    s.first_tile = s.dp_rounds * slots;
    s.steps = static_cast<int64_t>(num_tiles - s.first_tile) * blocks;
    // At least one step a CTA: no CTA has an empty range, so every cut tile's pieces are its
    // CTAs c_lo .. c_hi (cta_of).
    s.grid = static_cast<int>(s.steps < slots ? s.steps : slots);
    *grid_out = s.grid;
    return s;
  }

  // Modelled time of the call, in key-block steps of the busiest CTA, whole tiles and split.
  static int64_t whole_time(int num_tiles, int blocks, int slots) {
    return static_cast<int64_t>((num_tiles + slots - 1) / slots) * (blocks + kPieceOverheadBlocks);
  }
  int64_t split_time() const {
    const int64_t per_cta = (steps + grid - 1) / grid;
    // A CTA's range is per_cta steps: its pieces are the tiles it touches (at most
    // per_cta / blocks + 2).
    const int64_t pieces = (per_cta + blocks - 1) / blocks + 1;
    const int64_t whole_rounds = static_cast<int64_t>(dp_rounds) * (blocks + kPieceOverheadBlocks);
    return whole_rounds + per_cta + pieces * kPieceOverheadBlocks;
  }
  static bool worth_it(int num_tiles, int blocks, int slots) {
    if (num_tiles % slots == 0 || blocks < 2) return false;
    int grid = 0;
    const TailSplit s = make(num_tiles, blocks, slots, &grid);
    return s.split_time() <= (1.0 - kMinGain) * whole_time(num_tiles, blocks, slots);
  }

  TILEATTN_HOST_DEVICE int64_t begin(int cta) const { return static_cast<int64_t>(cta) * steps / grid; }
  // The CTA whose range holds step i: the largest c with begin(c) <= i.
  TILEATTN_HOST_DEVICE int cta_of(int64_t i) const {
    const int64_t c = ((i + 1) * grid - 1) / steps;
    return static_cast<int>(c < grid - 1 ? c : grid - 1);
  }
  // The CTAs sharing split tile t (local index): 1 when no CTA boundary falls inside it.
  TILEATTN_HOST_DEVICE int pieces_of(int t) const {
    const int64_t first = static_cast<int64_t>(t) * blocks;
    return cta_of(first + blocks - 1) - cta_of(first) + 1;
  }
  // The slot of CTA c's piece of split tile t (local index): 2c for its first piece, 2c + 1 for its
  // last (only those two of a CTA's pieces can be cut).
  TILEATTN_HOST_DEVICE int slot_of(int cta, int t) const {
    return 2 * cta + (begin(cta) >= static_cast<int64_t>(t) * blocks ? 0 : 1);
  }

  // Piece `index` (0, 1, ..) of CTA `cta`'s range; tile >= first_tile + split tiles once done.
  TILEATTN_HOST_DEVICE TilePiece piece(int index, int cta) const {
    const int64_t lo = begin(cta), hi = begin(cta + 1);
    const int t = static_cast<int>(lo / blocks) + index;
    const int64_t tile_lo = static_cast<int64_t>(t) * blocks;
    TilePiece p;
    p.tile = first_tile + t;
    const int64_t from = lo > tile_lo ? lo : tile_lo;
    if (from >= hi) {
      p.tile = first_tile + static_cast<int>(steps / blocks);  // past the last tile
      p.n_lo = p.n_hi = 0;
      return p;
    }
    const int64_t to = hi < tile_lo + blocks ? hi : tile_lo + blocks;
    p.n_lo = static_cast<int>(from - tile_lo);
    p.n_hi = static_cast<int>(to - tile_lo);
    return p;
  }
};

}  // namespace tileattn::cuda::sm90
