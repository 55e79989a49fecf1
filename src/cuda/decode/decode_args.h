// The arguments every decode kernel shares, and the one rule that says which cache positions a
// sequence owns.  Host and device both include this file.
#pragma once

#include <cuda.h>
#include <stdint.h>

#include "common/fast_divisor.h"
#include "common/host_device.h"
#include "common/kvcache.h"
#include "common/packed_rows.h"
#include "cuda/decode/decode_shape.h"
#include "tileattn/tileattn.h"

namespace tileattn::cuda::decode {

struct DecodeArgs {
  // K and V caches as 4-D tensors (head_dim, Hk, rows, units) for TMA, units being cache entries
  // or pages, read in boxes of (64, 1, tma_box_keys, 1) with the 128-byte swizzle; set when `tma`
  // (cuda_decode.cu says when).
  CUtensorMap tma_k, tma_v;
  bool tma;
  // With `tma`: kLoopRing, kLoopWideRing or kLoopRingThree (cuda_decode.cu's ring_chosen); one byte,
  // so the fields after it keep their offsets in the kernels' parameter block.
  unsigned char ring;
  int tma_box_keys;  // keys a TMA box covers: the block, or gcd(block, page size) for paged caches
  tileattn_kvcache_params p;  // validated by src/api, softmax_scale resolved
  int group;                  // H / Hk: query heads per KV head
  int rows;                   // group x seqlen_q: query rows that share one KV head
  int row_blocks;             // ceil(rows / kRows)
  FastDivisor seqlen_q_div;   // local row -> (query head, query row) without a runtime division
  int num_splits;
  bool cluster_merge;         // the splits run as one cluster and merge there (cluster_merge.cuh)
  bool vector_q, vector_k, vector_v;  // 16-byte loads are aligned for q and the caches
  float* o_partial;           // (num_splits, B, H, Sq, D) float32 when num_splits > 1
  float* lse_partial;         // (num_splits, B, H, Sq), natural log, -inf for an empty split
  // page_size for paged calls: both loops' page lookups and in-page rows divide by it at every
  // request, lane 0's path to the next block's issue in the TMA loop (tma_block_loop.cuh).  Last,
  // so the fields above keep their offsets in the kernels' parameter block.
  FastDivisor page_div;
  // The split kernel's CTA index -> (KV head, row block, sequence) without the two runtime
  // divisions (~25 dependent instructions each) at the head of every CTA.
  FastDivisor heads_k_div, row_blocks_div;
};

// Split CTAs of one split: batch x row blocks x KV heads (the unsplit grid).
inline int64_t split_ctas(const DecodeArgs& args) {
  return static_cast<int64_t>(args.p.fwd.batch) * args.row_blocks * args.p.fwd.num_heads_k;
}

// Sequence b attends to cache positions [first, end) of cache row `row` (an entry of the
// contiguous cache or a row of block_table).  `ok` is false when the device-side index arrays
// break a rule that validate_kvcache_contents checks on the CPU; the CUDA backend cannot check
// them on the host without a sync, so the kernels skip the append and write NaN outputs for
// such a sequence instead of reading or writing out of bounds.
struct SequenceKeys {
  int first, end, seqlen, row;
  bool ok;
};

// Sequence b's cache length when a paged varlen call gives it (cache_seqlens NULL, tileattn.h):
// seqused_k[b], else its cu_seqlens_k count; -1, which sequence_keys refuses, where those break
// the CPU's rules (a count outside [0, max_seqlen_k], seqused_k outside [0, the count]).
TILEATTN_HOST_DEVICE int varlen_cache_length(const tileattn_kvcache_params& p, int b) {
  const int64_t keys = static_cast<int64_t>(p.fwd.cu_seqlens_k[b + 1]) - p.fwd.cu_seqlens_k[b];
  const int64_t used = p.fwd.seqused_k ? p.fwd.seqused_k[b] : keys;
  const bool ok = keys >= 0 && keys <= p.max_seqlen_k && used >= 0 && used <= keys;
  return ok ? static_cast<int>(used) : -1;
}

// Sequence b's cache length before the append: its cache_seqlens entry, the one length every
// sequence shares (an int cache_seqlens), or the varlen count above.
TILEATTN_HOST_DEVICE int cache_length(const tileattn_kvcache_params& p, int b) {
  if (p.cache_seqlens) return p.cache_seqlens[b];
  if (p.uniform_cache_seqlen) return p.cache_seqlen;
  return varlen_cache_length(p, b);
}

TILEATTN_HOST_DEVICE SequenceKeys sequence_keys(const tileattn_kvcache_params& p, int b) {
  SequenceKeys s;
  s.seqlen = cache_length(p, b);
  const int added = p.k_new ? p.seqlen_new : 0;
  s.first = p.cache_leftpad ? p.cache_leftpad[b] : 0;
  s.row = p.cache_batch_idx ? p.cache_batch_idx[b] : b;
  s.end = s.seqlen + added;
  s.ok = s.seqlen >= 0 && static_cast<int64_t>(s.seqlen) + added <= p.fwd.seqlen_k && s.first >= 0 &&
         s.first <= s.seqlen && s.row >= 0 && s.row < p.num_cache_entries;
  if (p.rotary_cos) s.ok = s.ok && static_cast<int64_t>(s.seqlen) + rotary_positions_past_cache(p) <= p.rotary_seqlen;
  return s;
}

// Where query slot i (0 <= i < seqlen_q) of sequence b lives in q and out, and its LSE.  Batch
// form: (b, i).  Packed rows (fwd.cu_seqlens_q): right-aligned, slot i holds packed row
// cu_seqlens_q[b] + i - (seqlen_q - rows_b), so the kernels' bottom-right masks over seqlen_q
// slots are the rows' own; slots before first_live hold no row (q reads zeros there, nothing is
// stored).  A sequence whose entries break the CPU's cu_seqlens_q rules has no live slot, and
// poison_out_of_bounds_forward then writes NaN over every output.
struct QuerySlots {
  int64_t batch;      // b in batch form, 0 packed
  int64_t first_row;  // row of slot 0 (packed; may be negative) or 0
  int first_live;
  TILEATTN_HOST_DEVICE bool live(int i) const { return i >= first_live; }
  TILEATTN_HOST_DEVICE int64_t offset(int i, int h, int64_t batch_stride, int64_t row_stride,
                                     int64_t head_stride) const {
    return batch * batch_stride + (first_row + i) * row_stride + h * head_stride;
  }
  TILEATTN_HOST_DEVICE int64_t lse_offset(const tileattn_fwd_params& f, int i, int h) const {
    return batch * f.lse_batch_stride + h * f.lse_head_stride + first_row + i;
  }
};

TILEATTN_HOST_DEVICE QuerySlots query_slots(const tileattn_fwd_params& f, int b) {
  if (f.cu_seqlens_q == nullptr) return QuerySlots{b, 0, 0};
  const int64_t q0 = f.cu_seqlens_q[b], q1 = f.cu_seqlens_q[b + 1];
  const bool ok = packed_rows_in_bounds(f.cu_seqlens_q, b, f.total_q, f.seqlen_q);
  const int first_live = ok ? static_cast<int>(f.seqlen_q - (q1 - q0)) : f.seqlen_q;
  return QuerySlots{0, q0 - first_live, first_live};
}

// Where one split CTA's blocks are: block c covers cache positions base + c step .. + step - 1
// (step: 16 keys in the register loop, TmaRing::kKeys in the TMA loop; base aligned to step, so a
// TMA box of gcd(step, page size) keys never straddles a page), this split's blocks are
// [begin, end), warp w takes begin + w, begin + w + 4, ...; keys outside [vis_lo, vis_hi] are seen
// by no row of the CTA and never loaded.
struct BlockWalk {
  int base, begin, end, vis_lo, vis_hi, common_lo, common_hi;  // common: keys every row sees
  int kv_head, sequence;  // sequence: b, whose k_new/v_new row the one-token path reads
};

// Element offset of cache position `pos` (head 0) of a sequence, or -1 when its page index is out
// of range.  Contiguous caches step entries with the batch stride, paged ones step pages.
TILEATTN_HOST_DEVICE int64_t cache_offset(const tileattn_kvcache_params& p, const SequenceKeys& s,
                                          int64_t pos, int64_t batch_stride, int64_t row_stride) {
  if (p.block_table == nullptr) return s.row * batch_stride + pos * row_stride;
  const int block = p.block_table[s.row * p.block_table_batch_stride + pos / p.page_size];
  if (block < 0 || block >= p.num_blocks) return -1;
  return block * batch_stride + (pos % p.page_size) * row_stride;
}

}  // namespace tileattn::cuda::decode
