// The FA2 forward kernel of the sm80 family: one CTA per (query tile, batch, head) (FA2 change 1:
// parallel over the query sequence too, not only batch x heads).  This file resolves where the
// CTA's data lives and which key blocks it visits, then runs mainloop.h and epilogue.h.
#pragma once

#include <cute/tensor.hpp>

#include "common/sequence.h"
#include "cuda/epilogue.h"
#include "cuda/launch_api.h"
#include "cuda/mainloop.h"
#include "cuda/mask_policy.h"
#include "cuda/softmax_state.h"
#include "tileattn/tileattn.hpp"

namespace tileattn::cuda {

// Work -> coordinates.  One tile per CTA for now; a persistent scheduler would replace this.
// Query tiles run last-first: with a causal mask the last tiles have the most key blocks, and
// starting them first leaves the short ones to fill the final wave.
struct TileCoords {
  int m_block, batch, head;
};
__device__ __forceinline__ TileCoords current_tile() {
  return TileCoords{static_cast<int>(gridDim.x - 1 - blockIdx.x), static_cast<int>(blockIdx.y),
                    static_cast<int>(blockIdx.z)};
}

template <typename Traits, typename ScorePolicy, typename DropoutPolicy>
__global__ void __launch_bounds__(Traits::kNThreads, 1) fwd_kernel(const __grid_constant__ FwdKernelArgs args) {
  using Element = typename Traits::Element;
  extern __shared__ __align__(128) char smem[];
  const ForwardParams& p = args.params;
  const TileCoords tile = current_tile();
  const SequenceView seq = sequence_view(p, tile.batch);
  const int m0 = tile.m_block * Traits::kBlockM;
  if (!sequence_in_bounds(p, tile.batch)) return;  // bad cu_seqlens / seqused_k: index_poison.h
  if (m0 >= seq.seqlen_q) return;  // varlen: this sequence is shorter than max_seqlen_q
  const int kv_head = tile.head / (p.num_heads / p.num_heads_k);  // GQA / MQA

  const KeyBlockRange range = key_block_range(m0, Traits::kBlockM, Traits::kBlockN, seq.seqlen_q,
                                              seq.seqlen_k, p.window_left, p.window_right);
  const VisibilityMask mask{seq.seqlen_q, seq.seqlen_k, p.window_left, p.window_right};
  ScorePolicy score_policy{};
  if constexpr (ScorePolicy::kTransforms) {
    score_policy.softmax_scale = p.softmax_scale;
    score_policy.softcap = p.softcap;
    score_policy.alibi_slope =
        p.alibi_slopes != nullptr ? p.alibi_slopes[tile.batch * p.alibi_batch_stride + tile.head] : 0.f;
    score_policy.seqlen_q = seq.seqlen_q;
    score_policy.seqlen_k = seq.seqlen_k;
  }
  DropoutPolicy dropout{};
  if constexpr (DropoutPolicy::kEnabled) {
    dropout = DropoutPolicy{p.philox_seed, p.philox_offset, tile.batch, tile.head, p.num_heads,
                            args.dropout_threshold};
  }

  typename Traits::TiledMma tiled_mma;
  cute::Tensor acc_o = cute::partition_fragment_C(
      tiled_mma, cute::Shape<cute::Int<Traits::kBlockM>, cute::Int<Traits::kHeadDim>>{});
  cute::clear(acc_o);
  constexpr int kRows = decltype(cute::size<0>(acc_rowcol_layout(acc_o.layout())))::value;
  OnlineSoftmax<kRows> softmax;
  softmax.init(args.scale_log2);

  // A tile whose rows see no key at all (seqlen_k = 0, or above the causal diagonal when Sq > Sk)
  // skips the mainloop and stores O = 0, LSE = +inf.
  if (range.n_block_max > range.n_block_min) {
    MainloopInputs<Element> in;
    in.q = static_cast<const Element*>(p.q) +
           q_offset(seq, p.q_batch_stride, p.q_row_stride, p.q_head_stride, m0, tile.head);
    in.k = static_cast<const Element*>(p.k) +
           k_offset(seq, p.k_batch_stride, p.k_row_stride, p.k_head_stride, 0, kv_head);
    in.v = static_cast<const Element*>(p.v) +
           k_offset(seq, p.v_batch_stride, p.v_row_stride, p.v_head_stride, 0, kv_head);
    in.q_row_stride = p.q_row_stride;
    in.k_row_stride = p.k_row_stride;
    in.v_row_stride = p.v_row_stride;
    in.q_rows = seq.seqlen_q - m0;
    in.seqlen_k = seq.seqlen_k;
    in.head_dim = p.head_dim;
    in.m0 = m0;
    fwd_mainloop<Traits>(in, range, smem, acc_o, softmax, mask, score_policy, dropout);
  }

  float lse[kRows];
  cute::Tensor acc_o_rows = cute::make_tensor(acc_o.data(), acc_rowcol_layout(acc_o.layout()));
  softmax.finalize(acc_o_rows, args.output_scale, lse);

  EpilogueOutputs<Element> dst;
  dst.out = static_cast<Element*>(p.out) +
            q_offset(seq, p.out_batch_stride, p.out_row_stride, p.out_head_stride, m0, tile.head);
  dst.out_row_stride = p.out_row_stride;
  dst.lse = p.softmax_lse + lse_offset(p, seq, m0, tile.head);
  dst.q_rows = seq.seqlen_q - m0;
  dst.head_dim = p.head_dim;
  store_output<Traits>(dst, acc_o, lse, smem);
}

}  // namespace tileattn::cuda
