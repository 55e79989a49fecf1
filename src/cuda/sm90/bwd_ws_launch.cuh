// Host side of the warp-specialized Hopper backward (bwd_ws_kernel.cuh): which calls it serves,
// the TMA descriptors of q, dout, k and v, and the launch.  Included by the generated sm_90a
// backward instances (bwd_sm90_instance.cu.in).
#pragma once

#include <cuda_runtime.h>

#include <type_traits>  // std::conditional_t, std::integral_constant

#include <cute/tensor.hpp>

#include "cuda/backward/bwd_args.h"
#include "cuda/check.h"
#include "cuda/device_checks.h"  // all_positive
#include "cuda/sm90/bwd_ws_kernel.cuh"
#include "cuda/sm90/gmem_view.h"

namespace tileattn::cuda::sm90 {

// The key-split layout up to d128, the column-split one at d256.
template <int kHeadDim, typename Element>
using BwdWsTraitsFor =
    std::conditional_t<(kHeadDim <= 128), BwdWsTraits<kHeadDim, Element>, BwdWsColsTraits<kHeadDim, Element>>;

// The calls it can serve: dense batches (no cu_seqlens, seqused_k), no softcap or ALiBi (dropout
// has its own kernel), head dims up to 256 (buckets 64, 128 and 256) with 16-byte aligned rows.
// Under auto (thresholds below) from 512 query rows at d256, at d65-128 from 512 without a mask and
// 1024 with one, and at d <= 64 without dropout from 512 without a mask and 2048 with one: each CTA
// walks its query blocks with one CTA an SM, so fill, drain and the dK, dV epilogue are exposed once
// per walk, which short causal walks cannot hide.  Every other call runs the FA2-structured kernel.
inline bool bwd_ws_serves(const bwd::BwdArgs& a) {
  using Mode = bwd::BwdArgs::WarpSpecialized;
  if (a.warp_specialized == Mode::kNever) return false;
  const tileattn_fwd_params& f = a.p.fwd;
  const bool can = f.cu_seqlens_q == nullptr && f.cu_seqlens_k == nullptr && f.seqused_k == nullptr &&
                   f.softcap == 0.f && f.alibi_slopes == nullptr && f.head_dim <= 256 && a.vector_q &&
                   a.vector_k && a.vector_v && a.vector_dout;
  if (!can) return false;
  // TMA descriptors take no dimension of 0 and no stride of 0: an expanded tensor, e.g. the dO of a
  // loss that broadcasts a weight over rows and heads, goes to the FA2-structured kernel.
  if (f.seqlen_q <= 0 || f.seqlen_k <= 0) return false;
  if (!all_positive({f.q_row_stride, f.q_head_stride, f.q_batch_stride, f.k_row_stride, f.k_head_stride,
                     f.k_batch_stride, f.v_row_stride, f.v_head_stride, f.v_batch_stride, a.p.dout_row_stride,
                     a.p.dout_head_stride, a.p.dout_batch_stride})) {
    return false;
  }
  if (a.warp_specialized == Mode::kAlways) return true;
  const bool bounded_right = f.window_right >= 0;
  // d <= 64: 0.64-0.86x the FA2-structured kernel's 128 x 128 tiles until session 78 (H200,
  // sessions 10-13), when its dQ writer's 64 row reductions a block became one.  Since then, back
  // to back on the H100 (`--queue 10`, bf16, forced against auto; perf log, session 78): without a
  // mask level at 512 rows and +3-5% from 1k atomic, +6-20% deterministic; causal 0.93x at 512 and
  // 0.96x at 1k atomic, level at 2k, +2-3% from 4k (deterministic level at 512, +3-8% from 1k).
  // Dropout at d64 was not timed on it, so those calls stay on the FA2-structured kernel.
  if (f.head_dim <= 64) return f.dropout_p == 0.f && f.seqlen_q >= (bounded_right ? 2048 : 512);
  // d256 (the column-split layout), back to back against the FA2-structured kernel (`--queue 10`,
  // 2026-11-30, session 16, H200 bf16): 1.29-1.46x atomic and 1.20-1.41x deterministic at 512-16k
  // tokens without a mask, 1.17-1.45x and 1.15-1.34x causal.  Below 512 rows it is not measured.
  if (f.head_dim > 128) return f.seqlen_q >= 512;
  // Thresholds timed back to back (`bench sweep --queue 10`, 2026-11-30, session 13, H200 bf16 d128,
  // forced against the FA2-structured kernel, three runs a side within 2%): without a mask it wins
  // from 512 rows (atomic +8%, deterministic +14%, since each writer has its own dQ buffer); with a
  // causal mask or a right-bounded window not at 512 rows (atomic 0.96, deterministic 0.99), where
  // the walks have few blocks to overlap, but from 1024 (deterministic +12%).  Earlier single-call
  // A/Bs put d96 with d128 (2k +15%, 512 +4% atomic).
  return f.seqlen_q >= (bounded_right ? 1024 : 512);
}

// Deterministic calls split the dQ writes over two writer warps; atomic ones keep one, whose
// reductions need no wait before the next block (measured 2026-11-30, d128: deterministic +4-11%
// from 2k with two, atomic even from 4k and lower at causal 1k).
inline int bwd_ws_writers(const bwd::BwdArgs& a) { return a.deterministic ? 2 : 1; }

// Floats per row of the dQ workspace this kernel needs: its staging rows' pitch, so that each
// query block's dQ goes out as one bulk reduction (ws_write_dq).
template <int kHeadDim, typename Element>
int bwd_ws_dq_pitch(const bwd::BwdArgs& a) {
  using Traits = BwdWsTraitsFor<kHeadDim, Element>;
  constexpr int kOne = Traits::template SharedStorage<1>::kDqPitch;
  constexpr int kTwo = Traits::template SharedStorage<2>::kDqPitch;
  static_assert(kOne <= kHeadDim + bwd::kWsDqPadMax && kTwo <= kHeadDim + bwd::kWsDqPadMax,
                "the workspace size query bounds the pitch by kWsDqPadMax");
  return bwd_ws_writers(a) == 2 ? kTwo : kOne;
}

template <typename Traits, int kWriters, bool kDropout>
void launch_bwd_ws_kernel(const BwdWsParams<Traits>& prm, const tileattn_fwd_params& f, cudaStream_t stream) {
  auto kernel = &bwd_ws_kernel<Traits, kWriters, kDropout>;
  constexpr int kSmem = Traits::template kSmemBytes<kWriters>;
  static const cudaError_t opt_in = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  check_cuda(opt_in, "bwd_ws_kernel smem opt-in");
  const dim3 grid((f.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN, f.batch, f.num_heads);
  if (prm.a.dq_pitch != Traits::template SharedStorage<kWriters>::kDqPitch) {
    throw Error(ErrorCode::kInternal, "workspace", "the dQ workspace's row pitch is not the warp-specialized kernel's");
  }
  kernel<<<grid, Traits::kThreads, kSmem, stream>>>(prm);
  check_cuda(cudaGetLastError(), "bwd_ws_kernel");
}

template <int kHeadDim, typename Element>
void run_bwd_ws(const bwd::BwdArgs& a, cudaStream_t stream) {
  using namespace cute;
  using Traits = BwdWsTraitsFor<kHeadDim, Element>;
  const tileattn_fwd_params& f = a.p.fwd;
  BwdWsParams<Traits> prm;
  prm.a = a;
  prm.q_shape = make_shape(f.seqlen_q, f.head_dim, f.num_heads, f.batch);
  prm.kv_shape = make_shape(f.seqlen_k, f.head_dim, f.num_heads_k, f.batch);
  auto view = [&](const void* ptr, int rows, int heads, int64_t row_stride, int64_t head_stride,
                  int64_t batch_stride) {
    return gmem_view(static_cast<const Element*>(ptr), rows, f.head_dim, heads, f.batch, row_stride, head_stride,
                     batch_stride);
  };
  using QTile = Shape<typename Traits::_M, typename Traits::_D>;
  using KVTile = Shape<typename Traits::_N, typename Traits::_D>;
  auto q_smem = take<0, 2>(typename Traits::SmemLayoutQ{});
  auto kv_smem = take<0, 2>(typename Traits::SmemLayoutKV{});
  prm.tma_q = make_tma_copy(SM90_TMA_LOAD{}, view(f.q, f.seqlen_q, f.num_heads, f.q_row_stride, f.q_head_stride, f.q_batch_stride),
                            q_smem, QTile{}, _1{});
  prm.tma_do = make_tma_copy(SM90_TMA_LOAD{},
                             view(a.p.dout, f.seqlen_q, f.num_heads, a.p.dout_row_stride, a.p.dout_head_stride,
                                  a.p.dout_batch_stride),
                             q_smem, QTile{}, _1{});
  prm.tma_k = make_tma_copy(SM90_TMA_LOAD{}, view(f.k, f.seqlen_k, f.num_heads_k, f.k_row_stride, f.k_head_stride, f.k_batch_stride),
                            kv_smem, KVTile{}, _1{});
  prm.tma_v = make_tma_copy(SM90_TMA_LOAD{}, view(f.v, f.seqlen_k, f.num_heads_k, f.v_row_stride, f.v_head_stride, f.v_batch_stride),
                            kv_smem, KVTile{}, _1{});

  prm.dk_by_tma = f.num_heads == f.num_heads_k && a.vector_dk && a.vector_dv &&
                  all_positive({a.p.dk_row_stride, a.p.dk_head_stride, a.p.dk_batch_stride, a.p.dv_row_stride,
                                a.p.dv_head_stride, a.p.dv_batch_stride});  // TMA: no stride of 0
  if (prm.dk_by_tma) {
    auto out_view = [&](void* ptr, int64_t row_stride, int64_t head_stride, int64_t batch_stride) {
      return gmem_view(static_cast<Element*>(ptr), f.seqlen_k, f.head_dim, f.num_heads_k, f.batch, row_stride,
                       head_stride, batch_stride);
    };
    prm.tma_dk = make_tma_copy(SM90_TMA_STORE{},
                               out_view(a.p.dk, a.p.dk_row_stride, a.p.dk_head_stride, a.p.dk_batch_stride),
                               kv_smem, KVTile{}, _1{});
    prm.tma_dv = make_tma_copy(SM90_TMA_STORE{},
                               out_view(a.p.dv, a.p.dv_row_stride, a.p.dv_head_stride, a.p.dv_batch_stride),
                               kv_smem, KVTile{}, _1{});
  }

  // Dropout is a separate kernel: its Philox calls and keep bits cost the plain one nothing.
  // One launch per (writers, dropout) pair; the tags carry the choice into the template.
  const auto launch = [&](auto writers, auto dropout) {
    launch_bwd_ws_kernel<Traits, decltype(writers)::value, decltype(dropout)::value>(prm, f, stream);
  };
  using OneWriter = std::integral_constant<int, 1>;
  using TwoWriters = std::integral_constant<int, 2>;
  const bool dropout = f.dropout_p > 0.f;
  if (bwd_ws_writers(a) == 2) {
    dropout ? launch(TwoWriters{}, std::true_type{}) : launch(TwoWriters{}, std::false_type{});
  } else {
    dropout ? launch(OneWriter{}, std::true_type{}) : launch(OneWriter{}, std::false_type{});
  }
}

}  // namespace tileattn::cuda::sm90
