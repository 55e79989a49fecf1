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

}  // namespace tileattn
