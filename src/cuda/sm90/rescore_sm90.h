// A key block's raw scores S = Q K^T for the elements one thread holds, recomputed from global
// memory in float32.  The reference step (softmax_sm90.h) overwrites S with P in place; when a P
// overflowed (a score at least 128 / scale_log2 above the row's reference) S is lost and this
// brings it back.  It never runs on data of ordinary range, so it is written for size, not speed:
// one dot product at a time, the K block read again through L2.
#pragma once

#include <cute/tensor.hpp>

#include "common/sequence.h"
#include "cuda/launch_api.h"
#include "cuda/sm90/sequence_bounds_sm90.h"

namespace tileattn::cuda::sm90 {

// scores, coords: (rows, cols) views of the thread's accumulator and of its (row, key) within the
// consumer's rows and the key block; row0, key0: the first query row and key they count from; b:
// the sequence, whose keys on the KV-cache route (kIndexed: the sequence-bounds kernels) may lie in
// a cache entry or in pages (key_row).
// Rows and keys past the sequence get 0 and are never read: the mask hides those keys whatever the
// wgmma's S held there (zeros from TMA's fill, or a varlen neighbour's keys), and those rows are
// never stored.  The elements go one at a time in a loop that is not
// unrolled, each result moved into its register by a select per register: unrolled, the 64
// dot-product loops would add ~1500 instructions to the kernel; a runtime index into the
// registers would move them all to local memory.
template <bool kIndexed, typename Element, typename TensorS, typename TensorC>
__device__ __forceinline__ void rescore_from_global(TensorS& scores, TensorC const& coords, ForwardParams const& p,
                                                    KvIndex const& kv, SequenceView const& seq, int b, int head,
                                                    int row0, int key0) {
  const int kv_head = head / (p.num_heads / p.num_heads_k);
  const Element* q = static_cast<const Element*>(p.q) +
                     q_offset(seq, p.q_batch_stride, p.q_row_stride, p.q_head_stride, 0, head);
  constexpr int kElements = decltype(cute::size(scores))::value;
#pragma unroll 1
  for (int i = 0; i < kElements; ++i) {
    const int row = row0 + cute::get<0>(coords(i));
    const int key = key0 + cute::get<1>(coords(i));
    float s = 0.f;
    if (row < seq.seqlen_q && key < seq.seqlen_k) {
      const Element* q_row = q + int64_t(row) * p.q_row_stride;
      const Element* k_row = key_row<kIndexed, Element>(p, kv, seq, b, kv_head, key);
#pragma unroll 1
      for (int d = 0; d < p.head_dim; ++d) s = fmaf(float(q_row[d]), float(k_row[d]), s);
    }
    CUTE_UNROLL
    for (int j = 0; j < kElements; ++j) scores(j) = j == i ? s : scores(j);
  }
}

}  // namespace tileattn::cuda::sm90
