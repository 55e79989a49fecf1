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
// The key split (for the sequence-bounds kernels, whose tiles' key counts live on the device: varlen,
// seqused_k, the KV-cache route): where a call has fewer tiles than half the CTA slots, every tile is
// cut into `parts` pieces, piece j taking the j-th of `parts` equal shares of the tile's own key
// blocks, [lo + len j / parts, lo + len (j + 1) / parts) of its range [lo, lo + len) as the device
// finds it.  CTA c walks the units c, c + grid, ... of the tiles x parts (one each when they fit the
// grid); the pieces merge as the tail split's do, read back in part order.  A few tiles over long
// keys otherwise stream their keys on as many SMs as there are tiles (H100, 32 tiles of 16 KV-cache
// rows over 16k keys: 131 us on the route, 57 through the tail split of the same call without
// bounds, session 68; 52 with the key split, session 69).
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
// fewer (a piece of a cut tile, whose slot and piece count slot_of and pieces_of give); or under the
// key split share `part` of `parts` of the tile's blocks (parts 0: not a key split).
struct TilePiece {
  int tile;  // >= the scheduler's num_tiles: the CTA is done
  int n_lo, n_hi;
  int part = 0, parts = 0;
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
  int64_t steps;    // (num_tiles - first_tile) * blocks; under the key split num_tiles * parts
  int parts;        // the key split's pieces a tile; 0: the tail split

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
    s.parts = 0;
    return s;
  }

  // The key split of num_tiles tiles into `parts` pieces each on a grid of at most `slots` CTAs.
  static TailSplit key_split(int num_tiles, int parts, int slots, int* grid_out) {
    TailSplit s{};
    s.dp_rounds = 0;
    s.first_tile = 0;
    s.blocks = 1 << 30;  // no piece is a whole tile
    s.parts = parts;
    s.steps = static_cast<int64_t>(num_tiles) * parts;
    s.grid = static_cast<int>(s.steps < slots ? s.steps : slots);
    *grid_out = s.grid;
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
    s.parts = 0;
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
    if (parts > 0) return parts;
    const int64_t first = static_cast<int64_t>(t) * blocks;
    return cta_of(first + blocks - 1) - cta_of(first) + 1;
  }
  // The slot of CTA c's piece of split tile t (local index): 2c for its first piece, 2c + 1 for its
  // last (only those two of a CTA's pieces can be cut).
  TILEATTN_HOST_DEVICE int slot_of(int cta, int t) const {
    return 2 * cta + (begin(cta) >= static_cast<int64_t>(t) * blocks ? 0 : 1);
  }
  // The slot of piece i (in merge order: CTA order, under the key split part order) of split tile
  // t, and the slot a CTA's piece p of it writes.
  TILEATTN_HOST_DEVICE int slot_at(int t, int i) const {
    return parts > 0 ? t * parts + i : slot_of(cta_of(static_cast<int64_t>(t) * blocks) + i, t);
  }
  TILEATTN_HOST_DEVICE int own_slot(int cta, int t, TilePiece const& p) const {
    return parts > 0 ? t * parts + p.part : slot_of(cta, t);
  }
  // The key split's share `part` of `parts` of the key blocks [lo, hi): [first, last).
  struct Share {
    int first, last;
  };
  TILEATTN_HOST_DEVICE static Share share_of(int lo, int hi, int part, int parts) {
    const int len = hi > lo ? hi - lo : 0;
    return {lo + len * part / parts, lo + len * (part + 1) / parts};
  }
  // Slots the partials need: two a CTA (its first and last piece), or one a piece.
  int64_t slots() const { return parts > 0 ? steps : 2ll * grid; }

  // Piece `index` (0, 1, ..) of CTA `cta`'s range; tile >= first_tile + split tiles once done.
  TILEATTN_HOST_DEVICE TilePiece piece(int index, int cta) const {
    if (parts > 0) {  // the key split: unit cta + index x grid
      const int64_t unit = static_cast<int64_t>(index) * grid + cta;
      TilePiece p;
      p.tile = static_cast<int>((unit < steps ? unit : steps) / parts);
      p.n_lo = 0;
      p.n_hi = 1 << 30;
      p.part = static_cast<int>(unit % parts);
      p.parts = parts;
      return p;
    }
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
