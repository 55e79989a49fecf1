// The producer warp: one elected thread walks the CTA's tiles in the scheduler's order and issues
// every TMA load.  Per tile (key blocks visited from the last one down, like the consumers):
//   K(last)                          -- before Q: it only needs a free K stage, so it loads while
//                                       the consumers still run the previous tile's epilogue
//   wait Q empty; Q (one 64-row box per consumer)
//   for n = last .. first:  K(n - 1), V(n)
// (A piece of a tile cut by the tail split, tail_split.h, walks only its own key blocks.)
// K runs one block ahead of V because a consumer needs K(n - 1) (its next QK^T) before V(n)
// (the PV of the block whose softmax it is computing).
#pragma once

#include <cute/tensor.hpp>

#include "common/sequence.h"
#include "cuda/mask_policy.h"
#include "cuda/sm90/cluster_sm90.h"
#include "cuda/sm90/kernel_params_sm90.h"
#include "cuda/sm90/packed_heads_sm90.h"
#include "cuda/sm90/paged_boxes_sm90.h"
#include "cuda/sm90/pipeline_sm90.h"
#include "cuda/sm90/sequence_bounds_sm90.h"

namespace tileattn::cuda::sm90 {

// Which loads a producer issues.  One thread issues them all, except on pages read box by box
// (paged_boxes_sm90.h), where a key block is up to 8 boxes x D / 64 loads and one thread's issue
// set the pace (session 63: pages of 16 at 512 rows 2.4x the contiguous cache's time): there warp 0
// issues Q and K, warp 1 V, each lane of a warp a box of the block (session 64), lane 0 the barrier
// arrivals and Q.  K and V have their own stages and barriers and the tile order is static
// (CtaTiles), so the two warps walk the same tiles unsynchronized; a warp's lanes walk them in step.
enum class ProducerRole { kAll, kQueriesAndKeys, kValues };

// kSplits: whether the kernel walks the tail split's pieces (fwd_kernel_sm90's kTailSplit).
template <typename Traits, bool kSplits, ProducerRole kRole = ProducerRole::kAll>
__device__ __forceinline__ void run_producer(Sm90Params<Traits> const& prm,
                                             typename Traits::SharedStorage& ss) {
  // A cluster's last wait (wait_kv_stages_released) reads both stage counters: one thread must own both.
  static_assert(kRole == ProducerRole::kAll || Traits::kClusterSize == 1, "split producers in a cluster");
  constexpr bool kLoadsQK = kRole != ProducerRole::kValues;
  constexpr bool kLoadsV = kRole != ProducerRole::kQueriesAndKeys;
  constexpr int kLanes = kRole == ProducerRole::kAll ? 1 : 32;  // threads running this producer
  const int lane = kLanes == 1 ? 0 : static_cast<int>(threadIdx.x % 32);
  const bool leader = lane == 0;  // arrives on the barriers and issues every load but the boxes
  using namespace cute;
  using Element = typename Traits::Element;
  using Rows = typename Traits::Rows;
  using BlockN = typename Traits::BlockN;
  using HeadDim = typename Traits::HeadDim;
  const ForwardParams& p = prm.args.params;

  Tensor mQ = prm.tma_q.get_tma_tensor(prm.q_shape);
  Tensor mK = prm.tma_k.get_tma_tensor(prm.kv_shape);
  Tensor mV = prm.tma_v.get_tma_tensor(prm.kv_shape);
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutKV{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutKV{});

  StageCounter<Traits::kStages> k_stage, v_stage;
  uint32_t q_empty_parity = 1;  // the first wait passes: nothing has used Q yet
  const int heads_per_kv = p.num_heads / p.num_heads_k;
  const CtaTiles<Traits, kSplits> tiles{prm.scheduler, prm.split};
  const RowTokens row_tokens = rows_per_token<Traits>(prm.args);
  // In a cluster this CTA loads its slice of each K/V block's rows into every CTA (mask 0b11).
  constexpr uint16_t kClusterMask = (1u << Traits::kClusterSize) - 1;
  const int cluster_rank = static_cast<int>(blockIdx.x % Traits::kClusterSize);
  auto kv_copy = [&](auto const& tma, uint64_t& full) __attribute__((always_inline)) {
    if constexpr (Traits::kClusterSize > 1) {
      return tma.with(full, kClusterMask);
    } else {
      return tma.with(full);
    }
  };

  for (int round = 0;; ++round) {
    const TilePiece piece = tiles.piece_of(round);
    if (tiles.done(piece.tile)) break;
    const TileCoords tc = tiles.coords(piece.tile);
    const SequenceView seq = sm90_sequence_view<Traits>(p, tc.batch);
    const int m0 = tile_first_row<Traits>(tc.m_block, seq, p);  // negative: padding rows above a shifted first tile
    if constexpr (Traits::kSeqBounds) {
      // Past this sequence's end, or a sequence whose cu_seqlens / seqused_k point outside the
      // tensors (index_poison.h): the consumers skip it too.
      if (m0 >= seq.seqlen_q || !sm90_sequence_in_bounds<Traits>(p, tc.batch)) continue;
    }
    const KeyBlockRange range =
        piece_key_range<kSplits>(cta_key_range<Traits>(tc.m_block, seq, p, row_tokens), piece);
    const bool has_keys = range.n_block_max > range.n_block_min;
    const int kv_head = tc.head / heads_per_kv;
    const int batch = Traits::kSeqBounds ? tma_batch(seq) : tc.batch;
    // The K/V tensors' batch coordinate: the sequence's own, or on the KV-cache route its cache
    // entry (cache_batch_idx), whose block_table row gives the pages (kv_block_at).
    const int kv_unit = Traits::kSeqBounds ? kv_entry(prm.args.kv, tc.batch, batch) : batch;

    // (rows, D, block) views of a unit's K and V rows, and their TMA partitions.
    using ClusterLayout = Layout<Int<Traits::kClusterSize>>;
    auto kv_parts = [&](auto const& tma, auto const& m, auto const& s, int unit) __attribute__((always_inline)) {
      Tensor g = local_tile(rows_from<Traits::kSeqBounds>(m(_, _, kv_head, unit), seq.k_base_row),
                            Shape<BlockN, HeadDim>{}, make_coord(_, _0{}));
      return tma_partition(tma, cluster_rank, ClusterLayout{}, group_modes<0, 2>(s), group_modes<0, 2>(g));
    };
    auto k_parts = kv_parts(prm.tma_k, mK, sK, kv_unit);
    auto v_parts = kv_parts(prm.tma_v, mV, sV, kv_unit);
    Tensor tKgK = get<0>(k_parts);  // (TMA, block)
    Tensor tKsK = get<1>(k_parts);  // (TMA, stage)
    Tensor tVgV = get<0>(v_parts);
    Tensor tVsV = get<1>(v_parts);

    // Key block n into the next stage of K or V: block n of the unit's rows, or on the KV-cache
    // route with pages block n % (page_size / block_n) of its page, or box by box from several pages
    // where pages do not hold whole blocks (paged_boxes_sm90.h).  Only the sequence-bounds kernels
    // read pages; every other kernel takes the partitions above, computed once a tile.
    auto load_block = [&](auto const& tma, CUtensorMap const& page_boxes, auto const& m, auto const& s,
                          auto const& tg, auto const& ts, uint64_t* empty, uint64_t* full,
                          StageCounter<Traits::kStages>& stage, Element* tiles, int n) __attribute__((always_inline)) {
      // Box pages: the kernel runs the split roles whenever prm.page_box_rows > 0 (fwd_kernel_sm90.h),
      // a warp a tensor, a box a lane, each lane's table entry read before the stage's wait.
      if constexpr (Traits::kSeqBounds && kRole != ProducerRole::kAll) {
        if (prm.page_box_rows > 0) {
          const PageBox box = page_box_of_lane<Traits>(prm.args.kv, prm.page_box_rows, kv_unit, n, seq.seqlen_k, lane);
          EmptyBarrier::wait(&empty[stage.index], stage.phase ^ 1u);
          load_page_box<Traits>(page_boxes, box, prm.page_box_rows, n, seq.seqlen_k, kv_head,
                                tiles + stage.index * Traits::kKVTileElems, full[stage.index], lane);
          stage.advance();
          return;
        }
      }
      EmptyBarrier::wait(&empty[stage.index], stage.phase ^ 1u);
      uint64_t& landed = full[stage.index];
      if (!leader) {  // a whole block is one load
        stage.advance();
        return;
      }
      FullBarrier::arrive_and_expect_tx(&landed, Traits::kKVTileBytes);
      if (Traits::kSeqBounds && prm.args.kv.block_table != nullptr) {
        const KvBlock at = kv_block_at<Traits::kBlockN>(prm.args.kv, kv_unit, n);
        copy(kv_copy(tma, landed), get<0>(kv_parts(tma, m, s, at.unit))(_, at.block), ts(_, stage.index));
      } else {
        copy(kv_copy(tma, landed), tg(_, n), ts(_, stage.index));
      }
      stage.advance();
    };
    auto load_k = [&](int n) {
      load_block(prm.tma_k, prm.k_pages, mK, sK, tKgK, tKsK, ss.k_empty, ss.k_full, k_stage, ss.k.data(), n);
    };
    auto load_v = [&](int n) {
      load_block(prm.tma_v, prm.v_pages, mV, sV, tVgV, tVsV, ss.v_empty, ss.v_full, v_stage, ss.v.data(), n);
    };

    if (kLoadsQK && has_keys) load_k(range.n_block_max - 1);
    // Every tile takes part in the Q handshake, a tile with no visible key too: it completes a
    // q_full phase with no bytes.  A consumer can then release Q of tile t + 1 only after this
    // wait for tile t's release, so the q_empty phases never run two ahead of the wait (which
    // tracks only parity and would then wait forever).
    if constexpr (kLoadsQK) {
      EmptyBarrier::wait(&ss.q_empty, q_empty_parity);
      q_empty_parity ^= 1u;
      if (leader && !has_keys) FullBarrier::arrive_and_expect_tx(&ss.q_full, 0);
    }
    if (kLoadsQK && leader && has_keys) {
      // One 64-row box per consumer; rows past seqlen_q come in as zeros.  A box that lies wholly
      // past seqlen_q, or above row 0 (tile_first_row), is not loaded: its consumer computes rows
      // that are never stored.  (A cluster's second tile can lie wholly past seqlen_q: no box at all.)
      Tensor gQ = local_tile(rows_from<Traits::kSeqBounds>(mQ(_, _, tc.head, batch), seq.q_base_row),
                             Shape<Rows, HeadDim>{}, make_coord(_, _0{}));
      const int first_half = max(0, -m0 / kRowsPerConsumer);
      const int halves =
          max(0, min(Traits::kConsumers, (seq.seqlen_q - m0 + kRowsPerConsumer - 1) / kRowsPerConsumer));
      FullBarrier::arrive_and_expect_tx(&ss.q_full, max(0, halves - first_half) * Traits::kQHalfBytes);
      for (int half = first_half; half < halves; ++half) {
        Tensor sQ = make_tensor(make_smem_ptr(ss.q.data() + half * Traits::kQHalfElems),
                                typename Traits::SmemLayoutQHalf{});
        auto parts = tma_partition(prm.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
        copy(prm.tma_q.with(ss.q_full), get<0>(parts)(_, m0 / kRowsPerConsumer + half), get<1>(parts));
      }
    }
    for (int n = range.n_block_max - 1; n >= range.n_block_min; --n) {
      if (kLoadsQK && n > range.n_block_min) load_k(n - 1);
      if (kLoadsV) load_v(n);
    }
  }
  wait_kv_stages_released<Traits>(ss, k_stage, v_stage);
}

}  // namespace tileattn::cuda::sm90
