// A decode step's products on AMX, reading a bf16 KV cache where it lies.  A step has a handful of
// query rows per KV head (a GQA group), so it is bound by reading K and V; the sgemm path converts
// every K/V row to float32 first (its conversion and small products were ~45% of a bf16 1 x 32k
// step on a Sapphire Rapids host).  Here nothing is converted:
//   S^T = K Q^T: AMX's A operand is 16 rows of 32 bf16 at any row stride, so K's rows are loaded
//   from the cache itself, 16 keys at a time, with Q^T (padded to 16 columns) as the B operand;
//   O += P V: V's rows are interleaved in pairs (16-bit shuffles, no rounding) into the B layout.
// Needs bf16 K/V with a head dim that is a multiple of 32 (a tile row is 32 elements of one head),
// and at most 64 query rows a tile.  Keys past the sequence's end are never read: a last group of
// fewer than 16 keys is copied into a zeroed buffer first.
#pragma once

#include <cstdint>

#include "cpu/amx_bf16.h"
#include "cpu/scratch_array.h"
#include "cpu/tile_io.h"

namespace tileattn::cpu::amx {

constexpr int kCacheTileMaxRows = 64;  // query rows: the columns of S^T, 4 tiles of 16

// Per-thread buffers for one KV tile of up to kTileKeys keys.
struct CacheTileScratch {
  static constexpr int kTileKeys = 128;
  ScratchArray<uint16_t> q_transposed;    // Q^T as pairs: D / 2 pair rows of 2 query_columns
  ScratchArray<float> scores_transposed;  // S^T: kTileKeys x query_columns
  ScratchArray<uint16_t> k_rows;          // 16 keys copied where they are not 16 equally spaced rows
  ScratchArray<uint16_t> v_pairs;         // V as pairs: kTileKeys / 2 pair rows of 2 D
  int query_columns = 0;                  // query rows rounded up to 16, set by pack_cache_query

  explicit CacheTileScratch(int dim)
      : q_transposed(static_cast<size_t>(dim) * kCacheTileMaxRows),
        scores_transposed(static_cast<size_t>(kTileKeys) * kCacheTileMaxRows),
        k_rows(static_cast<size_t>(16) * dim),
        v_pairs(static_cast<size_t>(kTileKeys) * dim) {}
};

// Q^T for the tile's products from q (rows x dim float32, ld q_ld), rounded to bf16.
void pack_cache_query(const float* q, int64_t q_ld, int rows, int dim, CacheTileScratch& w);

// scores (rows x cols, ld lds) = Q K^T for keys col0 .. col0 + cols - 1 of KV head `head` (cols <=
// kTileKeys, col0 a multiple of 16).
void cache_scores(Engine engine, const StridedRows& k, const SequenceView& seq, int head, int col0, int cols,
                  int rows, int dim, CacheTileScratch& w, float* scores, int lds);

// out (rows_padded x dim, ld out_ld) += P V for the same keys, P as bf16 rows (ld p_ld, its columns
// past cols zero).
void cache_accumulate_pv(Engine engine, const StridedRows& v, const SequenceView& seq, int head, int col0, int cols,
                         int rows_padded, int dim, const uint16_t* p, int p_ld, CacheTileScratch& w, float* out,
                         int out_ld);

}  // namespace tileattn::cpu::amx
