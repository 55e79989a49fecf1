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
// a sequence and kRouteMinGroupRows a KV group.
bool forward_route_taken(const KvCacheParams& p);

// Workspace the route needs, 0 where it is not possible: the key counts (one int32 a sequence,
// 256-byte rounded: route_lengths_bytes), then with rotary the rotated copy of q
// (route_rotated_q_bytes, 256-byte rounded).
int64_t forward_route_workspace_bytes(const KvCacheParams& p);
int64_t route_lengths_bytes(const KvCacheParams& p);
int64_t route_rotated_q_bytes(const KvCacheParams& p);

// lengths[b] = sequence b's keys after the append (cache_seqlens[b] + seqlen_new), or -1 where its
// index arrays break the rules (decode_args.h's sequence_keys: the forward then skips it), whose
// out rows and LSE this writes NaN, as the decode kernels do.  Launched after the append kernel.
void launch_route_lengths(const KvCacheParams& p, int32_t* lengths, cudaStream_t stream);

// With rotary: q rotated into q_rotated (route_rotated_q_bytes, dense in q's form) at the positions
// the decode kernels use, for the sequences whose lengths are not -1.  Launched after the lengths.
void launch_route_rotate_q(const KvCacheParams& p, const int32_t* lengths, void* q_rotated, cudaStream_t stream);

// The forward's params for the call: q (or its rotated copy), out, softmax_lse and the options as
// given, k/v the cache (fwd.seqlen_k = Smax, or max_blocks x page_size), seqused_k = lengths.
ForwardParams forward_route_params(const KvCacheParams& p, const int32_t* lengths, const void* q_rotated = nullptr);

// Where the forward reads K/V from: all zero for a contiguous cache without cache_batch_idx, else
// the entries or pages (launch_api.h's KvIndex).
KvIndex route_kv_index(const KvCacheParams& p);

}  // namespace tileattn::cuda::decode
