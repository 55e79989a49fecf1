// The main backward kernel, FlashAttention-2's Algorithm 2 at register level: one CTA per
// (key block, sequence, query head) keeps its K and V tiles in shared memory and dK, dV in
// registers, and walks the query blocks that see its keys (from the last down, rotated, or up from
// the diagonal: see bwd_walk_order.h).  Per query block i:
//   wait for Q_i, dO_i; start loading the next block's Q, dO into the other stage   (cp.async)
//   S  = Q_i K^T,  dP = dO_i V^T                    registers (ldmatrix + mma.sync)
//   P  = exp(S' - LSE_i),  dS = P o (dP - D_i)      registers (bwd_fa2_scores.cuh)
//   P, dS -> 16-bit -> shared memory, once           (the next products read them transposed)
//   dV += P^T dO_i,  dK += dS^T Q_i                  registers, for the whole walk
//   dQ_i += dS K                                      float atomics into the workspace (rows
//                                                    padded to the bucket), in key block order
//                                                    when deterministic (bwd_dq_turns.cuh)
// and at the end writes dK (times the softmax scale) and dV.  The tile products come from a
// Products policy: bwd_products_sm80.cuh (ldmatrix + mma.sync) or, on Hopper,
// src/cuda/sm90/bwd_products_sm90.cuh (wgmma reading shared memory directly); both see the same
// shared-memory tiles, loaded here with cp.async.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>  // fence_view_async_shared

#include "common/sequence.h"
#include "cuda/backward/bwd_args.h"
#include "cuda/backward/bwd_dq_turns.cuh"
#include "cuda/backward/bwd_fa2_scores.cuh"
#include "cuda/backward/bwd_tiles.cuh"
#include "cuda/backward/bwd_walk_order.h"
#include "cuda/cute_utils.h"
#include "cuda/mask_policy.h"

namespace tileattn::cuda::bwd {

// Adds one thread's dQ fragment to the float32 workspace.  gdq: the thread's partition of the
// tile's rows in the workspace, whose pitch is the compile-time bucket, so each address is the
// thread's base pointer plus an immediate; coords: tile-local (row, col) of each value.  Value
// pairs (2i, 2i + 1) are neighbouring columns: one 8-byte atomic on sm90 (half the atomics).
// Only the ragged last query block checks rows; padded columns add zeros (K's are zero-filled).
template <typename TensorAcc, typename TensorG, typename TensorC>
__device__ __forceinline__ void add_dq(TensorAcc const& acc, TensorG& gdq, TensorC const& coords, int valid_rows,
                                       bool full_tile) {
  static_assert(decltype(cute::stride<0, 0>(gdq))::value == 1, "value pairs are column pairs");
  auto add_pair = [&](int i) __attribute__((always_inline)) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float2*>(&gdq(i)), make_float2(acc(i), acc(i + 1)));
#else
    atomicAdd(&gdq(i), acc(i));
    atomicAdd(&gdq(i + 1), acc(i + 1));
#endif
  };
  if (full_tile) {
    CUTE_UNROLL
    for (int i = 0; i < cute::size(acc); i += 2) add_pair(i);
  } else {
    CUTE_UNROLL
    for (int i = 0; i < cute::size(acc); i += 2) {
      if (cute::get<0>(coords(i)) < valid_rows) add_pair(i);
    }
  }
}

template <typename Products, bool kTransforms, bool kDropout>
__global__ void __launch_bounds__(Products::Traits::kNThreads, 1) fa2_bwd_kernel(const __grid_constant__ BwdArgs a) {
  using namespace cute;
  using Traits = typename Products::Traits;
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  extern __shared__ __align__(1024) char smem[];  // 1 KB: the 128-byte swizzle's period
  const tileattn_fwd_params& f = a.p.fwd;
  const int tid = threadIdx.x;
  const int n_block = key_block_of(blockIdx.x, gridDim.x, a.walk_order), b = blockIdx.y, h = blockIdx.z;
  const int n0 = n_block * kBlockN;
  const int group = f.num_heads / f.num_heads_k, head_k = h / group;
  if (!sequence_in_bounds(f, b)) return;  // bad cu_seqlens / seqused_k: index_poison.h
  const SequenceView seq = sequence_view(f, b);
  const int stored = stored_keys(f, b);
  if (n0 >= stored) return;  // varlen: this sequence has fewer keys than max_seqlen_k
  const ScoreRule rule = make_rule(f, seq, b, h);
  const float scale_log2 = f.softmax_scale * kLog2e;
  const int head_dim = f.head_dim;

  // Query blocks this key block sees: m such that n_block is in m's key-block range, the same
  // rule the forward uses, so causal / window tiles with no visible pair are skipped.
  const int num_m_blocks = (seq.seqlen_q + kBlockM - 1) / kBlockM;
  auto key_range = [&](int m) {
    return key_block_range(m * kBlockM, kBlockM, kBlockN, seq.seqlen_q, seq.seqlen_k, f.window_left,
                           f.window_right);
  };
  auto visits = [&](int m) {
    const KeyBlockRange r = key_range(m);
    return n_block >= r.n_block_min && n_block < r.n_block_max;
  };
  // The visited blocks are one run [m_lo, m_hi] (a causal or window mask's visible query rows of a
  // key block are contiguous).
  int m_hi = n0 < seq.seqlen_k ? num_m_blocks - 1 : -1;
  while (m_hi >= 0 && !visits(m_hi)) --m_hi;
  int m_lo = m_hi;
  while (m_lo > 0 && visits(m_lo - 1)) --m_lo;
  const int visited = m_hi >= 0 ? m_hi - m_lo + 1 : 0;
  // The order is the host's (bwd_walk_order.h): rotated with atomic dQ; deterministic, rotated
  // without a mask when a head's CTAs fit on the GPU at once, up from the diagonal with one.
  auto walk_at = [&](int step) {  // the step-th visited block of this CTA's walk, or -1 after the last
    return step >= visited ? -1 : walk_block(a.walk_order, n_block, step, m_lo, m_hi);
  };
  int step = 0;
  int m_block = walk_at(0);
  int* held_turn = nullptr;  // a query block's dQ turn whose release waits a step (see below)

  // Shared memory: the cp.async destinations.
  auto smem_ptr = [&](int offset) { return make_smem_ptr(reinterpret_cast<Element*>(smem + offset)); };
  Tensor sK = make_tensor(smem_ptr(Traits::kOffsetK), typename Traits::SmemLayoutKV{});
  Tensor sV = make_tensor(smem_ptr(Traits::kOffsetV), typename Traits::SmemLayoutKV{});
  auto sQ_stage = [&](int offset, int stage) {
    return make_tensor(smem_ptr(offset + stage * Traits::kQBytes), typename Traits::SmemLayoutQ{});
  };
  // Global memory: this head's rows from row 0 of the sequence.
  const Element* q_rows = static_cast<const Element*>(f.q) +
                          q_offset(seq, f.q_batch_stride, f.q_row_stride, f.q_head_stride, 0, h);
  const Element* dout_rows = static_cast<const Element*>(a.p.dout) +
                             q_offset(seq, a.p.dout_batch_stride, a.p.dout_row_stride, a.p.dout_head_stride, 0, h);
  auto query_tile = [&](const Element* rows, int64_t row_stride, int m) {
    return make_tensor(make_gmem_ptr(rows + m * kBlockM * row_stride),
                       make_layout(Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_stride(row_stride, _1{})));
  };
  Tensor gK = make_tensor(
      make_gmem_ptr(static_cast<const Element*>(f.k) +
                    k_offset(seq, f.k_batch_stride, f.k_row_stride, f.k_head_stride, n0, head_k)),
      make_layout(Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_stride(f.k_row_stride, _1{})));
  Tensor gV = make_tensor(
      make_gmem_ptr(static_cast<const Element*>(f.v) +
                    k_offset(seq, f.v_batch_stride, f.v_row_stride, f.v_head_stride, n0, head_k)),
      make_layout(Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_stride(f.v_row_stride, _1{})));

  // global -> smem, rows past the sequence and columns past head_dim zero-filled (they add 0).
  typename Traits::GmemTiledCopy gmem_copy;
  auto gmem_thr = gmem_copy.get_thread_slice(tid);
  Tensor tQcQ = gmem_thr.partition_S(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  Tensor tKcK = gmem_thr.partition_S(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  Tensor tQpCol = make_tensor<bool>(make_shape(size<2>(tQcQ)));
  Tensor tKpCol = make_tensor<bool>(make_shape(size<2>(tKcK)));
  CUTE_UNROLL
  for (int k = 0; k < size(tQpCol); ++k) tQpCol(k) = get<1>(tQcQ(0, 0, k)) < head_dim;
  CUTE_UNROLL
  for (int k = 0; k < size(tKpCol); ++k) tKpCol(k) = get<1>(tKcK(0, 0, k)) < head_dim;
  auto load_query_block = [&](int m, int stage) {
    const int rows = seq.seqlen_q - m * kBlockM;
    copy_tile_predicated<true>(gmem_copy, gmem_thr.partition_S(query_tile(q_rows, f.q_row_stride, m)),
                               gmem_thr.partition_D(sQ_stage(Traits::kOffsetQ, stage)), tQcQ, tQpCol, rows);
    copy_tile_predicated<true>(gmem_copy,
                               gmem_thr.partition_S(query_tile(dout_rows, a.p.dout_row_stride, m)),
                               gmem_thr.partition_D(sQ_stage(Traits::kOffsetdO, stage)), tQcQ, tQpCol, rows);
  };

  Products products(smem, tid);
  // Tile-local (row, col) of every S / dP and dQ value this thread holds, as (rows, cols) views.
  Tensor tScS = products.partition_sdp(make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
  Tensor score_coords = make_tensor(tScS.data(), Products::rowcol(tScS.layout()));
  Tensor tdQcdQ = products.partition_dq(make_identity_tensor(Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  constexpr int kRows = decltype(size<0>(score_coords))::value;

  Tensor acc_dk = products.acc_dkv();
  Tensor acc_dv = products.acc_dkv();
  clear(acc_dk);
  clear(acc_dv);

  // LSE and D of the rows of query block m this thread holds; rows past the sequence get
  // LSE = +inf, so their P is 0.  Loaded a block ahead and left untouched until that block: any
  // arithmetic on a loaded value here (the LSE's conversion to log2 units was) makes the warp wait
  // out the load at once (ncu at d128 8k: 5.7% of all warp stall samples on that one multiply).
  float next_lse[kRows], next_delta[kRows];
  auto load_row_stats = [&](int m) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const int row = m * kBlockM + get<0>(score_coords(r, 0));
      next_lse[r] = INFINITY;
      next_delta[r] = 0.f;
      if (row < seq.seqlen_q) {
        next_lse[r] = f.softmax_lse[lse_offset(f, seq, row, h)];
        next_delta[r] = a.delta[h * a.q_rows + packed_q_row(f, seq, row)];
      }
    }
  };

  if (m_block >= 0) {
    load_row_stats(m_block);
    const int keys = seq.seqlen_k - n0;
    copy_tile_predicated<true>(gmem_copy, gmem_thr.partition_S(gK), gmem_thr.partition_D(sK), tKcK, tKpCol, keys);
    copy_tile_predicated<true>(gmem_copy, gmem_thr.partition_S(gV), gmem_thr.partition_D(sV), tKcK, tKpCol, keys);
    load_query_block(m_block, 0);
    cp_async_fence();
  }

  for (int stage = 0; m_block >= 0; stage ^= 1) {
    const int m0 = m_block * kBlockM;
    const int m_next = walk_at(++step);
    const KeyBlockRange range = key_range(m_block);
    // This block's row statistics were loaded during the previous block; the next block's load
    // now and land during this block's products.
    float lse_log2[kRows], delta[kRows];
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      lse_log2[r] = next_lse[r] * kLog2e;
      delta[r] = next_delta[r];
    }
    if (m_next >= 0) load_row_stats(m_next);

    cp_async_wait<0>();
    // wgmma reads shared memory through the async proxy: cp.async's writes must be fenced first.
    if constexpr (Products::kAsyncProxyOperands) cutlass::arch::fence_view_async_shared();
    __syncthreads();  // Q_i, dO_i visible; every warp is done with the other stage, P and dS
    if (m_next >= 0) {
      load_query_block(m_next, stage ^ 1);
      cp_async_fence();
    }

    // S = Q K^T, dP = dO V^T
    Tensor acc_s = products.acc_sdp();
    Tensor acc_dp = products.acc_sdp();
    products.scores(acc_s, acc_dp, stage);

    // P and dS in registers, then 16-bit copies in smem.
    Tensor scores = make_tensor(acc_s.data(), Products::rowcol(acc_s.layout()));
    Tensor dscores = make_tensor(acc_dp.data(), Products::rowcol(acc_dp.layout()));
    if (range.needs_mask(n_block, kBlockN)) {
      probs_and_score_grads<true, kTransforms, kDropout>(scores, dscores, score_coords, lse_log2, delta, rule,
                                                         scale_log2, m0, n0);
    } else {
      probs_and_score_grads<false, kTransforms, kDropout>(scores, dscores, score_coords, lse_log2, delta, rule,
                                                          scale_log2, m0, n0);
    }
    Tensor rP = convert_fragment<Element>(acc_s);
    Tensor rdS = convert_fragment<Element>(acc_dp);
    products.store_p_ds(rP, rdS);
    if constexpr (Products::kAsyncProxyOperands) cutlass::arch::fence_view_async_shared();
    __syncthreads();
    // The previous block's turn, held since its atomics (rotated or diagonal walks): half a step
    // later they have landed, so the release's fence does not stall thread 0 and, through the next
    // barrier, the CTA; the next CTA in the order reaches that block a step after us.
    if (held_turn != nullptr) {
      if (tid == 0) release_turn(held_turn);
      held_turn = nullptr;
    }

    // dV += (Z o P)^T dO,  dK += dS^T Q,  dQ_i += dS K (unscaled; the finish kernel applies the
    // softmax scale)
    Tensor acc_dq = products.acc_dq();
    products.key_and_query_grads(acc_dv, acc_dk, acc_dq, stage, [&](auto const& dq) __attribute__((always_inline)) {
      Tensor gdQ = make_tensor(make_gmem_ptr(a.dq_accum + (h * a.q_rows + packed_q_row(f, seq, m0)) * kHeadDim),
                               Layout<Shape<Int<kBlockM>, Int<kHeadDim>>, Stride<Int<kHeadDim>, _1>>{});
      Tensor tdQgdQ = products.partition_dq(gdQ);
      const int valid_rows = seq.seqlen_q - m0;
      if (a.dq_turns != nullptr) {
        int* counter = a.dq_turns + (static_cast<int64_t>(b) * f.num_heads + h) * a.dq_turn_blocks + m_block;
        wait_for_turn(counter, walk_turn(a.walk_order, n_block, m_block, range.n_block_min, range.n_block_max,
                                         visited));
        add_dq(dq, tdQgdQ, tdQcdQ, valid_rows, valid_rows >= kBlockM);
        if (a.walk_order == WalkOrder::kFromTop) {
          pass_turn(counter);  // every key block meets this block at this step: the next one waits now
        } else {
          held_turn = counter;  // the next key block in turn order arrives a step or more later
        }
      } else {
        add_dq(dq, tdQgdQ, tdQcdQ, valid_rows, valid_rows >= kBlockM);
      }
    });
    m_block = m_next;
  }
  if (held_turn != nullptr) pass_turn(held_turn);  // the barrier orders every thread's last atomics first

  // dK = scale * sum dS^T Q, dV as accumulated; keys in [seqlen_k, stored) hold zeros.
  const int rows_out = min(kBlockN, stored - n0);
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dk); ++i) acc_dk(i) *= f.softmax_scale;
  if (group == 1 && a.vector_dk && a.vector_dv) {
    // Staged in K and V's shared-memory tiles, so every store is a whole 16-byte vector (scalar
    // stores with per-element addressing cost ~1 us a CTA: half the time of a 512-key walk).
    Tensor rdK = convert_fragment<Element>(acc_dk);
    Tensor rdV = convert_fragment<Element>(acc_dv);
    __syncthreads();  // every warp is done reading K and V
    products.store_dkv(rdK, Traits::kOffsetK);
    products.store_dkv(rdV, Traits::kOffsetV);
    __syncthreads();
    auto store_tile = [&](auto const& src, void* out, int64_t batch_stride, int64_t row_stride,
                          int64_t head_stride) {
      Tensor g = make_tensor(make_gmem_ptr(static_cast<Element*>(out) +
                                           k_offset(seq, batch_stride, row_stride, head_stride, n0, h)),
                             make_layout(Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_stride(row_stride, _1{})));
      typename Traits::GmemTiledCopyStore store;
      auto thr = store.get_thread_slice(tid);
      Tensor tS = thr.partition_S(src);
      Tensor tD = thr.partition_D(g);
      CUTE_UNROLL
      for (int m = 0; m < size<1>(tS); ++m) {
        if (get<0>(tKcK(0, m, 0)) >= rows_out) continue;
        CUTE_UNROLL
        for (int k = 0; k < size<2>(tS); ++k) {
          if (tKpCol(k)) copy(store, tS(_, m, k), tD(_, m, k));
        }
      }
    };
    store_tile(sK, a.p.dk, a.p.dk_batch_stride, a.p.dk_row_stride, a.p.dk_head_stride);
    store_tile(sV, a.p.dv, a.p.dv_batch_stride, a.p.dv_row_stride, a.p.dv_head_stride);
    return;
  }
  Tensor tdKVc = products.partition_dkv(make_identity_tensor(Shape<Int<kBlockN>, Int<kHeadDim>>{}));
  CUTE_UNROLL
  for (int i = 0; i < size(acc_dk); ++i) {
    const int r = get<0>(tdKVc(i)), c = get<1>(tdKVc(i));
    if (r >= rows_out || c >= head_dim) continue;
    if (group == 1) {
      static_cast<Element*>(a.p.dk)[k_offset(seq, a.p.dk_batch_stride, a.p.dk_row_stride, a.p.dk_head_stride,
                                             n0 + r, h) + c] = Element(acc_dk(i));
      static_cast<Element*>(a.p.dv)[k_offset(seq, a.p.dv_batch_stride, a.p.dv_row_stride, a.p.dv_head_stride,
                                             n0 + r, h) + c] = Element(acc_dv(i));
    } else {
      const int64_t index = (h * a.k_rows + packed_k_row(f, seq, n0 + r)) * head_dim + c;
      a.dk_expanded[index] = acc_dk(i);
      a.dv_expanded[index] = acc_dv(i);
    }
  }
}

}  // namespace tileattn::cuda::bwd
