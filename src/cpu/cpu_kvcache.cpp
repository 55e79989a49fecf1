// flash_attn_with_kvcache on the CPU: append the new tokens to the cache (rotating k), rotate q,
// and run the CPU forward as a varlen problem over each sequence's visible keys: read in place
// (any dtype, converted tile by tile; a paged cache through a PageMap) where each tile is read once
// or the cache is a contiguous float32 one, else gathered into float32 rows.  With GQA and a few
// new tokens, a KV group's query heads run as rows of their KV head.  Packed query rows
// (cu_seqlens_q) go through kvcache_packed_q.cpp, which calls back in with a batch-form block.
#include <algorithm>
#include <climits>
#include <cstring>
#include <memory>
#include <vector>

#include "api/backends.h"
#include "common/kvcache.h"
#include "cpu/forward_kv_tiles.h"
#include "cpu/kvcache_packed_q.h"
#include "cpu/parallel.h"
#include "cpu/score_tile.h"  // kFwdBlockM
#include "cpu/tile_io.h"

namespace tileattn {
namespace cpu {
namespace {

// Rotates the first rotary_dim dims of x (float32) by the angle table row of `position`:
// interleaved pairs (2j, 2j + 1), else halves (j, j + rotary_dim / 2).
void rotate(const KvCacheParams& p, int64_t position, float* x, std::vector<float>& table) {
  const int half = p.rotary_dim / 2;
  table.resize(2 * half);
  load_row(p.fwd.dtype, p.rotary_cos, position * half, half, table.data());
  load_row(p.fwd.dtype, p.rotary_sin, position * half, half, table.data() + half);
  for (int j = 0; j < half; ++j) {
    const int a = p.rotary_interleaved ? 2 * j : j;
    const int b = p.rotary_interleaved ? 2 * j + 1 : j + half;
    const float cos = table[j], sin = table[half + j];
    const float x0 = x[a], x1 = x[b];
    x[a] = x0 * cos - x1 * sin;
    x[b] = x0 * sin + x1 * cos;
  }
}

struct RowScratch {
  std::vector<float> row, table;
};

// k_cache[pos] = rotary(k_new[i]), v_cache[pos] = v_new[i] for pos = cache_seqlens[b] + i.
void append(const KvCacheParams& p) {
  const ForwardParams& f = p.fwd;
  const int dim = f.head_dim;
  const size_t element = f.dtype == TILEATTN_FLOAT32 ? 4 : 2;
  parallel_tasks<RowScratch>(
      static_cast<int64_t>(f.batch) * p.seqlen_new, f.num_threads, [&] { return RowScratch{std::vector<float>(dim), {}}; },
      [&](int64_t task, RowScratch& w) {
        const int b = static_cast<int>(task / p.seqlen_new), i = static_cast<int>(task % p.seqlen_new);
        const int64_t pos = static_cast<int64_t>(p.cache_seqlens[b]) + i;
        for (int h = 0; h < f.num_heads_k; ++h) {
          load_row(f.dtype, p.k_new, b * p.k_new_batch_stride + i * p.k_new_row_stride + h * p.k_new_head_stride,
                   dim, w.row.data());
          if (p.rotary_cos) rotate(p, pos, w.row.data(), w.table);
          store_row(f.dtype, w.row.data(), dim, const_cast<void*>(f.k),
                    cache_row_offset(p, b, pos, f.k_batch_stride, f.k_row_stride) + h * f.k_head_stride);
          const int64_t v_from = b * p.v_new_batch_stride + i * p.v_new_row_stride + h * p.v_new_head_stride;
          const int64_t v_to = cache_row_offset(p, b, pos, f.v_batch_stride, f.v_row_stride) + h * f.v_head_stride;
          std::memcpy(static_cast<char*>(const_cast<void*>(f.v)) + v_to * element,
                      static_cast<const char*>(p.v_new) + v_from * element, dim * element);
        }
      });
}

// Float32 scratch kept across calls on the calling thread (q, out and the LSE; K and V when they
// are gathered): a decode loop calls with the same sizes every step, and buffers allocated afresh
// cost page faults and zeroing on every call (perf, 1 x 32k with 8 KV heads at d128 gathered:
// about a fifth of the call in the kernel's page-fault path).  Not
// zero-initialized: every element is written before it is read.  Buffers above kKeepBytes are
// released after the call, so a one-off long call does not pin its memory.
class ReusedBuffer {
 public:
  static constexpr size_t kKeepBytes = size_t{256} << 20;
  float* get(size_t count) {
    if (count > size_) {
      data_.reset(new float[count]);
      size_ = count;
    }
    return data_.get();
  }
  void release_if_large() {
    if (size_ * sizeof(float) > kKeepBytes) {
      data_.reset();
      size_ = 0;
    }
  }

 private:
  std::unique_ptr<float[]> data_;
  size_t size_ = 0;
};

struct KvCacheScratch {
  ReusedBuffer q, k, v, out, lse;
  void release_large() {
    for (ReusedBuffer* b : {&q, &k, &v, &out, &lse}) b->release_if_large();
  }
};

// Each sequence's visible keys (cache positions [first, end)) as the varlen forward's key rows.
// A contiguous cache is read in place: seen as (entries x Smax) rows of Hk x D, sequence b's keys
// are rows [entry * Smax + first, + keys), reached through cu_seqlens_k (the starts, in any order)
// and seqused_k (the lengths), in the cache's dtype.  The forward then converts a bf16/fp16 tile
// every time a query tile reads it, which pays only when one query tile reads each K/V tile
// (tile_read_once): with a group's query heads read separately, 1 x 32k bf16 with ALiBi took 147
// ms in place against 95 gathered.  Otherwise, and for a paged cache (positions are not rows of
// one tensor), the keys are gathered into float32 rows packed by cu_seqlens_k.
struct KeyRows {
  const void* k;
  const void* v;
  int64_t k_batch_stride = 0, v_batch_stride = 0;  // a page's, when the rows are pages (paged)
  int64_t k_row_stride, k_head_stride, v_row_stride, v_head_stride;
  bool paged = false;  // the cache's pages read in place through `pages`
  PageMap pages{};
  tileattn_dtype dtype;
  std::vector<int32_t> cu_k, used_k;  // used_k empty when the rows are packed
  int max_k = 0;
  int64_t total_k = 0;
};

KeyRows visible_keys(const KvCacheParams& p, bool tile_read_once, KvCacheScratch& scratch) {
  const ForwardParams& f = p.fwd;
  const int B = f.batch, Hk = f.num_heads_k, D = f.head_dim;
  // Read in place, a cache is (entries x rows_per_entry) rows: a contiguous cache's entries of Smax
  // rows, or a paged one's block-table rows of max_blocks x page_size positions through a PageMap.
  // Pages are converted tile by tile even in float32 (a tile crosses pages), so they are read in
  // place only where each tile is read once; gathered, bf16 1 x 32k took twice the contiguous
  // cache's time (bench/results/cpu-decode-paged-varlen-bf16-2026-12-05.csv, kvcache-paged).
  const bool paged = p.block_table != nullptr;
  const int64_t rows_per_entry = paged ? f.seqlen_k : f.k_row_stride > 0 ? f.k_batch_stride / f.k_row_stride : 0;
  const bool entries_evenly_spaced = f.k_row_stride > 0 && f.k_batch_stride % f.k_row_stride == 0 &&
                                     f.v_row_stride > 0 && f.v_batch_stride == rows_per_entry * f.v_row_stride;
  const bool in_place = (paged ? tile_read_once : (f.dtype == TILEATTN_FLOAT32 || tile_read_once) && entries_evenly_spaced) &&
                        static_cast<int64_t>(p.num_cache_entries) * rows_per_entry < INT32_MAX;
  KeyRows keys;
  keys.cu_k.assign(B + 1, 0);
  if (in_place) keys.used_k.resize(B);
  for (int b = 0; b < B; ++b) {
    const int64_t first = cache_first_key(p, b);
    const int count = static_cast<int>(cache_end_key(p, b) - first);
    if (in_place) {
      const int64_t entry = p.cache_batch_idx ? p.cache_batch_idx[b] : b;
      keys.cu_k[b] = static_cast<int32_t>(entry * rows_per_entry + first);
      keys.used_k[b] = count;
    } else {
      keys.cu_k[b + 1] = keys.cu_k[b] + count;
    }
    keys.max_k = std::max(keys.max_k, count);
  }
  if (in_place) {
    keys.k = f.k, keys.v = f.v, keys.dtype = f.dtype;
    keys.k_row_stride = f.k_row_stride, keys.k_head_stride = f.k_head_stride;
    keys.v_row_stride = f.v_row_stride, keys.v_head_stride = f.v_head_stride;
    keys.total_k = static_cast<int64_t>(p.num_cache_entries) * rows_per_entry;
    if (paged) {
      keys.paged = true;
      keys.pages = PageMap{p.block_table, p.block_table_batch_stride, rows_per_entry, p.page_size};
      keys.k_batch_stride = f.k_batch_stride, keys.v_batch_stride = f.v_batch_stride;
    }
    return keys;
  }
  keys.total_k = keys.cu_k[B];
  float* k = scratch.k.get(static_cast<size_t>(keys.total_k) * Hk * D);
  float* v = scratch.v.get(static_cast<size_t>(keys.total_k) * Hk * D);
  const std::vector<int32_t>& cu_k = keys.cu_k;
  struct None {};
  parallel_tasks<None>(
      B, f.num_threads, [] { return None{}; },
      [&](int64_t b, None&) {
        const int64_t first = cache_first_key(p, static_cast<int>(b));
        for (int64_t r = cu_k[b]; r < cu_k[b + 1]; ++r) {
          const int64_t pos = first + r - cu_k[b];
          for (int h = 0; h < Hk; ++h) {
            const int64_t k_at = cache_row_offset(p, b, pos, f.k_batch_stride, f.k_row_stride) + h * f.k_head_stride;
            const int64_t v_at = cache_row_offset(p, b, pos, f.v_batch_stride, f.v_row_stride) + h * f.v_head_stride;
            load_row(f.dtype, f.k, k_at, D, k + (r * Hk + h) * D);
            load_row(f.dtype, f.v, v_at, D, v + (r * Hk + h) * D);
          }
        }
      });
  keys.k = k, keys.v = v, keys.dtype = TILEATTN_FLOAT32;
  keys.k_row_stride = keys.v_row_stride = static_cast<int64_t>(Hk) * D;
  keys.k_head_stride = keys.v_head_stride = D;
  return keys;
}

}  // namespace
}  // namespace cpu

void cpu_forward_kvcache(const KvCacheParams& p) {
  using namespace cpu;
  const ForwardParams& f = p.fwd;
  if (f.cu_seqlens_q != nullptr) {
    forward_kvcache_packed_q(p);
    return;
  }
  const int B = f.batch, Sq = f.seqlen_q, H = f.num_heads, Hk = f.num_heads_k, D = f.head_dim;
  if (p.k_new != nullptr) append(p);

  // q as float32 rows (B * Sq, H, D), rotated at cache_seqlens + i when causal or windowed (each
  // row its own position), else all at cache_seqlens.
  const bool per_row_position = rotary_position_per_row(f);
  thread_local KvCacheScratch scratch;
  struct ReleaseLarge {  // also when the forward throws
    KvCacheScratch& s;
    ~ReleaseLarge() { s.release_large(); }
  } release_large{scratch};
  // A few tokens with GQA and nothing that differs between a group's query heads but q (no ALiBi
  // slopes, no dropout masks): the group's query heads become rows of their KV head
  // (FlashAttention's seqlen_q / groups swap; rows (token i, head g) at i * group + g, each token's
  // heads under its mask through ScoreRule::rows_per_position), so the forward reads each K/V row
  // once per group instead of once per query head, with products of Sq x group rows.
  const int group = H / Hk;
  const bool heads_as_rows = group > 1 && kv_groups_as_rows(static_cast<int64_t>(Sq) * group, f) &&
                             static_cast<int64_t>(B) * Sq * group <= INT32_MAX;  // int32 rows in cu_q
  const int rows_per_seq = heads_as_rows ? Sq * group : Sq;  // query rows of one sequence in the forward
  const int heads = heads_as_rows ? Hk : H;                  // query heads in the forward
  // Offset of (sequence b, token i, query head h) in the float32 q and out rows.
  const GroupRows layout{heads_as_rows ? group : 1, heads, D};
  auto row_offset = [&](int64_t b, int i, int h) { return layout.offset(b * Sq + i, h); };
  const size_t q_elems = static_cast<size_t>(B) * Sq * H * D;
  float* q = scratch.q.get(q_elems);
  parallel_tasks<RowScratch>(
      static_cast<int64_t>(B) * Sq, f.num_threads, [] { return RowScratch{}; },
      [&](int64_t task, RowScratch& w) {
        const int b = static_cast<int>(task / Sq), i = static_cast<int>(task % Sq);
        for (int h = 0; h < H; ++h) {
          float* row = q + row_offset(b, i, h);
          load_row(f.dtype, f.q, b * f.q_batch_stride + i * f.q_row_stride + h * f.q_head_stride, D, row);
          if (p.rotary_cos) rotate(p, p.cache_seqlens[b] + (per_row_position ? i : 0), row, w.table);
        }
      });

  std::vector<int32_t> cu_q(B + 1);
  for (int b = 0; b <= B; ++b) cu_q[b] = b * rows_per_seq;
  // One query tile per (sequence, forward head) reads each K/V tile when the forward's heads are
  // the KV heads and a sequence's rows fit one tile.
  const bool tile_read_once = heads == Hk && rows_per_seq <= kFwdBlockM;
  const KeyRows keys = visible_keys(p, tile_read_once, scratch);

  // The attention itself: a varlen forward, q and out in float32.
  const int64_t total_q = static_cast<int64_t>(B) * rows_per_seq;
  float* out = scratch.out.get(q_elems);
  float* lse = scratch.lse.get(static_cast<size_t>(heads) * total_q);
  ForwardParams g = f;
  g.q = q, g.out = out, g.softmax_lse = lse, g.k = keys.k, g.v = keys.v;
  g.dtype = TILEATTN_FLOAT32;
  g.num_heads = heads, g.seqlen_q = rows_per_seq, g.seqlen_k = keys.max_k;
  g.q_batch_stride = g.out_batch_stride = 0;
  g.k_batch_stride = keys.k_batch_stride, g.v_batch_stride = keys.v_batch_stride;
  g.q_row_stride = g.out_row_stride = static_cast<int64_t>(heads) * D;
  g.q_head_stride = g.out_head_stride = D;
  g.k_row_stride = keys.k_row_stride, g.k_head_stride = keys.k_head_stride;
  g.v_row_stride = keys.v_row_stride, g.v_head_stride = keys.v_head_stride;
  g.lse_batch_stride = 0, g.lse_head_stride = total_q;
  g.cu_seqlens_q = cu_q.data(), g.cu_seqlens_k = keys.cu_k.data();
  g.seqused_k = keys.used_k.empty() ? nullptr : keys.used_k.data();
  g.total_q = total_q, g.total_k = keys.total_k;
  const KvProducts products = choose_kv_products(f.dtype, keys.dtype, rows_per_seq, D);
  forward_with_kv_tiles(g, keys.dtype, keys.paged ? &keys.pages : nullptr, products, heads_as_rows ? group : 1);

  for (int b = 0; b < B; ++b) {
    for (int i = 0; i < Sq; ++i) {
      for (int h = 0; h < H; ++h) {
        const int64_t at = row_offset(b, i, h);
        store_row(f.dtype, out + at, D, f.out, b * f.out_batch_stride + i * f.out_row_stride + h * f.out_head_stride);
        // The forward's LSE is (its heads, its rows); its (row, head) is at `at` / D.
        const int64_t row = at / D / heads, head = at / D % heads;
        f.softmax_lse[b * f.lse_batch_stride + h * f.lse_head_stride + i] = lse[head * total_q + row];
      }
    }
  }
}

}  // namespace tileattn
