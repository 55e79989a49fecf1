// The CPU forward with k and v read in their own dtype and converted one tile at a time, instead
// of whole float32 copies made up front.  For the KV-cache decode, where each K/V tile is read by
// one query tile (a KV group's query heads run as rows of their KV head), converting as it reads
// saves writing and re-reading a float32 copy of the whole visible cache.
#pragma once

#include "api/backends.h"
#include "cpu/amx_bf16.h"
#include "cpu/tile_io.h"

namespace tileattn::cpu {

// Rows a KV group may have as the rows of one query tile (its heads as rows, GroupRows below): up
// to it a tile is a decode step's handful of rows, whose products read K and V in place
// (choose_kv_products); from it K/V laid out once pay for themselves, as in the general forward.
constexpr int kKvGroupMaxRows = 64;

// Whether a call's KV groups may run as rows (FlashAttention's seqlen_q / groups swap): at most
// kKvGroupMaxRows of them (query rows a sequence x group), and nothing that tells a group's query
// heads apart but their q (ALiBi's slopes and dropout's masks do).
inline bool kv_groups_as_rows(int64_t rows_a_group, const ForwardParams& p) {
  return rows_a_group <= kKvGroupMaxRows && p.alibi_slopes == nullptr && p.dropout_p == 0.0f;
}

// Float32 query (and output) rows with a KV group's heads as rows: packed query row r's head
// h = kv * group + g is row r * group + g of KV head kv, (rows * group, Hk, D), so a sequence's
// rows stay consecutive, token-major.  With group 1 it is the plain (rows, H, D) layout.
struct GroupRows {
  int group, heads_k, dim;
  int64_t offset(int64_t packed_row, int head) const {
    return ((packed_row * group + head % group) * heads_k + head / group) * dim;
  }
};

// p as for cpu_forward, except that p.k and p.v hold kv_dtype elements (p.dtype is q's and out's),
// and, with `pages`, their key rows are the page map's rows (p's k/v batch strides step a page, the
// row and head strides are within one; the sequences' key rows through cu_seqlens_k as usual).
// The products: sgemm on float32 tiles; or bf16 products on `bf16`'s engine, AMX's tiles or
// AVX512-BF16's dot products (the caller's call is bf16, its K/V values bf16 in whatever dtype they
// are held; q rounded to bf16 for S = Q K^T), with K and V packed once (kBf16Packed), or read in
// place (kBf16InPlace: kv_dtype bf16, a head dim that is a multiple of 32, at most
// amx::kCacheTileMaxRows query rows a sequence; amx_cache_tiles.h); or on AVX-512 or AVX2
// (simd::kernels()) with K^T and V laid out once as float32 blocks (kSimdTiles), or read tile by
// tile by the few-row kernels (kSimdFewRows: a decode step's handful of rows).
// rows_per_position > 1: p's query rows are GroupRows of group rows_per_position (a token's heads
// consecutive, ScoreRule::rows_per_position), p.num_heads the KV heads, p.seqlen_q (and
// cu_seqlens_q) counting rows; the caller checked kv_groups_as_rows.
struct KvProducts {
  enum Kind { kSgemm, kBf16Packed, kBf16InPlace, kSimdTiles, kSimdFewRows } kind = kSgemm;
  amx::Engine bf16 = amx::Engine::kNone;  // the bf16 kinds' engine
};
void forward_with_kv_tiles(const ForwardParams& p, tileattn_dtype kv_dtype, const PageMap* pages = nullptr,
                           KvProducts products = {}, int rows_per_position = 1);

// The products for a call of rows_per_seq query rows a sequence (one query tile's worth or fewer:
// a decode step's KV group as rows, or a chunk of prefill) against K/V of kv_dtype where they lie,
// in a call of call_dtype.
KvProducts choose_kv_products(tileattn_dtype call_dtype, tileattn_dtype kv_dtype, int rows_per_seq, int dim);

}  // namespace tileattn::cpu
