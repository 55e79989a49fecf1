// The roles of the warp-specialized Hopper backward's CTA (bwd_ws_kernel.cuh assigns them to
// warps): the TMA producer, the row-statistics warp, the dQ writers, the consumer of the
// key-split layout (d64, d128) and the dK, dV epilogues shared with the column-split consumer
// (bwd_ws_cols_consumer.cuh, d256).  Types in bwd_ws_traits.h and bwd_ws_cols_traits.h.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>

#include "common/mask.h"
#include "common/philox.h"
#include "common/sequence.h"
#include "cuda/backward/bwd_args.h"
#include "cuda/backward/bwd_dq_turns.cuh"
#include "cuda/backward/bwd_tiles.cuh"  // kLog2e
#include "cuda/backward/bwd_walk_order.h"
#include "cuda/cute_utils.h"
#include "cuda/mask_policy.h"
#include "cuda/softmax_state.h"  // fast_exp2
#include "cuda/sm90/bulk_copy.h"
#include "cuda/sm90/bwd_ws_traits.h"
#include "cuda/sm90/pipeline_sm90.h"
#include "cuda/sm90/softmax_sm90.h"  // the accumulator's (rows, cols) and A-operand views
#include "cuda/sm90/wgmma_gemm.h"

namespace tileattn::cuda::sm90 {

template <typename Traits>
struct BwdWsParams {
  typename Traits::TmaQ tma_q;
  typename Traits::TmaQ tma_do;
  typename Traits::TmaKV tma_k;
  typename Traits::TmaKV tma_v;
  typename Traits::TmaKVStore tma_dk;  // set when dk_by_tma
  typename Traits::TmaKVStore tma_dv;
  bool dk_by_tma;  // dK, dV are the outputs themselves (no GQA) with 16-byte aligned rows
  cute::Shape<int32_t, int32_t, int32_t, int32_t> q_shape;   // (rows, head dim, heads, batch)
  cute::Shape<int32_t, int32_t, int32_t, int32_t> kv_shape;
  bwd::BwdArgs a;
};

// Named barriers of the two consumer warpgroups (0 is __syncthreads, unused here).
constexpr int kWsDsBarrier = 1;        // both halves of dS are in shared memory
constexpr int kWsEpilogueBarrier = 2;  // both consumers are done with K and V / have written dK, dV

// The query blocks a key block sees: one run [m_lo, m_hi] (a causal or window mask's visible query
// rows of a key block are contiguous), walked in the host's order (bwd_walk_order.h); every role
// of the CTA walks the same sequence.
struct BwdWalk {
  const tileattn_fwd_params* f;
  SequenceView seq;
  int n_block, block_m, block_n;
  bwd::WalkOrder order;
  int m_lo = 0, m_hi = -1, visited = 0;

  __device__ KeyBlockRange range(int m) const {
    return key_block_range(m * block_m, block_m, block_n, seq.seqlen_q, seq.seqlen_k, f->window_left,
                           f->window_right);
  }
  __device__ bool visits(int m) const {
    const KeyBlockRange r = range(m);
    return n_block >= r.n_block_min && n_block < r.n_block_max;
  }
  __device__ void plan() {
    m_hi = (seq.seqlen_q + block_m - 1) / block_m - 1;
    while (m_hi >= 0 && !visits(m_hi)) --m_hi;
    m_lo = m_hi;
    while (m_lo > 0 && visits(m_lo - 1)) --m_lo;
    visited = m_hi >= 0 ? m_hi - m_lo + 1 : 0;
  }
  __device__ int at(int step) const {  // the step-th query block of the walk, or -1 after the last
    return step >= visited ? -1 : bwd::walk_block(order, n_block, step, m_lo, m_hi);
  }
  __device__ int turn(int m) const {  // this key block's deterministic turn at query block m
    const KeyBlockRange r = range(m);
    return bwd::walk_turn(order, n_block, m, r.n_block_min, r.n_block_max, visited);
  }
};

template <typename Traits, typename Storage>
__device__ __forceinline__ void ws_load_tiles(BwdWsParams<Traits> const& prm, Storage& ss,
                                              const BwdWalk& walk, int b, int h, int head_k) {
  using namespace cute;
  using M = typename Traits::_M;
  using N = typename Traits::_N;
  using D = typename Traits::_D;
  Tensor mQ = prm.tma_q.get_tma_tensor(prm.q_shape);
  Tensor mdO = prm.tma_do.get_tma_tensor(prm.q_shape);
  Tensor mK = prm.tma_k.get_tma_tensor(prm.kv_shape);
  Tensor mV = prm.tma_v.get_tma_tensor(prm.kv_shape);
  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{});
  Tensor sdO = make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutQ{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutKV{});
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutKV{});
  Tensor gQ = local_tile(mQ(_, _, h, b), Shape<M, D>{}, make_coord(_, _0{}));  // (M, D, query block)
  Tensor gdO = local_tile(mdO(_, _, h, b), Shape<M, D>{}, make_coord(_, _0{}));
  Tensor gK = local_tile(mK(_, _, head_k, b), Shape<N, D>{}, make_coord(_, _0{}));
  Tensor gV = local_tile(mV(_, _, head_k, b), Shape<N, D>{}, make_coord(_, _0{}));
  auto q_parts = tma_partition(prm.tma_q, _0{}, Layout<_1>{}, group_modes<0, 2>(sQ), group_modes<0, 2>(gQ));
  auto do_parts = tma_partition(prm.tma_do, _0{}, Layout<_1>{}, group_modes<0, 2>(sdO), group_modes<0, 2>(gdO));
  auto k_parts = tma_partition(prm.tma_k, _0{}, Layout<_1>{}, group_modes<0, 2>(sK), group_modes<0, 2>(gK));
  auto v_parts = tma_partition(prm.tma_v, _0{}, Layout<_1>{}, group_modes<0, 2>(sV), group_modes<0, 2>(gV));

  FullBarrier::arrive_and_expect_tx(&ss.kv_full, 2 * Traits::kKVTileBytes);
  copy(prm.tma_k.with(ss.kv_full), get<0>(k_parts)(_, walk.n_block), get<1>(k_parts)(_, 0));
  copy(prm.tma_v.with(ss.kv_full), get<0>(v_parts)(_, walk.n_block), get<1>(v_parts)(_, 0));
  StageCounter<Traits::kStages> stage;
  for (int step = 0, m = walk.at(0); m >= 0; m = walk.at(++step)) {
    EmptyBarrier::wait(&ss.q_empty[stage.index], stage.phase ^ 1u);
    if constexpr (Traits::kColumnSplit) {  // one stage: Q and dO on their own barriers, freed one after the other
      FullBarrier::arrive_and_expect_tx(&ss.q_full[stage.index], Traits::kQTileBytes);
      copy(prm.tma_q.with(ss.q_full[stage.index]), get<0>(q_parts)(_, m), get<1>(q_parts)(_, stage.index));
      EmptyBarrier::wait(&ss.do_empty[stage.index], stage.phase ^ 1u);
      FullBarrier::arrive_and_expect_tx(&ss.do_full[stage.index], Traits::kQTileBytes);
      copy(prm.tma_do.with(ss.do_full[stage.index]), get<0>(do_parts)(_, m), get<1>(do_parts)(_, stage.index));
    } else {
      FullBarrier::arrive_and_expect_tx(&ss.q_full[stage.index], 2 * Traits::kQTileBytes);
      copy(prm.tma_q.with(ss.q_full[stage.index]), get<0>(q_parts)(_, m), get<1>(q_parts)(_, stage.index));
      copy(prm.tma_do.with(ss.q_full[stage.index]), get<0>(do_parts)(_, m), get<1>(do_parts)(_, stage.index));
    }
    stage.advance();
  }
}

// Warp 1 of the producer warpgroup: each stage's LSE (log2 units; +inf past seqlen_q, so P is 0
// there) and D (0 past seqlen_q), then one arrival per lane on the stage's full barrier (with
// the column-split layout, the LSE goes with Q's barriers and D with dO's).
template <typename Traits, typename Storage>
__device__ __forceinline__ void ws_stage_row_stats(const bwd::BwdArgs& a, Storage& ss,
                                                   const BwdWalk& walk, int h) {
  const tileattn_fwd_params& f = a.p.fwd;
  const int lane = threadIdx.x % 32;
  StageCounter<Traits::kStages> stage;
  for (int step = 0, m = walk.at(0); m >= 0; m = walk.at(++step)) {
    EmptyBarrier::wait(&ss.q_empty[stage.index], stage.phase ^ 1u);
    for (int r = lane; r < Traits::kBlockM; r += 32) {
      const int row = m * Traits::kBlockM + r;
      const bool valid = row < walk.seq.seqlen_q;
      ss.lse_log2(stage.index, r) = valid ? f.softmax_lse[lse_offset(f, walk.seq, row, h)] * bwd::kLog2e : INFINITY;
      if constexpr (!Traits::kColumnSplit) {
        ss.delta(stage.index, r) = valid ? a.delta[h * a.q_rows + packed_q_row(f, walk.seq, row)] : 0.f;
      }
    }
    FullBarrier::arrive(&ss.q_full[stage.index]);
    if constexpr (Traits::kColumnSplit) {
      EmptyBarrier::wait(&ss.do_empty[stage.index], stage.phase ^ 1u);
      for (int r = lane; r < Traits::kBlockM; r += 32) {
        const int row = m * Traits::kBlockM + r;
        ss.delta(stage.index, r) = row < walk.seq.seqlen_q ? a.delta[h * a.q_rows + packed_q_row(f, walk.seq, row)] : 0.f;
      }
      FullBarrier::arrive(&ss.do_full[stage.index]);
    }
    stage.advance();
  }
}

// Warps 2 and 3 of the producer warpgroup (`writer` 0 and 1, the even and odd steps of the walk):
// each query block's dQ, once both consumers have written their halves to the writer's buffer, goes
// to the float32 workspace as one bulk reduction issued by lane 0.  The workspace rows have the
// staging rows' padded pitch (cuda_backward.cu asks bwd_ws_dq_pitch), so a block's valid rows, pad
// columns included (never read), are one contiguous span; rows past seqlen_q are not sent (in a
// batch they are the next sequence's).  One reduction per row cost ~4,600 cycles a block at d128
// (UBLKRED takes uniform operands, so the 32 lanes issued theirs one at a time) of the block's
// ~5,430 on the H200 (session 77's trace): the writer was the backward's critical path.  When
// deterministic, lane 0 waits for the block's turn before the block is ready and releases it after
// the reduction has landed, so the consumers wait for a turn only when it comes later than their
// products, never for the reduction, and while one writer waits for its reduction to land the other
// can take the next block.
template <typename Traits, int kWriters, typename Storage>
__device__ __forceinline__ void ws_write_dq(const bwd::BwdArgs& a, Storage& ss,
                                            const BwdWalk& walk, int b, int h, int writer) {
  const tileattn_fwd_params& f = a.p.fwd;
  const int lane = threadIdx.x % 32;
  uint32_t phase = 0;
  for (int step = writer, m = walk.at(step); m >= 0; step += kWriters, m = walk.at(step)) {
    const float* sdq = ss.dq_staging(writer);
    const int m0 = m * Traits::kBlockM;
    const int valid_rows = walk.seq.seqlen_q - m0;
    float* gdq = a.dq_accum + (h * a.q_rows + packed_q_row(f, walk.seq, m0)) * Storage::kDqPitch;
    int* counter = nullptr;
    if (a.dq_turns != nullptr) {
      // The turn first, while the consumers still compute the block, so the staging buffer is
      // held for the copies' reads and not for the wait.  Measured level on its own (d256 with one
      // writer: 0.81x atomic at 8k either way; the second writer is what helped, perf log).
      counter = a.dq_turns + (static_cast<int64_t>(b) * f.num_heads + h) * a.dq_turn_blocks + m;
      if (lane == 0) bwd::poll_for_turn(counter, walk.turn(m));
      __syncwarp();
    }
    EmptyBarrier::wait(&ss.dq_full[writer], phase);
    if (lane == 0) {
      if (counter != nullptr) fence_proxy_async_global();  // the reduction comes after the acquired turn
      const int rows = valid_rows < Traits::kBlockM ? valid_rows : Traits::kBlockM;
      bulk_reduce_add_f32(gdq, sdq, rows * Storage::kDqPitch * 4);
      bulk_commit();
      // The consumers may write the next dQ once the copy has read this one; the turn waits for
      // the reduction to land, which only this lane waits for.
      bulk_wait_read();
      EmptyBarrier::arrive(&ss.dq_empty[writer]);
      if (counter != nullptr) {
        bulk_wait_done();
        fence_proxy_async_global();
        bwd::release_turn(counter);
      }
    }
    __syncwarp();
    phase ^= 1u;
  }
  bulk_wait_done();
}

// dK (times the softmax scale) and dV through the K and V tiles' shared memory, each written back
// by one TMA store of the whole (kBlockN, head dim) box, which drops the rows past seqlen_k and the
// columns past head_dim.  The per-element stores this replaces (2 bytes each, addresses computed
// per element) took ~1 us a CTA in the FA2-structured kernel, where 16-byte stores fixed it; here
// the walks at 512 tokens run 8 query blocks, so the epilogue is a large share of a CTA.
template <typename Traits, typename Storage, typename TiledMma, typename Acc>
__device__ __forceinline__ void ws_store_dkv_by_tma(BwdWsParams<Traits> const& prm, Storage& ss,
                                                    TiledMma const& mma_dkv, Acc& acc_dk, Acc const& acc_dv,
                                                    const BwdWalk& walk, int g, int b, int h) {
  using namespace cute;
  using Element = typename Traits::Element;
  using N = typename Traits::_N;
  using D = typename Traits::_D;
  const int tid = threadIdx.x % 128;
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dk); ++i) acc_dk(i) *= prm.a.p.fwd.softmax_scale;
  Tensor rdK = convert_fragment<Element>(acc_dk);
  Tensor rdV = convert_fragment<Element>(acc_dv);
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutKV{});  // (N, D, 1)
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutKV{});
  auto r2s = make_tiled_copy_C(typename Traits::SmemCopyAtomC{}, mma_dkv);
  auto thr_r2s = r2s.get_thread_slice(tid);
  // Each consumer's dQ product read K's columns for all of the block's keys: K is overwritten only
  // after both are done with it.
  named_barrier_sync(kWsEpilogueBarrier, Traits::kConsumerThreads);
  using Tile = typename Traits::ConsumerDkvTile;  // this consumer's part of dK and dV
  copy(r2s, thr_r2s.retile_S(rdK), thr_r2s.partition_D(local_tile(sK(_, _, 0), Tile{}, Traits::consumer_dkv_coord(g))));
  copy(r2s, thr_r2s.retile_S(rdV), thr_r2s.partition_D(local_tile(sV(_, _, 0), Tile{}, Traits::consumer_dkv_coord(g))));
  cutlass::arch::fence_view_async_shared();  // generic-proxy writes, read next by the TMA unit
  named_barrier_sync(kWsEpilogueBarrier, Traits::kConsumerThreads);
  if (g == 0 && tid == 0) {
    auto store = [&](auto const& tma, auto const& s) {
      Tensor m = tma.get_tma_tensor(prm.kv_shape);
      Tensor gT = local_tile(m(_, _, h, b), Shape<N, D>{}, make_coord(_, _0{}));
      auto parts = tma_partition(tma, _0{}, Layout<_1>{}, group_modes<0, 2>(s), group_modes<0, 2>(gT));
      copy(tma, get<1>(parts)(_, 0), get<0>(parts)(_, walk.n_block));
    };
    store(prm.tma_dk, sK);
    store(prm.tma_dv, sV);
    tma_store_arrive();
    tma_store_wait<0>();  // the TMA unit has read the tiles before the CTA's shared memory goes
  }
}

// dK (times the softmax scale) and dV, this consumer's part (Traits::ConsumerDkvTile, from key
// `key0` and column `col0`), element by element: to the outputs without GQA, else to the float32
// per-query-head buffers the finish kernel sums over each group.  Keys past seqlen_k and columns past
// head_dim are not stored.
template <typename Traits, typename TiledMma, typename Acc>
__device__ __forceinline__ void ws_store_dkv_by_thread(const bwd::BwdArgs& a, TiledMma const& mma_dkv, Acc const& acc_dk,
                                                       Acc const& acc_dv, const SequenceView& seq, int key0, int col0,
                                                       int h) {
  using namespace cute;
  using Element = typename Traits::Element;
  const tileattn_fwd_params& f = a.p.fwd;
  Tensor cKV = mma_dkv.get_thread_slice(threadIdx.x % 128).partition_C(make_identity_tensor(typename Traits::ConsumerDkvTile{}));
  const int group = f.num_heads / f.num_heads_k;
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dk); ++i) {
    const int key = key0 + get<0>(cKV(i)), c = col0 + get<1>(cKV(i));
    if (key >= seq.seqlen_k || c >= f.head_dim) continue;
    const float dk = acc_dk(i) * f.softmax_scale;
    if (group == 1) {
      static_cast<Element*>(a.p.dk)[k_offset(seq, a.p.dk_batch_stride, a.p.dk_row_stride, a.p.dk_head_stride, key, h) +
                                    c] = Element(dk);
      static_cast<Element*>(a.p.dv)[k_offset(seq, a.p.dv_batch_stride, a.p.dv_row_stride, a.p.dv_head_stride, key, h) +
                                    c] = Element(acc_dv(i));
    } else {
      const int64_t index = (h * a.k_rows + packed_k_row(f, seq, key)) * f.head_dim + c;
      a.dk_expanded[index] = dk;
      a.dv_expanded[index] = acc_dv(i);
    }
  }
}

// Dropout keep bits of one query block for this thread (common/philox.h).  Its S^T values are keys
// {k, k + 8} (rows 0 and 1 of the (keys, queries) view) x 16 queries (columns c = e + 2 u': query
// 2 (t % 4) + e + 8 u' of the block); queries i and i + 8 (columns c and c + 2, c % 4 < 2) and both
// keys lie in one Philox group (k % 16 < 8: a consumer's keys start at a multiple of 64), so one
// call serves four values, at slots 4 (i half) + 2 (key half) + k % 2.  The calls run in a loop
// that is not unrolled (unrolled, the forward's spilled; mask_policy.h) while S^T and dP^T are on
// the tensor cores.  Bit 2 c + r: value (r, c) is kept.
template <int kCols, typename TensorC>
__device__ __forceinline__ uint32_t ws_dropout_keep_bits(const tileattn_fwd_params& f, TensorC const& coords,
                                                         int b, int h, int m0, int key0) {
  static_assert(kCols % 4 == 0 && 2 * kCols <= 32, "16-query bands; two bits a column in one word");
  const uint32_t threshold = dropout_threshold(f.dropout_p);
  const int key = key0 + cute::get<0>(coords(0, 0));
  const int parity = key & 1;
  uint32_t bits = 0;
#pragma unroll 1
  for (int c = 0; c < kCols; c += (c % 4 == 1 ? 3 : 1)) {  // columns 0, 1, 4, 5, 8, 9, ...
    const int query = m0 + cute::get<1>(coords(0, c));
    const Philox4x32 draws = dropout_draws(f.philox_seed, f.philox_offset, b, h, f.num_heads, query, key);
    const uint32_t kept = uint32_t(dropout_draw16(draws, parity) >= threshold) |          // (i, k)
                          uint32_t(dropout_draw16(draws, 2 + parity) >= threshold) << 1 |  // (i, k + 8)
                          uint32_t(dropout_draw16(draws, 4 + parity) >= threshold) << 4 |  // (i + 8, k)
                          uint32_t(dropout_draw16(draws, 6 + parity) >= threshold) << 5;   // (i + 8, k + 8)
    bits |= kept << (2 * c);
  }
  return bits;
}

// LSE (log2 units) and D of the query rows whose S^T values this thread holds: coords(r, c) is
// (key - key0, query row - row0 - m0) of each value, so column c is query row row0 + coords(0, c) of
// the stage.  Read into registers ahead of their use: read where they are used, after S^T landed,
// the 16 LSE loads queued behind the wgmmas' shared-memory reads and held the first exp2 ~1,000
// cycles (clock64 trace and ncu, H100 d128 8k, session 77).  The key-split consumer loads the LSE
// before issuing its products and D before the exp2 pass (both at once spilled).
template <int kCols>
struct WsRowStats {
  float lse[kCols];
  float delta[kCols];

  template <typename Coords, typename Storage>
  __device__ __forceinline__ void load_lse(Coords const& coords, Storage& ss, int stage, int row0) {
    CUTE_UNROLL
    for (int c = 0; c < kCols; ++c) lse[c] = ss.lse_log2(stage, row0 + cute::get<1>(coords(0, c)));
  }
  template <typename Coords, typename Storage>
  __device__ __forceinline__ void load_delta(Coords const& coords, Storage& ss, int stage, int row0) {
    CUTE_UNROLL
    for (int c = 0; c < kCols; ++c) delta[c] = ss.delta(stage, row0 + cute::get<1>(coords(0, c)));
  }
};

// P^T = exp2(S^T scale_log2 - LSE) in place, 0 where the mask hides (query, key).  p is a
// consumer's S^T accumulator as (keys, query rows), with coords and rs as in WsRowStats.
template <typename TensorP, typename Coords, int kCols>
__device__ __forceinline__ void ws_probabilities(TensorP& p, Coords const& coords, WsRowStats<kCols> const& rs,
                                                 int row0, int m0, int key0, bool masked, const SequenceView& seq,
                                                 const tileattn_fwd_params& f, float scale_log2) {
  using cute::get;
  static_assert(decltype(cute::size<1>(p))::value == kCols);
  CUTE_UNROLL
  for (int c = 0; c < kCols; ++c) {
    ColumnRange visible{0, 0};
    if (masked) {
      visible = visible_columns(m0 + row0 + get<1>(coords(0, c)), seq.seqlen_q, seq.seqlen_k, f.window_left,
                                f.window_right);
    }
    CUTE_UNROLL
    for (int r = 0; r < cute::size<0>(p); ++r) {
      float v = fast_exp2(p(r, c) * scale_log2 - rs.lse[c]);
      if (masked) {
        const int key = key0 + get<0>(coords(r, c));
        if (key < visible.first || key > visible.last) v = 0.f;
      }
      p(r, c) = v;
    }
  }
}

// dS^T = P^T o (Z^T o dP^T - D) in place of dP^T, then P^T <- Z^T o P^T for dV (Z = the dropout
// keep mask / (1 - p), ws_dropout_keep_bits; 1 without dropout).  Same views as ws_probabilities.
template <bool kDropout, typename TensorDs, typename TensorP, int kCols>
__device__ __forceinline__ void ws_score_gradients(TensorDs& ds, TensorP& p, WsRowStats<kCols> const& rs,
                                                   uint32_t keep_bits, float dropout_p) {
  const float keep_scale = kDropout ? 1.f / (1.f - dropout_p) : 1.f;
  CUTE_UNROLL
  for (int c = 0; c < kCols; ++c) {
    const float d = rs.delta[c];
    CUTE_UNROLL
    for (int r = 0; r < cute::size<0>(ds); ++r) {
      if constexpr (kDropout) {
        const float z = (keep_bits >> (2 * c + r)) & 1u ? keep_scale : 0.f;
        ds(r, c) = p(r, c) * (ds(r, c) * z - d);
        p(r, c) *= z;
      } else {
        ds(r, c) = p(r, c) * (ds(r, c) - d);
      }
    }
  }
}

template <typename Traits, int kWriters, bool kDropout, typename Storage>
__device__ __forceinline__ void ws_consume(BwdWsParams<Traits> const& prm, Storage& ss,
                                           const BwdWalk& walk, int first, int g, int b, int h) {
  using namespace cute;
  using Element = typename Traits::Element;
  using M = typename Traits::_M;
  using N = typename Traits::_N;
  using KC = typename Traits::_KC;
  using D = typename Traits::_D;
  using DC = typename Traits::_DC;
  constexpr int kBlockM = Traits::kBlockM;
  const bwd::BwdArgs& a = prm.a;
  const tileattn_fwd_params& f = a.p.fwd;
  const SequenceView& seq = walk.seq;
  const int tid = threadIdx.x % 128;
  const int n0 = walk.n_block * Traits::kBlockN;
  const int key0 = n0 + g * Traits::kKeysPerConsumer;  // this consumer's first key
  const float scale_log2 = f.softmax_scale * bwd::kLog2e;

  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmadKV mma_dkv;
  typename Traits::TiledMmadQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(tid);
  auto thr_dkv = mma_dkv.get_thread_slice(tid);
  auto thr_dq = mma_dq.get_thread_slice(tid);

  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{});       // (M, D, stage)
  Tensor sdO = make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutQ{});
  Tensor sQt = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQt{});     // (D, M, stage)
  Tensor sdOt = make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutQt{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutKV{});      // (N, D, 1)
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutKV{});
  Tensor sKt = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutKt{});     // (D, N, 1)
  Tensor sdS = make_tensor(make_smem_ptr(ss.ds.data()), typename Traits::SmemLayoutdS{});    // (M, N, buffer)
  Tensor sdSt = make_tensor(make_smem_ptr(ss.ds.data()), typename Traits::SmemLayoutdSt{});  // (N, M, buffer)

  Tensor tSrK = thr_sdp.partition_fragment_A(local_tile(sK(_, _, 0), Shape<KC, D>{}, make_coord(g, _0{})));
  Tensor tSrV = thr_sdp.partition_fragment_A(local_tile(sV(_, _, 0), Shape<KC, D>{}, make_coord(g, _0{})));
  Tensor tSrQ = thr_sdp.partition_fragment_B(sQ);     // (MMA, N, K, stage)
  Tensor tSrdO = thr_sdp.partition_fragment_B(sdO);
  Tensor tVrdOt = thr_dkv.partition_fragment_B(sdOt);  // (MMA, N, K, stage)
  Tensor tKrQt = thr_dkv.partition_fragment_B(sQt);
  Tensor tQrdS = thr_dq.partition_fragment_A(sdS);    // (MMA, M, K, buffer)
  // This consumer's dQ columns: half of them at d128, all of them at d64 (Traits::kDqSplitByColumns).
  const int dq_col0 = Traits::kDqSplitByColumns ? g * Traits::kDqColumns : 0;
  Tensor tQrKt = thr_dq.partition_fragment_B(
      local_tile(sKt(_, _, 0), Shape<DC, N>{}, make_coord(Traits::kDqSplitByColumns ? g : 0, _0{})));

  // dS^T registers -> this consumer's 64 key rows of dS (as (keys, query rows)).
  auto r2s = make_tiled_copy_C(typename Traits::SmemCopyAtomC{}, mma_sdp);
  auto thr_r2s = r2s.get_thread_slice(tid);

  // (key, query row) of every S^T value this thread holds, tile-local, as (rows, cols).
  Tensor cS = thr_sdp.partition_C(make_identity_tensor(Shape<KC, M>{}));
  Tensor coords = make_tensor(cS.data(), gmma_acc_rowcol_layout(cS.layout()));
  Tensor cdQ = thr_dq.partition_C(make_identity_tensor(Shape<M, DC>{}));

  Tensor acc_dv = partition_fragment_C(mma_dkv, Shape<KC, D>{});
  Tensor acc_dk = partition_fragment_C(mma_dkv, Shape<KC, D>{});
  clear(acc_dv);
  clear(acc_dk);

  if (first >= 0) FullBarrier::wait(&ss.kv_full, 0);
  StageCounter<Traits::kStages> stage;
  int buffer = 0;
  for (int step = 0, m = walk.at(0); m >= 0; m = walk.at(++step)) {
    const int m0 = m * kBlockM;
    const KeyBlockRange range = walk.range(m);
    FullBarrier::wait(&ss.q_full[stage.index], stage.phase);
    constexpr int kCols = decltype(size<1>(coords))::value;
    WsRowStats<kCols> row_stats;
    row_stats.load_lse(coords, ss, stage.index, 0);

    Tensor acc_s = partition_fragment_C(mma_sdp, Shape<KC, M>{});
    Tensor acc_dp = partition_fragment_C(mma_sdp, Shape<KC, M>{});
    wgmma_issue<true>(mma_sdp, tSrK, tSrQ(_, _, _, stage.index), acc_s);
    wgmma_issue<true>(mma_sdp, tSrV, tSrdO(_, _, _, stage.index), acc_dp);
    uint32_t keep_bits = 0;
    if constexpr (kDropout) {
      keep_bits = ws_dropout_keep_bits<kCols>(f, coords, b, h, m0, key0);
    }
    warpgroup_wait<1>();
    warpgroup_fence_operand(acc_s);

    // P^T = exp2(S^T scale_log2 - LSE), 0 where the mask hides (query, key).
    Tensor p = make_tensor(acc_s.data(), gmma_acc_rowcol_layout(acc_s.layout()));  // (keys, query rows)
    const bool masked = range.needs_mask(walk.n_block, Traits::kBlockN);
    row_stats.load_delta(coords, ss, stage.index, 0);
    ws_probabilities(p, coords, row_stats, 0, m0, key0, masked, seq, f, scale_log2);
    // dV += P^T dO (A from registers), issued before dS^T is computed so the tensor cores have it
    // meanwhile; with dropout dV takes Z^T o P^T, known with dS^T, and goes after it.
    auto issue_dv = [&] {
      Tensor rP = convert_fragment<Element>(acc_s);
      Tensor tOrP = make_tensor(rP.data(), gmma_acc_as_operand_a_layout(rP.layout()));
      wgmma_issue<false>(mma_dkv, tOrP, tVrdOt(_, _, _, stage.index), acc_dv);
    };
    if constexpr (!kDropout) issue_dv();
    warpgroup_wait<kDropout ? 0 : 1>();
    warpgroup_fence_operand(acc_dp);
    Tensor ds = make_tensor(acc_dp.data(), gmma_acc_rowcol_layout(acc_dp.layout()));
    ws_score_gradients<kDropout>(ds, p, row_stats, keep_bits, f.dropout_p);
    if constexpr (kDropout) issue_dv();

    // dK += dS^T Q  (A from registers)
    Tensor rdS = convert_fragment<Element>(acc_dp);
    Tensor tOrdS = make_tensor(rdS.data(), gmma_acc_as_operand_a_layout(rdS.layout()));
    wgmma_issue<false>(mma_dkv, tOrdS, tKrQt(_, _, _, stage.index), acc_dk);

    // dS -> shared memory; dQ_i[:, dq_col0 ..] = dS K once both consumers' keys are there (at d64
    // by consumer `step % 2` alone).
    copy(r2s, thr_r2s.retile_S(rdS),
         thr_r2s.partition_D(local_tile(sdSt(_, _, buffer), Shape<KC, M>{}, make_coord(g, _0{}))));
    cutlass::arch::fence_view_async_shared();
    named_barrier_sync(kWsDsBarrier, Traits::kConsumerThreads);
    const bool computes_dq = Traits::kDqSplitByColumns || (step & 1) == g;
    Tensor acc_dq = partition_fragment_C(mma_dq, Shape<M, DC>{});
    // Each side of the branch waits for every wgmma it has in flight before the two rejoin: with
    // one wait after the join, ptxas cannot prove the dQ product's accumulators retired on both
    // paths and serializes every wgmma of the kernel (d64: 24 waits for 24 HGMMAs, no warning;
    // scripts/wgmma_waits.sh finds it).
    if (computes_dq) {
      wgmma_issue<true>(mma_dq, tQrdS(_, _, _, buffer), tQrKt, acc_dq);
      warpgroup_wait<0>();
    } else {
      warpgroup_wait<0>();
    }
    warpgroup_fence_operand(acc_dv);
    warpgroup_fence_operand(acc_dk);
    warpgroup_fence_operand(acc_dq);
    EmptyBarrier::arrive(&ss.q_empty[stage.index]);  // Q, dO, LSE and D of this stage are done with

    // dQ_i (unscaled; the finish kernel applies the softmax scale) -> the buffer of its writer
    // (step % kWriters), once that writer's bulk copies have read the block kWriters steps back.
    // Each writer's barriers complete once per block it takes, so their phase flips every kWriters
    // steps.
    float* sdq = ss.dq[step % kWriters];
    if (step >= kWriters) EmptyBarrier::wait(&ss.dq_empty[step % kWriters], (step / kWriters - 1) & 1);
    if (computes_dq) {
      CUTE_UNROLL
      for (int i = 0; i < size(acc_dq); i += 2) {
        const int r = get<0>(cdQ(i)), c = dq_col0 + get<1>(cdQ(i));
        *reinterpret_cast<float2*>(sdq + r * Storage::kDqPitch + c) = make_float2(acc_dq(i), acc_dq(i + 1));
      }
    }
    fence_proxy_async_shared();  // generic writes, read next by the TMA unit
    EmptyBarrier::arrive(&ss.dq_full[step % kWriters]);
    stage.advance();
    buffer ^= 1;
  }

  // dK = scale * sum dS^T Q and dV, this consumer's 64 keys; keys past seqlen_k are not stored.
  if (prm.dk_by_tma) {
    ws_store_dkv_by_tma<Traits>(prm, ss, mma_dkv, acc_dk, acc_dv, walk, g, b, h);
    return;
  }
  ws_store_dkv_by_thread<Traits>(prm.a, mma_dkv, acc_dk, acc_dv, seq, key0, 0, h);
}


}  // namespace tileattn::cuda::sm90
