// The kernels around the FA2 main kernel (bwd_fa2_kernel.cuh), and the WMMA fallback used when an
// input's rows are not 16-byte aligned (head_dim % 8 != 0 or odd strides):
//   bwd_delta      D_i = rowsum(dO_i o O_i)  (bwd_row_kernels.cuh, with bwd_finish_dq)
//   bwd_main       (fallback) one CTA per (key block, sequence, query head): loops over the query
//                  blocks that see its keys, recomputing P from Q, K and the saved LSE;
//                    S = Q K^T,  dP = dO V^T,  P = exp(S' - LSE),  dS = P o (dP - D)
//                    dV += P^T dO,  dK += dS^T Q  (in registers, written once at the end)
//                    dQ += dS K  (float atomics into a workspace; skipped when deterministic)
//   bwd_dq         (fallback) deterministic mode: one CTA per query block loops over the key
//                  blocks and accumulates dQ in registers; no atomics, so the sum order is fixed
//   bwd_finish     scales and converts dQ and, under GQA, sums dK/dV over each head group
#pragma once

#include "cuda/backward/bwd_args.h"
#include "cuda/backward/bwd_config.h"
#include "cuda/backward/bwd_row_kernels.cuh"
#include "cuda/backward/bwd_tiles.cuh"
#include "cuda/backward/warp_gemm.cuh"

namespace tileattn::cuda::bwd {

constexpr int kRowsPerWarpKernel = 8;  // bwd_finish_dkdv: one warp per row, 8 per CTA

template <int kHeadDim, typename Element>
struct BwdTiles {
  using L = BwdSmem<kHeadDim>;
  Element *k, *v, *q, *dout, *probs, *dscores;
  float *scores, *dprobs, *staging, *lse_log2, *delta;  // staging: one step's dQ, or the epilogue

  __device__ explicit BwdTiles(unsigned char* smem)
      : k(reinterpret_cast<Element*>(smem + L::k)), v(reinterpret_cast<Element*>(smem + L::v)),
        q(reinterpret_cast<Element*>(smem + L::q)), dout(reinterpret_cast<Element*>(smem + L::dout)),
        probs(reinterpret_cast<Element*>(smem + L::probs)),
        dscores(reinterpret_cast<Element*>(smem + L::dscores)),
        scores(reinterpret_cast<float*>(smem + L::scratch)),
        dprobs(reinterpret_cast<float*>(smem + L::scratch + L::kScoreTile)),
        staging(reinterpret_cast<float*>(smem + L::scratch)),
        lse_log2(reinterpret_cast<float*>(smem + L::lse_log2)),
        delta(reinterpret_cast<float*>(smem + L::delta)) {}
};

// Q and dO rows [row0, row0 + rows) of query head h, with their LSE and D.
template <int kHeadDim, typename Element>
__device__ void load_query_step(const BwdTiles<kHeadDim, Element>& t, const BwdArgs& a,
                                const SequenceView& s, int h, int row0, int rows) {
  using C = BwdConfig<kHeadDim>;
  const tileattn_fwd_params& f = a.p.fwd;
  load_tile<C::kBlockM, C::kDim, C::kPitch, C::kThreads>(
      t.q, static_cast<const Element*>(f.q) + q_offset(s, f.q_batch_stride, f.q_row_stride, f.q_head_stride, row0, h),
      f.q_row_stride, rows, f.head_dim, a.vector_q);
  load_tile<C::kBlockM, C::kDim, C::kPitch, C::kThreads>(
      t.dout, static_cast<const Element*>(a.p.dout) +
                  q_offset(s, a.p.dout_batch_stride, a.p.dout_row_stride, a.p.dout_head_stride, row0, h),
      a.p.dout_row_stride, rows, f.head_dim, a.vector_dout);
  load_row_stats<C::kBlockM, C::kThreads>(f, s, h, row0, a.delta, a.q_rows, t.lse_log2, t.delta);
}

// K and V rows [col0, col0 + cols) of KV head head_k.
template <int kHeadDim, typename Element>
__device__ void load_key_step(const BwdTiles<kHeadDim, Element>& t, const BwdArgs& a,
                              const SequenceView& s, int head_k, int col0, int cols) {
  using C = BwdConfig<kHeadDim>;
  const tileattn_fwd_params& f = a.p.fwd;
  load_tile<C::kBlockN, C::kDim, C::kPitch, C::kThreads>(
      t.k, static_cast<const Element*>(f.k) + k_offset(s, f.k_batch_stride, f.k_row_stride, f.k_head_stride, col0, head_k),
      f.k_row_stride, cols, f.head_dim, a.vector_k);
  load_tile<C::kBlockN, C::kDim, C::kPitch, C::kThreads>(
      t.v, static_cast<const Element*>(f.v) + k_offset(s, f.v_batch_stride, f.v_row_stride, f.v_head_stride, col0, head_k),
      f.v_row_stride, cols, f.head_dim, a.vector_v);
}

// One step shared by both kernels: S = Q K^T and dP = dO V^T for the tiles in shared memory,
// then P and dS.  Ends with a barrier, so the 16-bit P and dS tiles are ready to multiply.
template <int kHeadDim, typename Element>
__device__ void scores_and_gradients(const BwdTiles<kHeadDim, Element>& t, const ScoreRule& rule,
                                     int row0, int col0) {
  using C = BwdConfig<kHeadDim>;
  const int warp = threadIdx.x / 32;
  WarpTile<C::kBlockM, C::kBlockN, C::kWarps> product;
  product.zero();
  product.template mma<C::kDim, RowMajor, ColMajor>(t.q, C::kPitch, t.k, C::kPitch, warp);
  product.store(t.scores, C::kScorePitch, warp);
  product.zero();
  product.template mma<C::kDim, RowMajor, ColMajor>(t.dout, C::kPitch, t.v, C::kPitch, warp);
  product.store(t.dprobs, C::kScorePitch, warp);
  __syncthreads();
  probabilities_and_gradients<C::kBlockM, C::kBlockN, C::kScorePitch, C::kProbPitch, C::kThreads>(
      rule, row0, col0, t.scores, t.dprobs, t.lse_log2, t.delta, t.probs, t.dscores);
  __syncthreads();
}

// Writes a warp-tiled float accumulator (rows x head_dim) through shared memory to global rows
// `dst(r)`, scaled and converted.  Starts and ends with a barrier.
template <int kHeadDim, typename Element, typename Tile, typename RowPointer>
__device__ void write_rows(const BwdTiles<kHeadDim, Element>& t, const Tile& tile, int rows,
                           int head_dim, float scale, RowPointer dst) {
  using C = BwdConfig<kHeadDim>;
  __syncthreads();
  tile.store(t.staging, C::kAccPitch, threadIdx.x / 32);
  __syncthreads();
  for (int i = threadIdx.x; i < rows * C::kDim; i += C::kThreads) {
    const int r = i / C::kDim, c = i % C::kDim;
    if (c < head_dim) dst(r, c, t.staging[r * C::kAccPitch + c] * scale);
  }
  __syncthreads();
}

template <int kHeadDim, typename Element>
__global__ void __launch_bounds__(BwdConfig<kHeadDim>::kThreads) bwd_main_kernel(BwdArgs a) {
  using C = BwdConfig<kHeadDim>;
  extern __shared__ __align__(128) unsigned char smem[];
  const BwdTiles<kHeadDim, Element> t(smem);
  const tileattn_fwd_params& f = a.p.fwd;
  const int b = blockIdx.y, h = blockIdx.z, col0 = blockIdx.x * C::kBlockN;
  const int group = f.num_heads / f.num_heads_k, head_k = h / group;
  if (!sequence_in_bounds(f, b)) return;  // bad cu_seqlens / seqused_k: index_poison.h
  const SequenceView s = sequence_view(f, b);
  const int stored = stored_keys(f, b);
  if (col0 >= stored) return;
  const ScoreRule rule = make_rule(f, s, b, h);
  const int warp = threadIdx.x / 32;
  WarpTile<C::kBlockN, C::kDim, C::kWarps> dk_acc, dv_acc;  // in registers for the whole sweep
  dk_acc.zero();
  dv_acc.zero();

  if (col0 < s.seqlen_k) {
    const int cols = min(C::kBlockN, s.seqlen_k - col0);
    load_key_step(t, a, s, head_k, col0, cols);
    for (int row0 = 0; row0 < s.seqlen_q; row0 += C::kBlockM) {
      if (!tiles_meet(rule, row0, C::kBlockM, col0, cols)) continue;  // uniform over the CTA
      const int rows = min(C::kBlockM, s.seqlen_q - row0);
      __syncthreads();  // the previous step's products are done with Q, dO, P, dS
      load_query_step(t, a, s, h, row0, rows);
      __syncthreads();
      scores_and_gradients(t, rule, row0, col0);
      // dV += (Z o P)^T dO;  dK += dS^T Q   (P and dS are stored row-major: read column-major
      // they are their transposes)
      dv_acc.template mma<C::kBlockM, ColMajor, RowMajor>(t.probs, C::kProbPitch, t.dout, C::kPitch, warp);
      dk_acc.template mma<C::kBlockM, ColMajor, RowMajor>(t.dscores, C::kProbPitch, t.q, C::kPitch, warp);
      if (!a.deterministic) {
        // dQ += dS K, through float atomics: many key blocks add to the same query rows.
        WarpTile<C::kBlockM, C::kDim, C::kWarps> dq_step;
        dq_step.zero();
        dq_step.template mma<C::kBlockN, RowMajor, RowMajor>(t.dscores, C::kProbPitch, t.k, C::kPitch, warp);
        dq_step.store(t.staging, C::kAccPitch, warp);
        __syncthreads();
        for (int i = threadIdx.x; i < rows * C::kDim; i += C::kThreads) {
          const int r = i / C::kDim, c = i % C::kDim;
          if (c < f.head_dim) {
            atomicAdd(a.dq_accum + (h * a.q_rows + packed_q_row(f, s, row0 + r)) * a.dq_pitch + c,
                      t.staging[r * C::kAccPitch + c]);
          }
        }
      }
    }
  }
  // dK = scale * sum dS^T Q, dV as accumulated; keys past seqused_k hold zeros.
  const int rows_out = min(C::kBlockN, stored - col0);
  if (group == 1) {
    Element* dk = static_cast<Element*>(a.p.dk);
    Element* dv = static_cast<Element*>(a.p.dv);
    write_rows(t, dk_acc, rows_out, f.head_dim, f.softmax_scale, [&](int r, int c, float x) {
      dk[k_offset(s, a.p.dk_batch_stride, a.p.dk_row_stride, a.p.dk_head_stride, col0 + r, h) + c] = from_float<Element>(x);
    });
    write_rows(t, dv_acc, rows_out, f.head_dim, 1.0f, [&](int r, int c, float x) {
      dv[k_offset(s, a.p.dv_batch_stride, a.p.dv_row_stride, a.p.dv_head_stride, col0 + r, h) + c] = from_float<Element>(x);
    });
  } else {
    auto expanded = [&](float* buffer) {
      return [=, &f, &s](int r, int c, float x) {
        buffer[(h * a.k_rows + packed_k_row(f, s, col0 + r)) * f.head_dim + c] = x;
      };
    };
    write_rows(t, dk_acc, rows_out, f.head_dim, f.softmax_scale, expanded(a.dk_expanded));
    write_rows(t, dv_acc, rows_out, f.head_dim, 1.0f, expanded(a.dv_expanded));
  }
}

template <int kHeadDim, typename Element>
__global__ void __launch_bounds__(BwdConfig<kHeadDim>::kThreads) bwd_dq_kernel(BwdArgs a) {
  using C = BwdConfig<kHeadDim>;
  extern __shared__ __align__(128) unsigned char smem[];
  const BwdTiles<kHeadDim, Element> t(smem);
  const tileattn_fwd_params& f = a.p.fwd;
  const int b = blockIdx.y, h = blockIdx.z, row0 = blockIdx.x * C::kBlockM;
  const int head_k = h / (f.num_heads / f.num_heads_k);
  if (!sequence_in_bounds(f, b)) return;  // bad cu_seqlens / seqused_k: index_poison.h
  const SequenceView s = sequence_view(f, b);
  if (row0 >= s.seqlen_q) return;
  const int rows = min(C::kBlockM, s.seqlen_q - row0);
  const ScoreRule rule = make_rule(f, s, b, h);
  const int warp = threadIdx.x / 32;
  WarpTile<C::kBlockM, C::kDim, C::kWarps> dq_acc;  // in registers for the whole sweep
  dq_acc.zero();
  load_query_step(t, a, s, h, row0, rows);
  for (int col0 = 0; col0 < s.seqlen_k; col0 += C::kBlockN) {
    const int cols = min(C::kBlockN, s.seqlen_k - col0);
    if (!tiles_meet(rule, row0, rows, col0, cols)) continue;
    __syncthreads();  // the previous step's dQ product is done with K
    load_key_step(t, a, s, head_k, col0, cols);
    __syncthreads();
    scores_and_gradients(t, rule, row0, col0);
    // dQ += dS K, key blocks in order: the same sum on every run.
    dq_acc.template mma<C::kBlockN, RowMajor, RowMajor>(t.dscores, C::kProbPitch, t.k, C::kPitch, warp);
  }
  Element* dq = static_cast<Element*>(a.p.dq);
  write_rows(t, dq_acc, rows, f.head_dim, f.softmax_scale, [&](int r, int c, float x) {
    dq[q_offset(s, a.p.dq_batch_stride, a.p.dq_row_stride, a.p.dq_head_stride, row0 + r, h) + c] = from_float<Element>(x);
  });
}

// GQA: dK and dV of a KV head are the sums over its group of query heads, in head order.
template <typename Element>
__global__ void bwd_finish_dkdv_kernel(BwdArgs a) {
  const tileattn_fwd_params& f = a.p.fwd;
  const int b = blockIdx.y, head_k = blockIdx.z, lane = threadIdx.x % 32;
  const int group = f.num_heads / f.num_heads_k;
  if (!sequence_in_bounds(f, b)) return;  // bad cu_seqlens / seqused_k: index_poison.h
  const SequenceView s = sequence_view(f, b);
  const int row = blockIdx.x * kRowsPerWarpKernel + threadIdx.x / 32;
  if (row >= stored_keys(f, b)) return;
  const int64_t packed = packed_k_row(f, s, row);
  Element* dk = static_cast<Element*>(a.p.dk) +
                k_offset(s, a.p.dk_batch_stride, a.p.dk_row_stride, a.p.dk_head_stride, row, head_k);
  Element* dv = static_cast<Element*>(a.p.dv) +
                k_offset(s, a.p.dv_batch_stride, a.p.dv_row_stride, a.p.dv_head_stride, row, head_k);
  for (int d = lane; d < f.head_dim; d += 32) {
    float sum_k = 0.0f, sum_v = 0.0f;
    for (int g = 0; g < group; ++g) {
      const int64_t index = ((head_k * group + g) * a.k_rows + packed) * f.head_dim + d;
      sum_k += a.dk_expanded[index];
      sum_v += a.dv_expanded[index];
    }
    dk[d] = from_float<Element>(sum_k);
    dv[d] = from_float<Element>(sum_v);
  }
}

}  // namespace tileattn::cuda::bwd
