// K/V multicast across a cluster of two CTAs (calls without a left window or sequence bounds).
//
// The two CTAs of a cluster run neighbouring query tiles of one (batch, head), 2m and 2m + 1, and
// walk the same key blocks (under a causal mask the union of their ranges: cta_key_range).  Each
// CTA's producer loads half of each K and V block's
// rows and multicasts it into both CTAs' shared memory, so each block crosses L2 -> SM once for two
// tiles.  Why: at 1k tokens our d128 calls moved 1.9x cuDNN's bytes through L2 (5.1 TB/s against
// 2.9; perf log, "L2 and DRAM traffic against cuDNN"), and a 128-row tile reads its whole K/V
// (4 MB at 8k, d128) once per 128 query rows.
//
// What changes against the one-CTA kernel:
//   - a stage is free only when the consumers of both CTAs are done with it: its empty barrier
//     counts one arrival per consumer warp of each CTA (lane c of every consumer warp arrives on
//     CTA c's barrier), and each CTA's full barrier expects the whole block's bytes, half from
//     each producer's multicast;
//   - both CTAs walk the same blocks: without a mask every tile's range is the whole key set;
//     under a causal mask (a right window) tile 2m + 1 sees up to one block more than tile 2m,
//     which tile 2m walks without products (consumer.h's peeled walk of the blocks none of a
//     consumer's rows sees);
//   - the tile order is the scheduler's over pairs of query blocks (one "tile" of the scheduler is
//     a cluster's two tiles); an odd last query block leaves its cluster's second CTA a tile past
//     seqlen_q, which it walks without products (consumer.h) so both CTAs keep the same pipeline;
//   - the barriers are initialized before a cluster-wide sync (the peer arrives on them), and each
//     producer waits at the end until every stage is released, so no CTA exits while the other
//     still arrives on its barriers.
#pragma once

#include <cute/arch/cluster_sm90.hpp>
#include <cute/arch/copy_sm90_tma.hpp>

#include "common/sequence.h"
#include "cuda/launch_api.h"  // ForwardParams
#include "cuda/mask_policy.h"
#include "cuda/sm90/packed_heads_sm90.h"
#include "cuda/sm90/pipeline_sm90.h"
#include "cuda/sm90/tail_split.h"
#include "cuda/sm90/tile_config_sm90.h"
#include "cuda/sm90/tile_scheduler.h"

namespace tileattn::cuda::sm90 {

// Whether a bucket has the K/V-multicast kernel: the buckets of two consumer warpgroups (d128,
// d256).  A/B against the one-CTA kernel, 16k tokens back to back (perf log, session 24): d128
// +2-10% from 1k tokens, d256 +2-4%, both level at 512; d64 (three consumers, 192-row tiles)
// lost at every length: 1-4% where auto would take it (1k, 4k-16k), 9% at 2k and 23% at 512
// (odd counts of query blocks, a padding CTA a head), so its bucket does not build the kernel.
template <typename Traits>
constexpr bool kv_multicast_built() {
  return Traits::kConsumers == 2;
}

// The traits of a kernel whose K and V loads are shared by a cluster of two CTAs.
template <typename Base>
struct KVMulticastTraits : Base {
  static constexpr int kClusterSize = 2;
  using KVLoadOp = cute::SM90_TMA_LOAD_MULTICAST;
  using TmaKV = typename Base::template TmaKVOf<KVLoadOp, kClusterSize>;
  static_assert(!Base::kSeqBounds, "sequence bounds give the two tiles of a cluster different key ranges");
};

// Arrivals a K or V stage's empty barrier needs per phase: every consumer thread of the CTA, or one
// per consumer warp of each CTA of the cluster.
template <typename Traits>
constexpr int kv_empty_arrivals() {
  return Traits::kClusterSize == 1 ? Traits::kConsumerThreads
                                   : Traits::kClusterSize * Traits::kConsumerThreads / 32;
}

// A consumer thread is done reading a K or V stage.  In a cluster, lane c of each warp tells CTA c
// (the wgmma that read the stage is a warpgroup's, so its wait in any lane covers the warp).
template <typename Traits>
__device__ __forceinline__ void release_kv_stage(uint64_t* empty) {
  if constexpr (Traits::kClusterSize == 1) {
    EmptyBarrier::arrive(empty);
  } else {
    const uint32_t lane = threadIdx.x % 32;
    EmptyBarrier::arrive(empty, lane, lane < Traits::kClusterSize);
  }
}

// The query tiles of this CTA in the scheduler's order.  With a cluster the scheduler orders pairs
// of query blocks, and the CTA of rank r in its cluster takes block 2m + r of pair m.  After the
// tail split's whole rounds, its pieces (tail_split.h): both CTAs of a cluster take the same piece
// of their pair, so they walk the same key blocks.
template <typename Traits, bool kSplits>
struct CtaTiles {
  TileScheduler const& scheduler;
  TailSplit const& split;
  __device__ __forceinline__ TilePiece piece_of(int round) const {
    const int cta = blockIdx.x / Traits::kClusterSize;
    if (!kSplits || round < split.dp_rounds) {
      TilePiece whole;
      whole.tile = scheduler.tile_of(round, cta);
      whole.n_lo = 0;
      whole.n_hi = 1 << 30;
      return whole;
    }
    return split.piece(round - split.dp_rounds, cta);
  }
  __device__ __forceinline__ bool done(int tile) const { return tile >= scheduler.num_tiles; }
  __device__ __forceinline__ TileCoords coords(int tile) const {
    TileCoords c = scheduler.coords(tile);
    if constexpr (Traits::kClusterSize > 1) {
      c.m_block = c.m_block * Traits::kClusterSize + static_cast<int>(blockIdx.x % Traits::kClusterSize);
    }
    return c;
  }
};

// The first query row of query block m_block (sm90_tile_first_row: aligned to the sequence's end
// under a right-edged mask), negative in a first tile that starts with padding.
template <typename Traits>
__device__ __forceinline__ int tile_first_row(int m_block, SequenceView const& seq, ForwardParams const& p) {
  return sm90_tile_first_row(m_block, Traits::kBlockM, seq.seqlen_q, p.window_right >= 0);
}

// The key blocks this CTA walks for query block m_block: its own tile's range and masking bounds,
// and in a cluster the walk's top raised to the cluster's last tile's, so both CTAs walk (and load
// halves of) the same blocks.  Without a left window every range starts at block 0 (lo = 0 in
// key_block_range, also for a tile that sees no key), so the top is all that differs; the host
// runs clusters only then (run_fwd_sm90).  The last tile's top is the union's: hi grows with the
// tile's last row, and a tile past seqlen_q has the same last row as the one before it.
// row_tokens: the rows a token has (packed_heads_sm90.h; 1 but on the KV-cache route's packed calls).
template <typename Traits>
__device__ __forceinline__ KeyBlockRange cta_key_range(int m_block, SequenceView const& seq, ForwardParams const& p,
                                                       RowTokens const& row_tokens) {
  KeyBlockRange range = rows_key_block_range(tile_first_row<Traits>(m_block, seq, p), Traits::kBlockM,
                                             Traits::kBlockN, seq.seqlen_q, seq.seqlen_k, p.window_left,
                                             p.window_right, row_tokens);
  if constexpr (Traits::kClusterSize > 1) {
    const int last = (m_block / Traits::kClusterSize + 1) * Traits::kClusterSize - 1;
    if (last != m_block) {
      range.n_block_max = max(range.n_block_max,
                              rows_key_block_range(tile_first_row<Traits>(last, seq, p), Traits::kBlockM,
                                                   Traits::kBlockN, seq.seqlen_q, seq.seqlen_k, p.window_left,
                                                   p.window_right, row_tokens)
                                  .n_block_max);
    }
  }
  return range;
}

// A piece's key range: the tile's, cut to the piece's blocks (whole tiles: n_lo 0, n_hi huge), or
// under the key split to its share of the tile's blocks (tail_split.h).  The masking bounds stay the
// tile's: they are columns, not blocks.
template <bool kSplits>
__device__ __forceinline__ KeyBlockRange piece_key_range(KeyBlockRange range, TilePiece const& piece) {
  if constexpr (kSplits) {
    if (piece.parts > 0) {
      const TailSplit::Share share = TailSplit::share_of(range.n_block_min, range.n_block_max, piece.part, piece.parts);
      range.n_block_min = share.first;
      range.n_block_max = share.last;
    } else {
      range.n_block_min = max(range.n_block_min, piece.n_lo);
      range.n_block_max = min(range.n_block_max, piece.n_hi);
    }
  }
  return range;
}

// The producer's last step in a cluster: every stage released by both CTAs' consumers, i.e. every
// arrival the peer sends this CTA's barriers has landed.  (The peer's multicasts into this CTA
// are awaited by this CTA's own consumers.)
template <typename Traits, typename Storage>
__device__ __forceinline__ void wait_kv_stages_released(Storage& ss, StageCounter<Traits::kStages> k_stage,
                                                        StageCounter<Traits::kStages> v_stage) {
  if constexpr (Traits::kClusterSize > 1) {
    for (int s = 0; s < Traits::kStages; ++s) {
      EmptyBarrier::wait(&ss.k_empty[k_stage.index], k_stage.phase ^ 1u);
      EmptyBarrier::wait(&ss.v_empty[v_stage.index], v_stage.phase ^ 1u);
      k_stage.advance();
      v_stage.advance();
    }
  }
}

}  // namespace tileattn::cuda::sm90
