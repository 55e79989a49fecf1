// A consumer warpgroup: 64 query rows of every tile the scheduler gives the CTA.  Per tile, key
// blocks from the last one down, with the softmax of block j overlapping the PV wgmma of block
// j + 1 inside the warpgroup, and the two consumers' GEMMs interleaved by the ping-pong barrier:
//
//   S = Q K(last)^T;  P = exact softmax step(S)
//   for j = last - 1 .. first:
//     [turn]  issue S = Q K(j)^T;  issue O += P V(j + 1)  [pass turn]
//     wait S; release K(j); mask; P' = reference step(S)   -- overlaps the PV wgmma
//     wait PV; release V(j + 1); O *= correction; P = P'
//   O += P V(first); release V(first)
//   O /= rowsum; store O and the LSE
// A tile cut by the tail split (tail_split.h) runs as pieces, each over its own range of the key
// blocks; the last piece to finish merges them (tail_merge_sm90.h) before the store.
// The consumer releases Q (q_empty) as soon as its last S = Q K^T has landed, so the producer's next
// Q load overlaps this tile's tail (O is staged in its own buffer: epilogue_sm90.h).  With Q in
// registers (d128 without score transforms, kernel_traits_sm90.h) it copies its 64 rows into the rs
// fragment when they land and releases the buffer at once: the next tile's Q loads during this one.
#pragma once

#include <cute/tensor.hpp>

#include "common/sequence.h"
#include "cuda/cute_utils.h"
#include "cuda/mask_policy.h"
#include "cuda/sm90/cluster_sm90.h"
#include "cuda/sm90/epilogue_sm90.h"
#include "cuda/sm90/kernel_params_sm90.h"
#include "cuda/sm90/left_window_sm90.h"
#include "cuda/sm90/packed_heads_sm90.h"
#include "cuda/sm90/pipeline_sm90.h"
#include "cuda/sm90/rescore_sm90.h"
#include "cuda/sm90/sequence_bounds_sm90.h"
#include "cuda/sm90/softmax_sm90.h"
#include "cuda/sm90/tail_merge_sm90.h"
#include "cuda/sm90/wgmma_gemm.h"
#include "cuda/sm90/wgmma_wait_order.h"

namespace tileattn::cuda::sm90 {

template <typename ScorePolicy>
__device__ __forceinline__ ScorePolicy make_score_policy(ForwardParams const& p, SequenceView const& seq, int batch,
                                                         int head) {
  ScorePolicy policy{};
  if constexpr (ScorePolicy::kTransforms) {
    policy.softmax_scale = p.softmax_scale;
    policy.softcap = p.softcap;
    policy.alibi_slope = p.alibi_slopes != nullptr ? p.alibi_slopes[batch * p.alibi_batch_stride + head] : 0.f;
    policy.seqlen_q = seq.seqlen_q;
    policy.seqlen_k = seq.seqlen_k;
  }
  return policy;
}

// kSplits: whether the kernel walks the tail split's pieces (fwd_kernel_sm90's kTailSplit).
template <typename Traits, typename ScorePolicy, typename DropoutPolicy, bool kSplits>
__device__ __forceinline__ void run_consumer(Sm90Params<Traits> const& prm, typename Traits::SharedStorage& ss,
                                             int consumer) {
  using namespace cute;
  using Element = typename Traits::Element;
  using Rows = typename Traits::Rows;
  using BlockN = typename Traits::BlockN;
  using HeadDim = typename Traits::HeadDim;
  constexpr int kBlockN = Traits::kBlockN;
  const ForwardParams& p = prm.args.params;
  const int tid = threadIdx.x % 128;

  constexpr bool kQInRegisters = Traits::kQInRegistersUnlessTransformed && !ScorePolicy::kTransforms;
  typename Traits::template TiledMmaQK<kQInRegisters> mma_qk;
  typename Traits::TiledMmaPV mma_pv;
  auto thr_qk = mma_qk.get_thread_slice(tid);
  auto thr_pv = mma_pv.get_thread_slice(tid);

  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data() + consumer * Traits::kQHalfElems),
                          typename Traits::SmemLayoutQHalf{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutKV{});
  Tensor sVt = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutVt{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutKV{});  // (keys, D, stage)
  Tensor tSrQ = thr_qk.partition_fragment_A(sQ);   // (MMA, 1, D / 16): smem descriptors or registers
  Tensor tSrK = thr_qk.partition_fragment_B(sK);   // (MMA, 1, D / 16, stages)
  Tensor tOrV = thr_pv.partition_fragment_B(sVt);  // (MMA, 1, kBlockN / 16, stages)

  // Row/column (within this consumer's 64 rows and the key block) of every score held.
  Tensor cS = thr_qk.partition_C(make_identity_tensor(Shape<Rows, BlockN>{}));
  Tensor coords = make_tensor(cS.data(), gmma_acc_rowcol_layout(cS.layout()));

  Tensor acc_s = partition_fragment_C(mma_qk, Shape<Rows, BlockN>{});
  Tensor acc_o = partition_fragment_C(mma_pv, Shape<Rows, HeadDim>{});
  Tensor scores = make_tensor(acc_s.data(), gmma_acc_rowcol_layout(acc_s.layout()));
  Tensor acc_o_rows = make_tensor(acc_o.data(), gmma_acc_rowcol_layout(acc_o.layout()));
  constexpr int kRowsPerThread = decltype(size<0>(scores))::value;

  StageCounter<Traits::kStages> k_stage, v_stage;
  uint32_t q_full_parity = 0;
  const PingPong<Traits::kConsumers> ping_pong{consumer};
  if (consumer == Traits::kConsumers - 1) ping_pong.pass_turn();  // consumer 0 issues first
  const CtaTiles<Traits, kSplits> tiles{prm.scheduler, prm.split};
  const RowTokens row_tokens = rows_per_token<Traits>(prm.args);  // packed query heads (packed_heads_sm90.h)

  for (int round = 0;; ++round) {
    const TilePiece piece = tiles.piece_of(round);
    if (tiles.done(piece.tile)) break;
    const TileCoords tc = tiles.coords(piece.tile);
    const SequenceView seq = sm90_sequence_view<Traits>(p, tc.batch);
    const int m0 = tile_first_row<Traits>(tc.m_block, seq, p);
    if constexpr (Traits::kSeqBounds) {
      // Past this sequence's end or out of bounds (index_poison.h): the producer skips it too.
      if (m0 >= seq.seqlen_q || !sm90_sequence_in_bounds<Traits>(p, tc.batch)) continue;
    }
    // This consumer's first query row: negative in the padding above a shifted first tile.
    const int row0 = m0 + consumer * kRowsPerConsumer;
    const bool has_rows = row0 >= 0 && row0 < seq.seqlen_q;
    const KeyBlockRange range =
        piece_key_range<kSplits>(cta_key_range<Traits>(tc.m_block, seq, p, row_tokens), piece);
    // The cut tile's index among the split ones (a piece shorter than its tile), or -1: all the
    // mainloop carries of the piece (the merge derives the rest, off the loop's registers).
    const int cut_tile = kSplits && (piece.parts > 1 || piece.n_hi - piece.n_lo < prm.split.blocks)
                             ? piece.tile - prm.split.first_tile
                             : -1;
    // The masks count tokens: the sequence's rows / row_tokens.
    const VisibilityMask mask{row_tokens.tokens(seq.seqlen_q), seq.seqlen_k, p.window_left, p.window_right};
    const ScorePolicy score_policy = make_score_policy<ScorePolicy>(p, seq, tc.batch, tc.head);
    DropoutPolicy dropout{};
    if constexpr (DropoutPolicy::kEnabled) {
      dropout = DropoutPolicy{p.philox_seed, p.philox_offset, tc.batch, tc.head, p.num_heads,
                              prm.args.dropout_threshold};
    }

    SplitOnlineSoftmax<kRowsPerThread> softmax;
    softmax.init(prm.args.scale_log2);
    clear(acc_o);

    // Every tile waits for its q_full phase (no bytes when it has no visible key; producer.h) and
    // releases Q once, after its last QK^T.  (Without the wait on key-less tiles, a consumer could
    // complete two q_empty phases before the producer waits on the first: that hung the GPU test
    // on bottom-right causal with Sq > Sk.)
    FullBarrier::wait(&ss.q_full, q_full_parity);
    q_full_parity ^= 1u;
    auto release_q_after_last_qk = [&](int n) __attribute__((always_inline)) {
      if (!kQInRegisters && n == range.n_block_min) EmptyBarrier::arrive(&ss.q_empty);
    };
    if (range.n_block_max <= range.n_block_min) {
      EmptyBarrier::arrive(&ss.q_empty);
    } else {
      if constexpr (kQInRegisters) {
        // The arrive orders the ldmatrix reads before the producer's next Q load (release semantics).
        auto copy_q = make_tiled_copy_A(typename Traits::SmemCopyAtomQ{}, mma_qk);
        auto thr_copy_q = copy_q.get_thread_slice(tid);
        copy(copy_q, thr_copy_q.partition_S(sQ), thr_copy_q.retile_D(tSrQ));
        EmptyBarrier::arrive(&ss.q_empty);
      }
      // S = Q K(n)^T with the score transform and, on the blocks at the edges, the mask.
      auto scores_of_block = [&](int n) __attribute__((always_inline)) {
        score_policy.apply(scores, coords, row0, n * kBlockN);
        if (range.needs_mask(n, kBlockN)) {
          mask.apply<masks_left_edge<Traits, ScorePolicy, DropoutPolicy>()>(scores, coords, row0, n * kBlockN,
                                                                            row_tokens);
        }
      };
      float correction[kRowsPerThread];
      // V rows past the sequence's keys (only the top key block has any) are zeroed before their
      // PV product (sequence_bounds_sm90.h).  Both consumers do it, each before its own product:
      // the other one writes the same zeros, so neither needs to wait for the other.
      auto zero_v_past_keys = [&](int n) __attribute__((always_inline)) {
        if constexpr (Traits::kSeqBounds) {
          const int valid = seq.seqlen_k - n * kBlockN;
          if (valid < kBlockN) {
            FullBarrier::wait(&ss.v_full[v_stage.index], v_stage.phase);
            for (int i = tid; i < (kBlockN - valid) * Traits::kHeadDim; i += 128) {
              sV(valid + i / Traits::kHeadDim, i % Traits::kHeadDim, v_stage.index) = Element(0.f);
            }
            cutlass::arch::fence_view_async_shared();  // generic-proxy writes -> visible to wgmma
            named_barrier_sync(kEpilogueBarrierBase + consumer, 128);
          }
        }
      };

      // The key blocks at the top of the tile's range that none of this consumer's rows sees
      // (under a causal mask the tile's range is its last row's; a consumer wholly past seqlen_q,
      // the padding of a ragged tile, sees none) are walked without products or softmax:
      // only the barrier waits and arrivals and the ping-pong turn of each block, so the producer
      // and the other consumers see the same sequence.  Peeled off the top instead of tested in the
      // pipelined loop: a per-block branch there cost 7-36% at every shape (branch
      // wip/sm90-consumer-own-keys).  d64 (192-row tiles) at 512 tokens: the third consumer of a
      // head's last tile is padding, and under causal masks 7 of a head's 27 consumer blocks are
      // unseen.  In a cluster (cluster_sm90.h) the walk covers the union of both CTAs' ranges, so
      // a causal pair's first tile walks its peer's extra top block this way, and a tile past
      // seqlen_q all of its blocks, releasing the stages its peer's multicasts fill.
      const int own_max = has_rows ? rows_key_block_range(row0, kRowsPerConsumer, kBlockN, seq.seqlen_q, seq.seqlen_k,
                                                          p.window_left, p.window_right, row_tokens)
                                         .n_block_max
                                   : range.n_block_min;
      int n = range.n_block_max - 1;
      for (; n >= max(own_max, range.n_block_min); --n) {
        FullBarrier::wait(&ss.k_full[k_stage.index], k_stage.phase);
        ping_pong.wait_turn();
        ping_pong.pass_turn();
        release_kv_stage<Traits>(&ss.k_empty[k_stage.index]);
        k_stage.advance();
        release_q_after_last_qk(n);
        FullBarrier::wait(&ss.v_full[v_stage.index], v_stage.phase);
        release_kv_stage<Traits>(&ss.v_empty[v_stage.index]);
        v_stage.advance();
      }
      if (n >= range.n_block_min) {
        FullBarrier::wait(&ss.k_full[k_stage.index], k_stage.phase);
        ping_pong.wait_turn();
        wgmma_issue<true>(mma_qk, tSrQ, tSrK(_, _, _, k_stage.index), acc_s);
        ping_pong.pass_turn();
        warpgroup_wait<0>();
        warpgroup_fence_operand(acc_s);
        release_kv_stage<Traits>(&ss.k_empty[k_stage.index]);
        k_stage.advance();
        release_q_after_last_qk(n);
        scores_of_block(n);
        softmax.score_step(scores, correction);  // O is still zero: no rescale
        Tensor rP = convert_fragment<Element>(acc_s);
        Tensor tOrP = make_tensor(rP.data(), gmma_acc_as_operand_a_layout(rP.layout()));
        // Dropout zeroes P's 16-bit copy, after the row sums took the undropped values and S's
        // float registers are free (drawn on S, the first mapping spilled 1.7 KB a thread at d128;
        // PhiloxDropout keeps its calls in a loop that is not unrolled for the same reason).
        Tensor rP_rows = make_tensor(rP.data(), gmma_acc_rowcol_layout(rP.layout()));
        dropout.apply(rP_rows, coords, row0, n * kBlockN);

        for (--n; n >= range.n_block_min; --n) {
          zero_v_past_keys(n + 1);  // before the turn: it must not hold up the other consumer
          FullBarrier::wait(&ss.k_full[k_stage.index], k_stage.phase);
          ping_pong.wait_turn();
          wgmma_issue<true>(mma_qk, tSrQ, tSrK(_, _, _, k_stage.index), acc_s);
          FullBarrier::wait(&ss.v_full[v_stage.index], v_stage.phase);
          wgmma_issue<false>(mma_pv, tOrP, tOrV(_, _, _, v_stage.index), acc_o);
          ping_pong.pass_turn();
          warpgroup_wait<1>();  // S landed; the PV wgmma may still run
          warpgroup_fence_operand(acc_s);
          release_kv_stage<Traits>(&ss.k_empty[k_stage.index]);
          k_stage.advance();
          release_q_after_last_qk(n);
          scores_of_block(n);
          const bool rescale = softmax.reference_step(scores, correction, [&]() __attribute__((always_inline)) {
            rescore_from_global<Traits::kSeqBounds, Element>(scores, coords, p, prm.args.kv, seq, tc.batch, tc.head, row0,
                                                              n * kBlockN);
            scores_of_block(n);
          });
          if constexpr (Traits::kSoftmaxBeforePvWait) {
            hold_wait_after(&ss.softmax_sink[consumer * 128 + tid], softmax.row_sum);  // else ptxas waits first
          }
          warpgroup_wait<0>();
          warpgroup_fence_operand(acc_o);
          release_kv_stage<Traits>(&ss.v_empty[v_stage.index]);
          v_stage.advance();
          if (rescale) softmax.rescale_o(acc_o_rows, correction);
          rP = convert_fragment<Element>(acc_s);
          dropout.apply(rP_rows, coords, row0, n * kBlockN);
        }

        zero_v_past_keys(range.n_block_min);
        FullBarrier::wait(&ss.v_full[v_stage.index], v_stage.phase);
        wgmma_issue<false>(mma_pv, tOrP, tOrV(_, _, _, v_stage.index), acc_o);
        warpgroup_wait<0>();
        warpgroup_fence_operand(acc_o);
        release_kv_stage<Traits>(&ss.v_empty[v_stage.index]);
        v_stage.advance();
      }
    }

    // A piece of a cut tile: the last of its CTAs to arrive merges the pieces and stores the tile.
    if constexpr (kSplits) {
      if (cut_tile >= 0 && !merge_tail_piece<Traits>(prm, ss, consumer, tid, cut_tile, piece, acc_o_rows, softmax)) continue;
    }
    float lse[kRowsPerThread];
    softmax.finalize(acc_o_rows, prm.args.output_scale, lse);
    store_tile_output<Traits>(prm, ss, consumer, tid, tc, seq, row0, acc_o, lse);
  }
  // The last TMA store must have read its staging buffer before the CTA's shared memory goes away.
  if (tid == 0) tma_store_wait<0>();
}

}  // namespace tileattn::cuda::sm90
