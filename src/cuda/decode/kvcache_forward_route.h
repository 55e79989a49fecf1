// KV-cache calls with many query rows (a chunked prefill through flash_attn_with_kvcache) on the
// forward kernels.  The decode kernels give every 16 rows of a KV group a CTA of their own that
// streams the sequence's whole cache with m16 mma.sync tiles: at 512 rows a sequence (32 query
// heads over 8, 4 x 4k keys) 1248 us against the sm90 forward's 181 us on the same data, at 16 rows
// 50 against 37, while at one row the decode kernels lead, 33 against 37 (H100, session 62,
// bench/results/h100-kvcache-rows-main-2026-12-06-session62.txt).  The forward reads a contiguous cache
// as its k/v in batch form, each sequence's keys being its cache length after the append, given
// as seqused_k.  On the sm90 family the forward also reads cache entries through cache_batch_idx
// and pages through block_table (KvIndex, launch_api.h): a key block at a time from pages of a
// multiple of the block (flash-attn 2's 256), box by box from several pages otherwise (vLLM's 16;
// sm90/paged_boxes_sm90.h), and packed query rows (cu_seqlens_q: flash_attn_varlen_func's paged
// prefill, whose key counts come from cu_seqlens_k or seqused_k) through the bounds kernels' own
// sequence view (sm90/sequence_bounds_sm90.h).  Rotary: the append kernel rotates the
// new keys as it writes them, and q is rotated into a copy in the workspace that the forward reads.
// A few rows a sequence fill little of a 128-row tile, and every query head's tile streams its KV
// head's whole cache: where that costs rounds of the SMs, the copy packs each KV group's query heads
// into the rows (route_packs_heads) and the forward runs over the KV heads.
// What it cannot express (cache_leftpad, a fixed num_splits, whose batch-invariant bits only the
// split kernels keep; entries, pages and packed rows on other GPUs) stays on the decode kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/launch_api.h"
#include "tileattn/tileattn.hpp"

namespace tileattn::cuda::decode {

// Whether the forward kernels can serve the call at all (the shapes and options above).
bool forward_route_possible(const KvCacheParams& p);

// Whether this call takes them: TILEATTN_KVCACHE_FORWARD = auto (default) | on | off, read on every
// call; `on` takes every call they can serve, `auto` those with at least kRouteMinSeqlenQ query rows
// a sequence and kRouteMinGroupRows a KV group whose decode kernels would run more than
// kDecodeMaxStreams streams of the cache (sequences x KV heads x 16-row chunks of a group).
bool forward_route_taken(const KvCacheParams& p);

// Whether the route packs each KV group's query heads into the forward's rows (flash-attn 3's
// pack_gqa; sm90/packed_heads_sm90.h): q copied so that KV head h's rows are its g query heads
// token by token, the forward run over Hk heads of seqlen_q * g rows, its out and LSE copied back.
// Possible on the sm90 family for q in batch form without ALiBi (whose slope is a query head's);
// TILEATTN_KVCACHE_PACK_GQA = auto (default) | on | off, read on every call: `auto` packs where the
// packed tiles take fewer rounds of the SMs than the unpacked.
// route_can_pack_heads is asked of a call forward_route_possible accepts, route_packs_heads with
// its answer.
bool route_can_pack_heads(const KvCacheParams& p);
bool route_packs_heads(const KvCacheParams& p, bool can_pack);

// Where the route's copy of q (or the packed out) keeps element d of (sequence b, query slot i,
// head h): at slots.offset(i, 0, batch_stride, row_stride, 0) + (h / group) * group_stride +
// (h % group) * head_dim + d, QuerySlots as decode_args.h has them.  Dense in q's form: group =
// num_heads; packed by KV group: group = g, rows of g heads a token.
struct RouteQLayout {
  int64_t batch_stride, row_stride, group_stride;
  int group;
};
RouteQLayout route_q_layout(const KvCacheParams& p, bool packed);

// The route's workspace, each part 256-byte aligned: the key counts (one int32 a sequence), then
// where q is copied (rotary or packed heads) the copy, then where heads are packed the packed out
// and LSE.  forward_route_workspace_bytes covers every choice the call may make (the environment is
// read per call); 0 where the route is not possible.  route_workspace_bytes: the same for a call
// the route takes, given route_can_pack_heads.
struct RouteBuffers {
  int32_t* lengths;
  void* q_copy;        // null: the forward reads q
  void* out_packed;    // null: the forward writes out and softmax_lse
  float* lse_packed;
};
int64_t forward_route_workspace_bytes(const KvCacheParams& p);
int64_t route_workspace_bytes(const KvCacheParams& p, bool can_pack);
RouteBuffers route_buffers(const KvCacheParams& p, char* workspace, bool packed);

// lengths[b] = sequence b's keys after the append (cache_seqlens[b] + seqlen_new), or -1 where its
// index arrays break the rules (decode_args.h's sequence_keys: the forward then skips it), whose
// out rows and LSE this writes NaN, as the decode kernels do.  Launched after the append kernel.
void launch_route_lengths(const KvCacheParams& p, int32_t* lengths, cudaStream_t stream);

// q copied into `layout` at dst, rotated when the call has rotary tables (at the positions the
// decode kernels use), for the sequences whose lengths are not -1.  Launched after the lengths.
void launch_route_copy_q(const KvCacheParams& p, const int32_t* lengths, const RouteQLayout& layout, void* dst,
                         cudaStream_t stream);

// With packed heads: the forward's packed out and LSE copied into out and softmax_lse, for the
// sequences whose lengths are not -1 (the lengths kernel wrote the others').
void launch_route_unpack(const KvCacheParams& p, const int32_t* lengths, const RouteBuffers& buffers,
                         cudaStream_t stream);

// The forward's params for the call: k/v the cache (fwd.seqlen_k = Smax, or max_blocks x page_size),
// seqused_k = lengths; q, out and softmax_lse as given, or q's copy, and with packed heads the
// packed buffers over Hk heads of seqlen_q * g rows.
ForwardParams forward_route_params(const KvCacheParams& p, const RouteBuffers& buffers, bool packed);

// Where the forward reads K/V from: all zero for a contiguous cache without cache_batch_idx or
// packed heads, else the entries or pages (launch_api.h's KvIndex) and the heads packed a row.
KvIndex route_kv_index(const KvCacheParams& p, bool packed);

}  // namespace tileattn::cuda::decode
