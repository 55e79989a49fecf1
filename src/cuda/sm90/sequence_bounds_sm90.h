// Sequences whose bounds lie inside the TMA tensors: varlen (one packed tensor of rows, sequence b
// at rows [cu_seqlens[b], cu_seqlens[b + 1])) and seqused_k (keys past it are in the tensor).  TMA
// only clips at a tensor's ends, so the kernel built for these calls (Traits::kSeqBounds):
//   - addresses a sequence's rows from its first packed row (rows_from),
//   - skips the query tiles past a shorter sequence's end (the grid covers max_seqlen_q),
//   - zeroes the V rows past the sequence's keys before their PV product: those rows belong to the
//     next sequence or lie past seqused_k, and a NaN there times the 0 probability of its masked
//     column would still reach O (the K rows need nothing: their scores are overwritten by -inf),
//   - stores an O tile that ends inside the tensor element by element instead of by TMA, which
//     would write the next sequence's rows.
#pragma once

#include <cute/tensor.hpp>

#include "common/packed_rows.h"
#include "common/sequence.h"
#include "cuda/launch_api.h"

namespace tileattn::cuda::sm90 {

// The batch-mode traits with the sequence-bounds handling switched on.
template <typename Base>
struct SequenceBoundsTraits : Base {
  static constexpr bool kSeqBounds = true;
};

// A (rows, head_dim) coordinate tensor of one head, starting at row `first_row` when kSeqBounds.
template <bool kSeqBounds, typename Tensor>
__device__ __forceinline__ auto rows_from(Tensor const& rows, int64_t first_row) {
  if constexpr (kSeqBounds) {
    return cute::domain_offset(cute::make_coord(static_cast<int>(first_row), cute::_0{}), rows);
  } else {
    return rows;
  }
}

// Sequence b as the sm90 kernels see it: common/sequence.h's view, except for packed query rows
// over keys in batch form (cu_seqlens_q without cu_seqlens_k: the KV-cache route's packed calls,
// launch_api.h's KvIndex), where the q rows come from cu_seqlens_q and the keys start at row 0 of
// the sequence's cache entry or pages, seqused_k of them.  Only the sequence-bounds kernels get
// such calls; common/sequence.h keeps its one form because the FA2 backward spilled when its view
// gained selects (sequence.h, sequence_in_bounds).
template <typename Traits>
__device__ __forceinline__ SequenceView sm90_sequence_view(const ForwardParams& p, int b) {
  if constexpr (Traits::kSeqBounds) {
    if (p.cu_seqlens_q != nullptr && p.cu_seqlens_k == nullptr) {
      SequenceView s;
      s.q_base_row = p.cu_seqlens_q[b];
      s.seqlen_q = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
      s.k_base_row = 0;
      s.seqlen_k = p.seqused_k[b];
      s.q_batch = 0;
      return s;
    }
  }
  return sequence_view(p, b);
}

// sequence_in_bounds for the same two forms: packed rows over keys in batch form check the rows'
// entries and seqused_k against the cache's capacity (seqlen_k).
template <typename Traits>
__device__ __forceinline__ bool sm90_sequence_in_bounds(const ForwardParams& p, int b) {
  if constexpr (Traits::kSeqBounds) {
    if (p.cu_seqlens_q != nullptr && p.cu_seqlens_k == nullptr) {
      const int keys = p.seqused_k[b];
      return packed_rows_in_bounds(p.cu_seqlens_q, b, p.total_q, p.seqlen_q) && keys >= 0 && keys <= p.seqlen_k;
    }
  }
  return sequence_in_bounds(p, b);
}

// The batch coordinate of a sequence in the TMA tensors: 0 in varlen form (one packed batch).
__device__ __forceinline__ int tma_batch(SequenceView const& seq) { return static_cast<int>(seq.q_batch); }

// The K/V tensors' batch coordinate of sequence b, whose q coordinate is `batch`: on the KV-cache
// route (KvIndex, launch_api.h) its cache entry cache_batch_idx[b] (or b), which with pages is its
// block_table row; else `batch`.  (With packed query rows `batch` is 0, so an indexed call uses b.)
// The route's lengths kernel gave a sequence with an entry out of range no keys (seqused_k -1), so
// a sequence this is asked for has a valid one.
__device__ __forceinline__ int kv_entry(KvIndex const& kv, int b, int batch) {
  return kv.batch_idx != nullptr ? kv.batch_idx[b] : kv.num_units > 0 ? b : batch;
}

// Where key block n of cache entry `entry` lies in pages of kv.page_size rows (a multiple of
// kBlockN): page block_table[entry][n / blocks_per_page], its block n % blocks_per_page.  Only
// blocks holding a key of the sequence are asked for, whose pages the lengths kernel checked.
// (Smaller pages: paged_boxes_sm90.h.)
struct KvBlock {
  int unit, block;
};

template <int kBlockN>
__device__ __forceinline__ KvBlock kv_block_at(KvIndex const& kv, int entry, int n) {
  const int per_page = kv.page_size / kBlockN;
  return {kv.block_table[entry * kv.table_stride + n / per_page], n % per_page};
}

// Key `key` of sequence b (head kv_head) in K, element by element (the rescore's reads): in place
// (k_offset), or on the KV-cache route (kv.num_units > 0) in the sequence's cache entry, and with
// pages in page block_table[entry][key / page_size] at row key % page_size.
template <bool kIndexed, typename Element>
__device__ __forceinline__ const Element* key_row(ForwardParams const& p, KvIndex const& kv, SequenceView const& seq,
                                                  int b, int kv_head, int key) {
  const Element* k = static_cast<const Element*>(p.k);
  if (!kIndexed || kv.num_units == 0) {
    return k + k_offset(seq, p.k_batch_stride, p.k_row_stride, p.k_head_stride, key, kv_head);
  }
  const int entry = kv_entry(kv, b, tma_batch(seq));
  int unit = entry, row = key;
  if (kv.block_table != nullptr) {
    unit = kv.block_table[entry * kv.table_stride + key / kv.page_size];
    row = key % kv.page_size;
  }
  return k + unit * p.k_batch_stride + int64_t(row) * p.k_row_stride + int64_t(kv_head) * p.k_head_stride;
}

}  // namespace tileattn::cuda::sm90
