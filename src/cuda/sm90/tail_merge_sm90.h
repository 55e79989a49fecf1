// The end of a consumer's piece of a tile cut by the tail split (tail_split.h).  Each piece leaves
// its unnormalized O and its rows' exp offsets and sums (softmax_sm90.h) in its workspace slot, in
// the accumulator's register order (thread t's value v at [v][t]: every consumer thread holds the
// same (row, column) elements in any CTA, and a warp's 32 floats of one value are one 128-byte
// line), and counts itself in the tile's counter.  The consumer that brings the counter to the
// piece count merges every piece's slot, in CTA order (key split: part order), into its registers:
//   m = max(m_a, m_b),  O = O_a 2^(m_a - m) + O_b 2^(m_b - m),  l = l_a 2^(m_a - m) + l_b 2^(m_b - m)
// (the offsets m are log2 units, as the exps are; FlashAttention-2's split-KV combine), and the
// normal epilogue then normalizes and stores the tile.  Reading its own piece back too keeps the sum
// in one order whatever the arrival order, so the output does not depend on which CTA finished last.
// Each consumer counts separately: its 64 rows are stored on their own (epilogue_sm90.h).
#pragma once

#include <cute/tensor.hpp>

#include "cuda/sm90/epilogue_sm90.h"
#include "cuda/sm90/kernel_params_sm90.h"
#include "cuda/sm90/pipeline_sm90.h"
#include "cuda/sm90/softmax_sm90.h"
#include "cuda/sm90/tail_split.h"

namespace tileattn::cuda::sm90 {

// The kernels that can split: plain scores without dropout; with sequence bounds (which give tiles
// different key counts) by the key split only (tail_split.h).  Score transforms and dropout keep
// their kernels as they were: they already spill in the mainloop, and the merge's code made ptxas
// spill more there (ModifiedScores with dropout at d128: 115 -> 163 spill instructions inside the
// loop).
template <typename Traits, typename ScorePolicy, typename DropoutPolicy>
constexpr bool tail_split_built() {
  return !ScorePolicy::kTransforms && !DropoutPolicy::kEnabled;
}

// Floats a consumer thread leaves per piece: its O accumulator (64 x D over 128 threads) and the
// offset and sum of its two rows.
template <typename Traits>
constexpr int tail_piece_floats() {
  return kRowsPerConsumer * Traits::kHeadDim / 128 + 2 * 2;
}

// Floats of one slot: every consumer of every CTA of a cluster.
template <typename Traits>
constexpr int64_t tail_slot_floats() {
  return static_cast<int64_t>(Traits::kClusterSize) * Traits::kConsumers * tail_piece_floats<Traits>() * 128;
}

// This CTA's piece of cut tile t (its index among the split tiles) is written and counted; true
// when this consumer merged the tile and must store it.
template <typename Traits, typename TensorO, int kRows>
__device__ __forceinline__ bool merge_tail_piece(Sm90Params<Traits> const& prm, typename Traits::SharedStorage& ss,
                                                 int consumer, int tid, int t, TilePiece const& piece,
                                                 TensorO& acc_o, SplitOnlineSoftmax<kRows>& softmax) {
  using namespace cute;
  constexpr int kCols = decltype(size<1>(acc_o))::value;
  constexpr int kValues = kRows * kCols;
  static_assert(kValues + 2 * kRows == tail_piece_floats<Traits>(), "the slot layout the host sized");
  const TailSplit& split = prm.split;
  const int pieces = split.pieces_of(t);
  // This consumer's part of a slot: (cluster rank, consumer) inside it.
  const int part = static_cast<int>(blockIdx.x % Traits::kClusterSize) * Traits::kConsumers + consumer;
  auto slot_part = [&](int slot) {
    return prm.split_partials + slot * tail_slot_floats<Traits>() +
           static_cast<int64_t>(part) * tail_piece_floats<Traits>() * 128 + tid;
  };

  float* mine = slot_part(split.own_slot(static_cast<int>(blockIdx.x / Traits::kClusterSize), t, piece));
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    CUTE_UNROLL
    for (int c = 0; c < kCols; ++c) mine[(r * kCols + c) * 128] = acc_o(r, c);
    mine[(kValues + r) * 128] = softmax.row_offset[r];
    mine[(kValues + kRows + r) * 128] = softmax.row_sum[r];
  }
  // Release: every thread's stores are visible device-wide before thread 0 counts the piece.
  __threadfence();
  named_barrier_sync(kEpilogueBarrierBase + consumer, 128);
  int* counter = prm.split_counters + t * (Traits::kClusterSize * Traits::kConsumers) + part;
  // The count goes to the consumer's threads through the first word of its O staging buffer (d256
  // has no shared-memory byte to spare, and a bar.red broadcast made ptxas spill in the mainloop),
  // once the previous tile's TMA store has read the buffer; the epilogue overwrites it only after
  // its own barrier, which every thread reaches after reading the word.
  int* arrivals = reinterpret_cast<int*>(Traits::o_staging(ss, consumer));
  if (tid == 0) {
    tma_store_wait<0>();
    *arrivals = atomicAdd(counter, 1);
  }
  named_barrier_sync(kEpilogueBarrierBase + consumer, 128);
  if (*arrivals != pieces - 1) return false;  // not the last piece to arrive
  __threadfence();  // acquire: the other pieces' stores, made visible before their counts

  float offset[kRows], sum[kRows];
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    offset[r] = -INFINITY;
    sum[r] = 0.f;
  }
  for (int i = 0; i < pieces; ++i) {
    // L2 loads (ld.global.cg): the slots were written by other SMs during this kernel.
    const float* theirs = slot_part(split.slot_at(t, i));
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const float m = __ldcg(theirs + (kValues + r) * 128);
      const float l = __ldcg(theirs + (kValues + kRows + r) * 128);
      const PieceMerge merge = piece_merge(offset[r], m);  // tail_split.h, tested on the host
      sum[r] = sum[r] * merge.keep + l * merge.add;
      offset[r] = merge.offset;
      CUTE_UNROLL
      for (int c = 0; c < kCols; ++c) {
        const float o = i == 0 ? 0.f : acc_o(r, c);
        acc_o(r, c) = o * merge.keep + __ldcg(theirs + (r * kCols + c) * 128) * merge.add;
      }
    }
  }
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    softmax.row_offset[r] = offset[r];
    softmax.row_sum[r] = sum[r];
  }
  return true;
}

}  // namespace tileattn::cuda::sm90
