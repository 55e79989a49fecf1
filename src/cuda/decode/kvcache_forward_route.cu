// KV-cache calls on the forward kernels: the route's rules and its lengths kernel
// (kvcache_forward_route.h says why).
#include "cuda/decode/kvcache_forward_route.h"

#include "common/env_choice.h"
#include "cuda/check.h"
#include "cuda/decode/decode_args.h"
#include "cuda/device_checks.h"
#include "cuda/forward_kernels.h"
#include "cuda/sm90/tile_config_sm90.h"

namespace tileattn::cuda::decode {
namespace {

// Measured on an H100 (kvcache_forward_route.h): the forward 1.35x the decode kernels at 16 rows a
// sequence (64 a KV group of 4), behind them at one row.  Pages read box by box
// (sm90/paged_boxes_sm90.h) cross over at the same 16 rows since a warp's lanes issue a block's
// boxes side by side (H100, 4 x 4k keys, 32/8 heads, CUDA graphs, session 65; pages of 16): 16 rows
// 48-52 us against the decode kernels' 50-51, 24 rows 49 against 96, 8 rows 48 against 37.
constexpr int kRouteMinSeqlenQ = 16;
// The decode kernels give every 16 rows of a KV group a CTA that streams the whole cache, so their
// time steps with the group's 16-row chunks while the forward's holds near its floor: at 2 query
// heads a KV head (H100, 4 x 4k keys, 16/8 heads, d128, session 65) 16 rows a sequence (2 chunks)
// took 35 us against the forward's 41, 24 rows (3 chunks) 53-54 against 41; with 4 heads 16 rows
// (4 chunks) 50-51 against 39-40.  From three chunks, then.
constexpr int kRouteMinGroupRows = 48;
// The decode kernels give each stream (a sequence, KV head and 16-row chunk of the group) CTAs that
// split its keys; the route runs one round of few tiles, each cut into key shares where the
// sequence-bounds key split finds the SMs idle (src/cuda/sm90/tail_split_choice.h), plus the
// lengths kernel and, with packed heads, a copy of q.  Measured on an H100 (32/8 heads, d128, CUDA
// graphs, session 69; bench/results/h100-kvcache-rows-stream-bound-2026-12-06-session69.txt): 1 x
// 4k keys, 16 rows (32 streams) 22 us on the decode kernels against 25 on the route, 32 rows (64
// streams) 32 against 24; 2 x 4k, 16 rows (64) 32 against 34, 32 rows (128) 50 against 34; 1 x 16k,
// 16 rows (32) 55 against 52, 64 rows (128) 175 against 51.  So the route from more than 32
// streams: the calls at 64 streams lose 6% or gain 25%, and at 32 streams at most 6% is left.
constexpr int64_t kDecodeMaxStreams = 32;

constexpr int kLengthThreads = 256;
constexpr uint16_t kNan16 = 0x7fff;  // NaN in both float16 and bfloat16

// One CTA a sequence.  Launched in stream order after the append kernel (not programmatically), so
// cache_seqlens and the caches are settled.
__global__ void __launch_bounds__(kLengthThreads) route_lengths_kernel(const tileattn_kvcache_params p,
                                                                       int32_t* lengths) {
  const int b = blockIdx.x;
  const SequenceKeys seq = sequence_keys(p, b);
  bool ok = seq.ok;
  if (ok && p.block_table != nullptr) {
    // Every page holding a key the sequence attends to exists (the forward's producer reads them
    // without a check); a bad one makes the whole sequence NaN.
    const int pages = static_cast<int>((static_cast<int64_t>(seq.end) + p.page_size - 1) / p.page_size);
    bool bad = false;
    for (int j = threadIdx.x; j < pages; j += kLengthThreads) {
      const int32_t page = p.block_table[seq.row * p.block_table_batch_stride + j];
      bad = bad || page < 0 || page >= p.num_blocks;
    }
    ok = !__syncthreads_or(bad);
  }
  if (threadIdx.x == 0) lengths[b] = ok ? seq.end : -1;
  if (ok) return;
  // The sequence's rows: (b, row) in batch form, its packed rows with cu_seqlens_q (query_slots;
  // none when its cu_seqlens_q entries break the rules, which poison_bad_packed_rows then covers).
  const tileattn_fwd_params& f = p.fwd;
  const QuerySlots slots = query_slots(f, b);
  const int live = f.seqlen_q - slots.first_live;
  const int64_t elements = static_cast<int64_t>(live) * f.num_heads * f.head_dim;
  uint16_t* out = static_cast<uint16_t*>(f.out);
  for (int64_t i = threadIdx.x; i < elements; i += kLengthThreads) {
    const int64_t d = i % f.head_dim, h = i / f.head_dim % f.num_heads, r = i / (int64_t{f.head_dim} * f.num_heads);
    const int slot = slots.first_live + static_cast<int>(r);
    out[slots.offset(slot, static_cast<int>(h), f.out_batch_stride, f.out_row_stride, f.out_head_stride) + d] = kNan16;
  }
  for (int64_t i = threadIdx.x; i < static_cast<int64_t>(live) * f.num_heads; i += kLengthThreads) {
    const int slot = slots.first_live + static_cast<int>(i % live), h = static_cast<int>(i / live);
    f.softmax_lse[slots.lse_offset(f, slot, h)] = __int_as_float(0x7fffffff);
  }
}

int64_t rows_of_q(const tileattn_fwd_params& f) {
  return f.cu_seqlens_q != nullptr ? f.total_q : static_cast<int64_t>(f.batch) * f.seqlen_q;
}

int64_t round256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

// Bytes of a copy of q (or of out) and of the packed LSE.
int64_t q_elements_bytes(const KvCacheParams& p) { return rows_of_q(p.fwd) * p.fwd.num_heads * p.fwd.head_dim * 2; }
int64_t lse_bytes(const KvCacheParams& p) { return rows_of_q(p.fwd) * p.fwd.num_heads * int64_t{sizeof(float)}; }

// Tiles of `rows` query rows a head, in rounds of `sms` tiles.
int64_t tile_rounds(const KvCacheParams& p, int64_t rows, int heads, int sms) {
  const int block_m = sm90::sm90_block_m(sm90::sm90_head_dim_bucket(p.fwd.head_dim));
  const int64_t tiles = (rows + block_m - 1) / block_m * heads * p.fwd.batch;
  return (tiles + sms - 1) / sms;
}

// Where the workspace's parts start (route_buffers), -1 for a part the call does not use, and its
// end: the key counts, q's copy (rotary or packed heads), the packed out, the packed LSE.
struct RouteOffsets {
  int64_t q_copy, out_packed, lse_packed, end;
};
RouteOffsets route_offsets(const KvCacheParams& p, bool packed) {
  RouteOffsets o{-1, -1, -1, round256(p.fwd.batch * int64_t{sizeof(int32_t)})};
  if (p.rotary_cos != nullptr || packed) {
    o.q_copy = o.end;
    o.end += round256(q_elements_bytes(p));
  }
  if (packed) {
    o.out_packed = o.end;
    o.lse_packed = o.out_packed + round256(q_elements_bytes(p));
    o.end = o.lse_packed + round256(lse_bytes(p));
  }
  return o;
}

}  // namespace

KvIndex route_kv_index(const KvCacheParams& p, bool packed) {
  KvIndex kv{};
  if (packed) kv.query_heads_packed = FastDivisor::make(p.fwd.num_heads / p.fwd.num_heads_k);
  // Packed query rows index a contiguous cache too: their q batch coordinate is 0 (kv_entry).
  if (p.cache_batch_idx == nullptr && p.block_table == nullptr && p.fwd.cu_seqlens_q == nullptr) return kv;
  kv.batch_idx = p.cache_batch_idx;
  kv.block_table = p.block_table;
  kv.table_stride = p.block_table_batch_stride;
  kv.page_size = p.page_size;
  kv.num_units = p.block_table != nullptr ? p.num_blocks : p.num_cache_entries;
  return kv;
}

// The buffers for the params' checks only: the key counts' place marks the sequence bounds, and
// the workspace's copies are 256-byte aligned, as a null pointer is (sm90_forward_serves reads
// pointers for their alignment alone).  A uniform cache_seqlen has no array: the mark is then
// any aligned address, never read.
RouteBuffers check_buffers(const KvCacheParams& p) {
  alignas(256) static const int32_t uniform_lengths_mark[1] = {0};
  const int32_t* lengths = p.cache_seqlens != nullptr ? p.cache_seqlens
                           : p.uniform_cache_seqlen    ? uniform_lengths_mark
                                                       : p.fwd.cu_seqlens_k;
  return {const_cast<int32_t*>(lengths), nullptr, nullptr, nullptr};
}

bool forward_route_possible(const KvCacheParams& p) {
  const ForwardParams& f = p.fwd;
  // Key counts from cache_seqlens, or with packed query rows from cu_seqlens_k / seqused_k (a paged
  // flash_attn_varlen_func call, tileattn.h): the lengths kernel turns either into seqused_k.
  // Rotary: q rotated into a workspace copy first (route_copies.cu), k by the append kernel.
  const bool plain = p.cache_leftpad == nullptr && p.num_splits == 0;
  if (!plain) return false;
  if (f.cu_seqlens_q == nullptr && p.cache_batch_idx == nullptr && p.block_table == nullptr) {
    return true;  // any forward family
  }
  // Packed query rows, entries and pages (any size: those not holding whole key blocks come box by
  // box, sm90/paged_boxes_sm90.h): the sm90 family's sequence-bounds kernels only.
  return sm90_forward_serves(forward_route_params(p, check_buffers(p), false));
}

bool forward_route_taken(const KvCacheParams& p) {
  const int choice = env_choice("TILEATTN_KVCACHE_FORWARD", {"auto", "on", "off"});
  if (choice == 2) return false;
  // The rows first: a decode step (auto, a few rows) never asks which forward family would serve.
  const int64_t group_rows = static_cast<int64_t>(p.fwd.num_heads / p.fwd.num_heads_k) * p.fwd.seqlen_q;
  if (choice == 0 && (p.fwd.seqlen_q < kRouteMinSeqlenQ || group_rows < kRouteMinGroupRows)) return false;
  const int64_t decode_streams = static_cast<int64_t>(p.fwd.batch) * p.fwd.num_heads_k * ((group_rows + 15) / 16);
  if (choice == 0 && decode_streams <= kDecodeMaxStreams) return false;
  return forward_route_possible(p);
}

bool route_can_pack_heads(const KvCacheParams& p) {
  const ForwardParams& f = p.fwd;
  if (f.num_heads == f.num_heads_k || f.cu_seqlens_q != nullptr || f.alibi_slopes != nullptr) return false;
  return sm90_forward_serves(forward_route_params(p, check_buffers(p), true));
}

bool route_packs_heads(const KvCacheParams& p, bool can_pack) {
  const int choice = env_choice("TILEATTN_KVCACHE_PACK_GQA", {"auto", "on", "off"});
  if (choice == 2 || !can_pack) return false;
  if (choice == 1) return true;
  // Measured on an H100 (32 x 4k keys, 32 query heads over 8, d128, CUDA graphs): 8-32 rows a
  // sequence (a group's rows in one tile) 277-286 us unpacked -> 199-223 packed, causal alike; at
  // 4 sequences (one round either way) unpacked led, 16 rows 40 us against 47 (session 66).  Past
  // one tile a group, since the scheduler's pair-major groups (session 67): 64 rows 288-292 -> 264
  // non-causal and causal, 96 rows 374-391 -> 372-376 (6 rounds against 8); 128 rows, as many
  // rounds either way, 384-400 -> 480-488.  So: fewer rounds of the SMs.
  const int g = p.fwd.num_heads / p.fwd.num_heads_k;
  const int64_t group_rows = static_cast<int64_t>(p.fwd.seqlen_q) * g;
  const int sms = sm_count();
  return tile_rounds(p, group_rows, p.fwd.num_heads_k, sms) < tile_rounds(p, p.fwd.seqlen_q, p.fwd.num_heads, sms);
}

RouteQLayout route_q_layout(const KvCacheParams& p, bool packed) {
  const ForwardParams& f = p.fwd;
  const int64_t d = f.head_dim;
  if (!packed) {  // dense in q's form: packed query rows count from row 0 of the copy
    const int64_t row = f.num_heads * d;
    return {(f.cu_seqlens_q != nullptr ? f.total_q : f.seqlen_q) * row, row, 0, f.num_heads};
  }
  const int g = f.num_heads / f.num_heads_k;
  return {static_cast<int64_t>(f.seqlen_q) * f.num_heads * d, g * d, static_cast<int64_t>(f.seqlen_q) * g * d, g};
}

int64_t route_workspace_bytes(const KvCacheParams& p, bool can_pack) { return route_offsets(p, can_pack).end; }

int64_t forward_route_workspace_bytes(const KvCacheParams& p) {
  return forward_route_possible(p) ? route_workspace_bytes(p, route_can_pack_heads(p)) : 0;
}

RouteBuffers route_buffers(const KvCacheParams& p, char* workspace, bool packed) {
  const RouteOffsets o = route_offsets(p, packed);
  RouteBuffers b{reinterpret_cast<int32_t*>(workspace), nullptr, nullptr, nullptr};
  if (o.q_copy >= 0) b.q_copy = workspace + o.q_copy;
  if (packed) {
    b.out_packed = workspace + o.out_packed;
    b.lse_packed = reinterpret_cast<float*>(workspace + o.lse_packed);
  }
  return b;
}

void launch_route_lengths(const KvCacheParams& p, int32_t* lengths, cudaStream_t stream) {
  route_lengths_kernel<<<p.fwd.batch, kLengthThreads, 0, stream>>>(p, lengths);
  check_cuda(cudaGetLastError(), "KV-cache route lengths kernel launch");
}

ForwardParams forward_route_params(const KvCacheParams& p, const RouteBuffers& buffers, bool packed) {
  ForwardParams f = p.fwd;
  f.seqused_k = buffers.lengths;
  f.cu_seqlens_k = nullptr;  // packed query rows keep the cache's batch form (sm90_sequence_view)
  f.total_k = 0;
  if (buffers.q_copy != nullptr || packed) {  // route_q_layout's
    const RouteQLayout q = route_q_layout(p, packed);
    f.q = buffers.q_copy;
    f.q_head_stride = packed ? q.group_stride : f.head_dim;
    f.q_row_stride = packed ? f.head_dim : q.row_stride;
    f.q_batch_stride = q.batch_stride;
  }
  if (packed) {  // Hk heads of seqlen_q * g rows, out and LSE in the same packed order
    const int g = f.num_heads / f.num_heads_k;
    f.num_heads = f.num_heads_k;
    f.seqlen_q *= g;
    f.out = buffers.out_packed;
    f.out_head_stride = f.q_head_stride;
    f.out_row_stride = f.q_row_stride;
    f.out_batch_stride = f.q_batch_stride;
    f.softmax_lse = buffers.lse_packed;
    f.lse_head_stride = f.seqlen_q;
    f.lse_batch_stride = static_cast<int64_t>(f.num_heads) * f.seqlen_q;
  }
  return f;
}

}  // namespace tileattn::cuda::decode
