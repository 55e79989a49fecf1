// The warp-specialized Hopper backward (FlashAttention-3's layout; types in bwd_ws_traits.h).  One
// CTA of three warpgroups per (key block of 128, sequence, query head), walking the query blocks
// that see its keys in the order the FA2-structured kernel uses (bwd_walk_order.h):
//
//   producer warp 0 (one thread): K, V once; per query block, once its stage is free: Q_i, dO_i (TMA)
//   producer warp 1:              per query block: LSE_i (log2 units) and D_i into the stage
//   producer warps 2, 3 (dQ writers, even and odd steps): per query block: adds dQ_i from shared
//                                 memory to the float32 workspace by bulk reductions (in turn
//                                 order when deterministic)
//   consumer g (keys 64g .. 64g + 63), per query block i:
//     S^T = K_g Q_i^T,  dP^T = V_g dO_i^T                    (wgmma, both operands in smem)
//     P^T = exp2(S^T scale_log2 - LSE_i)   (0 where masked)  -- while dP^T is on the tensor cores
//     dS^T = P^T o (Z^T o dP^T - D_i)       (Z = dropout mask / (1 - p), 1 without dropout)
//     dV_g += (Z^T o P^T) dO_i,  dK_g += dS^T Q_i            (wgmma, A from registers)
//     dS -> smem;  barrier with the other consumer;  dQ_i[:, 64g..] = dS K  (wgmma, smem; at
//     d64 the consumers take alternate blocks' whole dQ instead)
//     release the stage;  dQ_i -> shared memory for the writer
//   then dK_g (times the softmax scale) and dV_g to global memory.
//
// What it changes against the FA2-structured kernel: no thread waits for its own loads (the TMA
// producer runs a stage ahead), no CTA-wide barrier (the consumers meet once per block, over dS),
// the keys as the M mode give P^T and dS^T in registers in the A layout of the dV and dK
// products, so P never goes through shared memory, and the consumers issue no atomics (the first
// version's float2 atomics, issued by every CTA of a head at the same moment, made it 10-50% slower
// than the FA2-structured kernel while its deterministic mode, which spreads them, was faster).
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
    FullBarrier::arrive_and_expect_tx(&ss.q_full[stage.index], 2 * Traits::kQTileBytes);
    copy(prm.tma_q.with(ss.q_full[stage.index]), get<0>(q_parts)(_, m), get<1>(q_parts)(_, stage.index));
    copy(prm.tma_do.with(ss.q_full[stage.index]), get<0>(do_parts)(_, m), get<1>(do_parts)(_, stage.index));
    stage.advance();
  }
}

// Warp 1 of the producer warpgroup: each stage's LSE (log2 units; +inf past seqlen_q, so P is 0
// there) and D (0 past seqlen_q), then one arrival per lane on the stage's full barrier.
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
      float lse = INFINITY, delta = 0.f;
      if (row < walk.seq.seqlen_q) {
        lse = f.softmax_lse[lse_offset(f, walk.seq, row, h)] * bwd::kLog2e;
        delta = a.delta[h * a.q_rows + packed_q_row(f, walk.seq, row)];
      }
      ss.lse_log2(stage.index, r) = lse;
      ss.delta(stage.index, r) = delta;
    }
    FullBarrier::arrive(&ss.q_full[stage.index]);
    stage.advance();
  }
}

// Warps 2 and 3 of the producer warpgroup (`writer` 0 and 1, the even and odd steps of the walk):
// each query block's dQ, once both consumers have written their halves to the writer's buffer, goes to
// the float32 workspace as one 512-byte bulk reduction per row (rows past seqlen_q are not sent:
// in a packed batch they would be the next sequence's).  When deterministic, lane 0 waits for the
// block's turn first and releases it after the reductions have landed, so the consumers never wait
// for a turn or for the reductions, and while one writer waits for its reductions to land the
// other can take the next block.
template <typename Traits, int kWriters, typename Storage>
__device__ __forceinline__ void ws_write_dq(const bwd::BwdArgs& a, Storage& ss,
                                            const BwdWalk& walk, int b, int h, int writer) {
  const tileattn_fwd_params& f = a.p.fwd;
  const int lane = threadIdx.x % 32;
  constexpr int kHeadDim = Traits::kHeadDim;
  uint32_t phase = 0;
  for (int step = writer, m = walk.at(step); m >= 0; step += kWriters, m = walk.at(step)) {
    EmptyBarrier::wait(&ss.dq_full[writer], phase);
    const float* sdq = ss.dq[writer];
    const int m0 = m * Traits::kBlockM;
    const int valid_rows = walk.seq.seqlen_q - m0;
    float* gdq = a.dq_accum + (h * a.q_rows + packed_q_row(f, walk.seq, m0)) * kHeadDim;
    int* counter = nullptr;
    if (a.dq_turns != nullptr) {
      counter = a.dq_turns + (static_cast<int64_t>(b) * f.num_heads + h) * a.dq_turn_blocks + m;
      if (lane == 0) bwd::poll_for_turn(counter, walk.turn(m));
      __syncwarp();
      fence_proxy_async_global();  // the reductions come after the acquired turn
    }
    for (int r = lane; r < Traits::kBlockM; r += 32) {
      if (r < valid_rows) bulk_reduce_add_f32(gdq + r * kHeadDim, sdq + r * Storage::kDqPitch, kHeadDim * 4);
    }
    bulk_commit();
    // The consumers may write the next dQ once the copies have read this one; the turn waits for
    // the reductions to land, which only this warp waits for.
    bulk_wait_read();
    __syncwarp();
    if (lane == 0) EmptyBarrier::arrive(&ss.dq_empty[writer]);
    if (counter != nullptr) {
      bulk_wait_done();
      fence_proxy_async_global();
      __syncwarp();
      if (lane == 0) bwd::release_turn(counter);
    }
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
  using KC = typename Traits::_KC;
  using N = typename Traits::_N;
  using D = typename Traits::_D;
  const int tid = threadIdx.x % 128;
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dk); ++i) acc_dk(i) *= prm.a.p.fwd.softmax_scale;
  Tensor rdK = convert_fragment<Element>(acc_dk);
  Tensor rdV = convert_fragment<Element>(acc_dv);
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutKV{});  // (N, D, 1)
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutKV{});
  auto r2s = make_tiled_copy_C(Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<32>, Element>{}, mma_dkv);
  auto thr_r2s = r2s.get_thread_slice(tid);
  // Each consumer's dQ product read K's columns for all 128 keys: K is overwritten only after both
  // are done with it.
  named_barrier_sync(kWsEpilogueBarrier, Traits::kConsumerThreads);
  copy(r2s, thr_r2s.retile_S(rdK), thr_r2s.partition_D(local_tile(sK(_, _, 0), Shape<KC, D>{}, make_coord(g, _0{}))));
  copy(r2s, thr_r2s.retile_S(rdV), thr_r2s.partition_D(local_tile(sV(_, _, 0), Shape<KC, D>{}, make_coord(g, _0{}))));
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

  // dS^T registers -> this consumer's 64 key rows of dS (as (keys, query rows)), 4 bytes a store.
  auto r2s = make_tiled_copy_C(Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<32>, Element>{}, mma_sdp);
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

    Tensor acc_s = partition_fragment_C(mma_sdp, Shape<KC, M>{});
    Tensor acc_dp = partition_fragment_C(mma_sdp, Shape<KC, M>{});
    wgmma_issue<true>(mma_sdp, tSrK, tSrQ(_, _, _, stage.index), acc_s);
    wgmma_issue<true>(mma_sdp, tSrV, tSrdO(_, _, _, stage.index), acc_dp);
    uint32_t keep_bits = 0;
    if constexpr (kDropout) {
      keep_bits = ws_dropout_keep_bits<decltype(size<1>(coords))::value>(f, coords, b, h, m0, key0);
    }
    warpgroup_wait<1>();
    warpgroup_fence_operand(acc_s);

    // P^T = exp2(S^T scale_log2 - LSE), 0 where the mask hides (query, key).
    Tensor p = make_tensor(acc_s.data(), gmma_acc_rowcol_layout(acc_s.layout()));  // (keys, query rows)
    const bool masked = range.needs_mask(walk.n_block, Traits::kBlockN);
    CUTE_UNROLL
    for (int c = 0; c < size<1>(p); ++c) {
      const int row = get<1>(coords(0, c));
      const float lse = ss.lse_log2(stage.index, row);
      ColumnRange visible{0, 0};
      if (masked) visible = visible_columns(m0 + row, seq.seqlen_q, seq.seqlen_k, f.window_left, f.window_right);
      CUTE_UNROLL
      for (int r = 0; r < size<0>(p); ++r) {
        float v = fast_exp2(p(r, c) * scale_log2 - lse);
        if (masked) {
          const int key = key0 + get<0>(coords(r, c));
          if (key < visible.first || key > visible.last) v = 0.f;
        }
        p(r, c) = v;
      }
    }
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_dp);
    // dS^T = P^T o (Z^T o dP^T - D), then P^T <- Z^T o P^T for dV
    Tensor ds = make_tensor(acc_dp.data(), gmma_acc_rowcol_layout(acc_dp.layout()));
    const float keep_scale = kDropout ? 1.f / (1.f - f.dropout_p) : 1.f;
    CUTE_UNROLL
    for (int c = 0; c < size<1>(ds); ++c) {
      const float d = ss.delta(stage.index, get<1>(coords(0, c)));
      CUTE_UNROLL
      for (int r = 0; r < size<0>(ds); ++r) {
        if constexpr (kDropout) {
          const float z = (keep_bits >> (2 * c + r)) & 1u ? keep_scale : 0.f;
          ds(r, c) = p(r, c) * (ds(r, c) * z - d);
          p(r, c) *= z;
        } else {
          ds(r, c) = p(r, c) * (ds(r, c) - d);
        }
      }
    }

    // dV += P^T dO,  dK += dS^T Q  (A from registers)
    Tensor rP = convert_fragment<Element>(acc_s);
    Tensor rdS = convert_fragment<Element>(acc_dp);
    Tensor tOrP = make_tensor(rP.data(), gmma_acc_as_operand_a_layout(rP.layout()));
    Tensor tOrdS = make_tensor(rdS.data(), gmma_acc_as_operand_a_layout(rdS.layout()));
    wgmma_issue<false>(mma_dkv, tOrP, tVrdOt(_, _, _, stage.index), acc_dv);
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
  Tensor cKV = thr_dkv.partition_C(make_identity_tensor(Shape<KC, D>{}));
  const int group = f.num_heads / f.num_heads_k;
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dk); ++i) {
    const int key = key0 + get<0>(cKV(i)), c = get<1>(cKV(i));
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

// kWriters dQ writer warps (1 or 2): a compile-time count, since with a runtime one the atomic
// path (one writer) measured 3-5% slower at d128 8k and ~10% at causal 1-2k than before the second
// writer existed (2026-11-30 A/B; ptxas stack 8 -> 24 bytes).
template <typename Traits, int kWriters, bool kDropout>
__global__ void __launch_bounds__(Traits::kThreads, 1) bwd_ws_kernel(const __grid_constant__ BwdWsParams<Traits> prm) {
  static_assert(kWriters >= 1 && kWriters <= Traits::kDqWriters);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(1024) char smem_raw[];
  auto& ss = *reinterpret_cast<typename Traits::template SharedStorage<kWriters>*>(smem_raw);
  const tileattn_fwd_params& f = prm.a.p.fwd;
  const int b = blockIdx.y, h = blockIdx.z;
  BwdWalk walk{&f, sequence_view(f, b), bwd::key_block_of(blockIdx.x, gridDim.x, prm.a.walk_order), Traits::kBlockM,
               Traits::kBlockN, prm.a.walk_order};
  if (walk.n_block * Traits::kBlockN >= walk.seq.seqlen_k) return;
  walk.plan();
  const int first = walk.at(0);

  if (threadIdx.x == 0) {
    cute::prefetch_tma_descriptor(prm.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(prm.tma_do.get_tma_descriptor());
    cute::prefetch_tma_descriptor(prm.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(prm.tma_v.get_tma_descriptor());
    FullBarrier::init(&ss.kv_full, 1);
    for (int s = 0; s < Traits::kStages; ++s) {
      FullBarrier::init(&ss.q_full[s], 1 + 32);  // the TMA arm and the 32 row-statistics lanes
      EmptyBarrier::init(&ss.q_empty[s], Traits::kConsumerThreads);
    }
    for (int w = 0; w < kWriters; ++w) {
      EmptyBarrier::init(&ss.dq_full[w], Traits::kConsumerThreads);
      EmptyBarrier::init(&ss.dq_empty[w], 1);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    const int warp = threadIdx.x / 32;
    if (first < 0) return;
    if (warp == 0 && threadIdx.x == 0) {
      ws_load_tiles<Traits>(prm, ss, walk, b, h, h / (f.num_heads / f.num_heads_k));
    } else if (warp == 1) {
      ws_stage_row_stats<Traits>(prm.a, ss, walk, h);
    } else if (warp >= 2 && warp - 2 < kWriters) {  // lanes 1-31 of warp 0 are idle too
      ws_write_dq<Traits, kWriters>(prm.a, ss, walk, b, h, warp - 2);
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
    ws_consume<Traits, kWriters, kDropout>(prm, ss, walk, first, warpgroup - 1, b, h);
  }
#endif
}

}  // namespace tileattn::cuda::sm90
