// Tile sizes of the sm90-family (Hopper) forward kernel, chosen in one place.
//
// A CTA is one producer warpgroup (TMA loads) and two or three consumers, each consumer owning 64
// query rows of the query tile (wgmma's M is 64 per warpgroup).  The consumers read the same K/V
// tiles, so one TMA load of K or V feeds 128 or 192 query rows.
#pragma once

namespace tileattn::cuda::sm90 {

struct Sm90TileConfig {
  int block_n;  // key rows per mainloop step
  int stages;   // K and V shared-memory buffers each (the TMA pipeline depth)
};

constexpr int kRowsPerConsumer = 64;  // wgmma M
constexpr int kMaxConsumers = 3;

// Consumer warpgroups per CTA.  At d64 a key block's GEMMs are short next to the softmax and the
// loads, so a third consumer (192 query rows a tile, FlashAttention-3's d64 shape) gives the
// tensor cores a third warpgroup's GEMMs to run; its registers (160 a consumer thread: 64 score,
// 32 O and 32 P registers) fit only at d64.  Measured on the H200 (docs/perf-log.md): d64 8k
// 451-454 -> 516-524 TFLOP/s, 2k 430 -> 487; causal 512 190 -> 174 (the padded part of the last
// 192-row tile).
constexpr int sm90_consumers(int head_dim) { return head_dim <= 64 ? 3 : 2; }

// Query rows of a tile: 192 at d64, 128 above.
constexpr int sm90_block_m(int head_dim) { return sm90_consumers(head_dim) * kRowsPerConsumer; }

// The head-dim buckets compiled for sm90.  Head dims between two buckets run in the larger one:
// TMA zero-fills the columns past head_dim on load and clips them on store.
constexpr int kSm90HeadDimBuckets[] = {64, 128, 256};

constexpr int sm90_head_dim_bucket(int head_dim) {
  for (int bucket : kSm90HeadDimBuckets) {
    if (head_dim <= bucket) return bucket;
  }
  return 0;
}

// Shared memory is Q (a tile's rows x D), `stages` K and V tiles (block_n x D each) and O's
// staging (rows x D, or half of it at d256), 2 bytes an element; the H200 allows 227 KB per CTA.
// Registers bound block_n: a consumer thread holds 64*block_n/128 score floats, half as many
// registers again for P while the PV wgmma is in flight, and 64*D/128 O floats.
constexpr Sm90TileConfig sm90_tile_config(int head_dim) {
  // d64: 24 KB Q (192 rows) + 2 x 2 x 16 KB K/V + 24 KB O staging = 112 KB; 64 S + 32 O floats a
  // thread.
  if (head_dim <= 64) return {128, 2};
  // d128: 32 KB Q + 2 x 2 x 32 KB K/V + 32 KB O staging = 192 KB; 64 S + 64 O floats.  Longer
  // blocks (FlashAttention-3 takes 176 keys) need Q's registers for S: 160 keys (224 KB), QK^T as
  // one N = 160 wgmma, measured 0.94-0.97x unmasked and 0.90-0.96x causal (H100, session 76; the
  // 176-key block's 484 against 624 TFLOP/s in session 3 ran as N = 16 wgmmas, kernel_traits_sm90.h).
  if (head_dim <= 128) return {128, 2};
  // d256: 64 KB Q + 2 x 2 x 32 KB K/V + 32 KB O staging = 224 KB; 128 O floats next to 32 score
  // floats.  An 80-key block (40 score floats: FlashAttention-3's choice) measured 26-35% slower
  // on the H200 (8k: 494-506 against 638-682 TFLOP/s, causal 492-501 against 648-664; perf log),
  // but its QK^T ran as N = 16 wgmmas (kernel_traits_sm90.h): not yet measured as designed.
  return {64, 2};
}

// d64 calls whose tiles walk few key blocks: causal (or right-windowed) with at most
// kSm90ShortWalkMaxKeys keys.  A tile's diagonal blocks are masked in part: at 512 tokens a head's
// consumers multiply 164k scores on 128-key blocks for 131k visible ones, and 147k on 64-key blocks
// (-10%; 1k -5.6%, 2k -3%), at twice the blocks' barrier waits and turns.  Four stages hold the
// 64 KB of K/V that two of 128 keys do (4 x 2 x 8 KB; with Q and O staging 112 KB either way).
// Measured on the H200 against 128-key blocks (A/B, two runs a side, twice; perf log, session 31):
// causal 512 +8-11%, 768 +10%, 1k +5-7%, 1.5k +2%, 2k -1 to 0%, 4k -3%, non-causal 4-5% slower at
// every length.  Two stages of 64 keys gained less (causal 512-1k +3%), three or six level with
// four; two consumers (128-row tiles) with either block lost 3-20%.  So the bucket keeps 128 keys
// and this kernel serves the short causal calls, up to the last length measured faster
// (launch_sm90.h, short_walk.h).
constexpr Sm90TileConfig kSm90ShortWalkD64 = {64, 4};
constexpr int kSm90ShortWalkMaxKeys = 1536;

// The first query row of query tile m_block (block_m rows a tile).  Under a mask with a right edge
// (causal, or a right window) a tile's key range ends at its last row's, so the tile that holds the
// padding of a ragged count should be the one whose walk is shortest: the first.  The tiles are
// then aligned to the sequence's end, shifted up by the padding in whole 64-row consumers (each
// consumer's rows are all real or all padding, and the Q and O TMA boxes stay on their 64-row grid;
// the rest, under 64 rows, stays at the end).  d64's 192-row tiles at 512 tokens walk 2 + 3 + 4 key
// blocks of 128 top-aligned and 1 + 3 + 4 aligned this way; at 1k, 32 and 27.  Without a right edge
// every tile walks the same blocks and the tiles start at row 0.  Negative rows are padding: no Q is
// loaded for them and nothing is stored.
constexpr int sm90_tile_first_row(int m_block, int block_m, int seqlen_q, bool right_edge) {
  const int first = m_block * block_m;
  if (!right_edge) return first;
  const int padding = (block_m - seqlen_q % block_m) % block_m;
  return first - padding / kRowsPerConsumer * kRowsPerConsumer;
}

// O is staged in its own shared-memory buffer, so the next tile's Q can load as soon as both
// consumers have issued their last QK^T instead of after both have stored O over their Q rows.
// Measured on the H200 (kernel-only, docs/perf-log.md): d128 8k 630 -> 661 TFLOP/s, 512 tokens
// 377 -> 437.  Its first version hung on tiles with no visible key; every tile now takes part in the
// Q handshake (producer.h).  At d256 a whole 64 x 256 half per consumer does not fit next to Q, K
// and V (192 KB): each consumer stages its O in two passes of 128 columns (32 KB for both).
constexpr int sm90_o_pass_cols(int head_dim) { return head_dim <= 128 ? head_dim : head_dim / 2; }

}  // namespace tileattn::cuda::sm90
