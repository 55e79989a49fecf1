// Where a KV-cache position lives, for contiguous and paged caches: the one mapping every backend
// uses (tileattn.h describes it).
#pragma once

#include <stdint.h>

#include "common/host_device.h"
#include "tileattn/tileattn.h"

namespace tileattn {

// Element offset of cache position `pos` of sequence b (head 0, dim 0), for a cache tensor whose
// batch stride steps one cache entry (contiguous) or one page (paged).
TILEATTN_HOST_DEVICE int64_t cache_row_offset(const tileattn_kvcache_params& p, int b, int64_t pos,
                                              int64_t batch_stride, int64_t row_stride) {
  const int64_t row = p.cache_batch_idx ? p.cache_batch_idx[b] : b;
  if (p.block_table == nullptr) return row * batch_stride + pos * row_stride;
  const int64_t block = p.block_table[row * p.block_table_batch_stride + pos / p.page_size];
  return block * batch_stride + (pos % p.page_size) * row_stride;
}

// First cache position sequence b attends to, and one past its last.
TILEATTN_HOST_DEVICE int64_t cache_first_key(const tileattn_kvcache_params& p, int b) {
  return p.cache_leftpad ? p.cache_leftpad[b] : 0;
}
TILEATTN_HOST_DEVICE int64_t cache_end_key(const tileattn_kvcache_params& p, int b) {
  return static_cast<int64_t>(p.cache_seqlens[b]) + (p.k_new ? p.seqlen_new : 0);
}

// Whether q's rows take rotary positions of their own, cache_seqlens[b] + i (causal or windowed
// calls), rather than all taking cache_seqlens[b] (tileattn.h).
TILEATTN_HOST_DEVICE bool rotary_position_per_row(const tileattn_fwd_params& f) {
  return f.window_left >= 0 || f.window_right >= 0;
}

// Rotary positions a call reads past cache_seqlens[b]: the new keys' i < seqlen_new (when k_new is
// given), and q's rows i < seqlen_q when causal or windowed, else the one position cache_seqlens[b]
// that all of q's rows take (tileattn.h).  Sequence b needs rotary_seqlen >= cache_seqlens[b] + this.
TILEATTN_HOST_DEVICE int rotary_positions_past_cache(const tileattn_kvcache_params& p) {
  const int new_keys = p.k_new ? p.seqlen_new : 0;
  const int query_positions = rotary_position_per_row(p.fwd) || p.fwd.seqlen_q == 0 ? p.fwd.seqlen_q : 1;
  return new_keys > query_positions ? new_keys : query_positions;
}

}  // namespace tileattn
