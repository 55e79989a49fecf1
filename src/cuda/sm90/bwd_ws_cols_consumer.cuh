// The consumer warpgroups of the column-split warp-specialized backward (d256; the split is
// explained in bwd_ws_cols_traits.h).  Consumer g, per query block i of the walk:
//
//   S^T = K Q_i[32g..]^T,  dP^T = V dO_i[32g..]^T              (wgmma, M 64 keys, N 32 queries)
//   P^T = exp2(S^T scale_log2 - LSE_i)   (0 where masked)       -- while dP^T is on the tensor cores
//   dS^T = P^T o (Z^T o dP^T - D_i)      (Z = dropout mask / (1 - p), 1 without dropout)
//   P^T (times Z^T), dS^T -> shared memory (this consumer's 32 query columns); barrier with the other
//   dK[:, 128g..] += dS^T Q_i[:, 128g..]    then release Q    (wgmma, both operands in smem)
//   dV[:, 128g..] += P^T dO_i[:, 128g..]    then release dO
//   dQ_i[:, 128g..] = dS K[:, 128g..]       -> shared memory for the dQ writer
// then dK (times the softmax scale) and dV, 64 keys x 128 columns, to global memory.
#pragma once

#include "cuda/sm90/bwd_ws_cols_traits.h"
#include "cuda/sm90/bwd_ws_roles.cuh"

namespace tileattn::cuda::sm90 {

template <typename Traits, int kWriters, bool kDropout, typename Storage>
__device__ __forceinline__ void ws_consume_cols(BwdWsParams<Traits> const& prm, Storage& ss, const BwdWalk& walk,
                                                int first, int g, int b, int h) {
  using namespace cute;
  using Element = typename Traits::Element;
  using M = typename Traits::_M;
  using N = typename Traits::_N;
  using MC = typename Traits::_MC;
  using D = typename Traits::_D;
  using DC = typename Traits::_DC;
  constexpr int kBlockM = Traits::kBlockM;
  const bwd::BwdArgs& a = prm.a;
  const tileattn_fwd_params& f = a.p.fwd;
  const SequenceView& seq = walk.seq;
  const int tid = threadIdx.x % 128;
  const int n0 = walk.n_block * Traits::kBlockN;         // the CTA's first key
  const int q_col0 = g * Traits::kQueriesPerConsumer;   // this consumer's first query row of a block
  const int col0 = g * Traits::kColumnsPerConsumer;     // and its first dK, dV, dQ column
  const float scale_log2 = f.softmax_scale * bwd::kLog2e;

  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmadKV mma_dkv;
  typename Traits::TiledMmadQ mma_dq;
  auto thr_sdp = mma_sdp.get_thread_slice(tid);
  auto thr_dkv = mma_dkv.get_thread_slice(tid);
  auto thr_dq = mma_dq.get_thread_slice(tid);

  Tensor sQ = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQ{});       // (M, D, 1)
  Tensor sdO = make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutQ{});
  Tensor sQt = make_tensor(make_smem_ptr(ss.q.data()), typename Traits::SmemLayoutQt{});     // (D, M, 1)
  Tensor sdOt = make_tensor(make_smem_ptr(ss.dout.data()), typename Traits::SmemLayoutQt{});
  Tensor sK = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutKV{});      // (N, D, 1)
  Tensor sV = make_tensor(make_smem_ptr(ss.v.data()), typename Traits::SmemLayoutKV{});
  Tensor sKt = make_tensor(make_smem_ptr(ss.k.data()), typename Traits::SmemLayoutKt{});     // (D, N, 1)
  Tensor sPt = make_tensor(make_smem_ptr(ss.pt.data()), typename Traits::SmemLayoutPdSt{});  // (N, M, buffer)
  Tensor sdSt = make_tensor(make_smem_ptr(ss.dst.data()), typename Traits::SmemLayoutPdSt{});
  Tensor sdS = make_tensor(make_smem_ptr(ss.dst.data()), typename Traits::SmemLayoutdS{});   // (M, N, buffer)

  Tensor tSrK = thr_sdp.partition_fragment_A(sK(_, _, 0));
  Tensor tSrV = thr_sdp.partition_fragment_A(sV(_, _, 0));
  Tensor tSrQ = thr_sdp.partition_fragment_B(local_tile(sQ(_, _, 0), Shape<MC, D>{}, make_coord(g, _0{})));
  Tensor tSrdO = thr_sdp.partition_fragment_B(local_tile(sdO(_, _, 0), Shape<MC, D>{}, make_coord(g, _0{})));
  Tensor tVrPt = thr_dkv.partition_fragment_A(sPt);  // (MMA, M, K, buffer)
  Tensor tKrdSt = thr_dkv.partition_fragment_A(sdSt);
  Tensor tVrdOt = thr_dkv.partition_fragment_B(local_tile(sdOt(_, _, 0), Shape<DC, M>{}, make_coord(g, _0{})));
  Tensor tKrQt = thr_dkv.partition_fragment_B(local_tile(sQt(_, _, 0), Shape<DC, M>{}, make_coord(g, _0{})));
  Tensor tQrdS = thr_dq.partition_fragment_A(sdS);   // (MMA, M, K, buffer)
  Tensor tQrKt = thr_dq.partition_fragment_B(local_tile(sKt(_, _, 0), Shape<DC, N>{}, make_coord(g, _0{})));

  // S^T-layout registers (P^T, dS^T) -> this consumer's 32 query columns of a buffer.
  auto r2s = make_tiled_copy_C(typename Traits::SmemCopyAtomC{}, mma_sdp);
  auto thr_r2s = r2s.get_thread_slice(tid);

  // (key, query row) of every S^T value this thread holds, relative to (n0, first query of the
  // block + q_col0), as (rows, cols).
  Tensor cS = thr_sdp.partition_C(make_identity_tensor(Shape<N, MC>{}));
  Tensor coords = make_tensor(cS.data(), gmma_acc_rowcol_layout(cS.layout()));
  Tensor cdQ = thr_dq.partition_C(make_identity_tensor(Shape<M, DC>{}));

  Tensor acc_dv = partition_fragment_C(mma_dkv, Shape<N, DC>{});
  Tensor acc_dk = partition_fragment_C(mma_dkv, Shape<N, DC>{});
  clear(acc_dv);
  clear(acc_dk);

  if (first >= 0) FullBarrier::wait(&ss.kv_full, 0);
  uint32_t phase = 0;  // of the one Q/dO stage
  int buffer = 0;      // of P^T and dS^T
  for (int step = 0, m = walk.at(0); m >= 0; m = walk.at(++step)) {
    const int m0 = m * kBlockM;
    const KeyBlockRange range = walk.range(m);

    Tensor acc_s = partition_fragment_C(mma_sdp, Shape<N, MC>{});
    Tensor acc_dp = partition_fragment_C(mma_sdp, Shape<N, MC>{});
    FullBarrier::wait(&ss.q_full[0], phase);
    wgmma_issue<true>(mma_sdp, tSrK, tSrQ, acc_s);
    FullBarrier::wait(&ss.do_full[0], phase);
    wgmma_issue<true>(mma_sdp, tSrV, tSrdO, acc_dp);
    uint32_t keep_bits = 0;
    if constexpr (kDropout) {
      keep_bits = ws_dropout_keep_bits<decltype(size<1>(coords))::value>(f, coords, b, h, m0 + q_col0, n0);
    }
    warpgroup_wait<1>();
    warpgroup_fence_operand(acc_s);

    // P^T = exp2(S^T scale_log2 - LSE), 0 where the mask hides (query, key).
    Tensor p = make_tensor(acc_s.data(), gmma_acc_rowcol_layout(acc_s.layout()));  // (keys, query rows)
    const bool masked = range.needs_mask(walk.n_block, Traits::kBlockN);
    constexpr int kCols = decltype(size<1>(coords))::value;
    WsRowStats<kCols> row_stats;
    row_stats.load_lse(coords, ss, 0, q_col0);
    row_stats.load_delta(coords, ss, 0, q_col0);
    ws_probabilities(p, coords, row_stats, q_col0, m0, n0, masked, seq, f, scale_log2);
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_dp);
    Tensor ds = make_tensor(acc_dp.data(), gmma_acc_rowcol_layout(acc_dp.layout()));
    ws_score_gradients<kDropout>(ds, p, row_stats, keep_bits, f.dropout_p);

    // Both consumers' query columns of P^T and dS^T into shared memory: each product below reads all 64.
    Tensor rP = convert_fragment<Element>(acc_s);
    Tensor rdS = convert_fragment<Element>(acc_dp);
    copy(r2s, thr_r2s.retile_S(rP),
         thr_r2s.partition_D(local_tile(sPt(_, _, buffer), Shape<N, MC>{}, make_coord(_0{}, g))));
    copy(r2s, thr_r2s.retile_S(rdS),
         thr_r2s.partition_D(local_tile(sdSt(_, _, buffer), Shape<N, MC>{}, make_coord(_0{}, g))));
    cutlass::arch::fence_view_async_shared();
    named_barrier_sync(kWsDsBarrier, Traits::kConsumerThreads);

    // dK first, so Q is released first: the producer's next Q load overlaps dV and dQ, and the next
    // dO load overlaps dQ and the next block's S^T.
    Tensor acc_dq = partition_fragment_C(mma_dq, Shape<M, DC>{});
    wgmma_issue<false>(mma_dkv, tKrdSt(_, _, _, buffer), tKrQt, acc_dk);
    wgmma_issue<false>(mma_dkv, tVrPt(_, _, _, buffer), tVrdOt, acc_dv);
    wgmma_issue<true>(mma_dq, tQrdS(_, _, _, buffer), tQrKt, acc_dq);
    warpgroup_wait<2>();
    EmptyBarrier::arrive(&ss.q_empty[0]);
    warpgroup_wait<1>();
    EmptyBarrier::arrive(&ss.do_empty[0]);
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_dk);
    warpgroup_fence_operand(acc_dv);
    warpgroup_fence_operand(acc_dq);

    // dQ_i (unscaled; the finish kernel applies the softmax scale), this consumer's columns, once
    // the bulk copies of the previous block's writer (step - 1) % kWriters have read its dQ.  Each
    // writer's barriers complete once per block it takes, so their phase flips every kWriters steps.
    float* sdq = ss.dq_staging(0);
    if (step >= 1) EmptyBarrier::wait(&ss.dq_empty[(step - 1) % kWriters], ((step - 1) / kWriters) & 1);
    CUTE_UNROLL
    for (int i = 0; i < size(acc_dq); i += 2) {
      const int r = get<0>(cdQ(i)), c = col0 + get<1>(cdQ(i));
      *reinterpret_cast<float2*>(sdq + r * Storage::kDqPitch + c) = make_float2(acc_dq(i), acc_dq(i + 1));
    }
    fence_proxy_async_shared();  // generic writes, read next by the TMA unit
    EmptyBarrier::arrive(&ss.dq_full[step % kWriters]);
    phase ^= 1u;
    buffer ^= 1;
  }

  if (prm.dk_by_tma) {
    ws_store_dkv_by_tma<Traits>(prm, ss, mma_dkv, acc_dk, acc_dv, walk, g, b, h);
    return;
  }
  ws_store_dkv_by_thread<Traits>(a, mma_dkv, acc_dk, acc_dv, seq, n0, col0, h);
}

}  // namespace tileattn::cuda::sm90
