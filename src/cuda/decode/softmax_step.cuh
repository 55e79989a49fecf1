// One online-softmax step of the decode kernels' warps over a block of keys: the rules that turn a
// raw score into a base-2 logit (scale, softcap, ALiBi, the row's visible keys), and FA2's running
// (max, sum) update.  Both streaming loops (registers, TMA) call it on their S accumulators.
#pragma once

#include <math_constants.h>

#include "cuda/decode/decode_args.h"

namespace tileattn::cuda::decode {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The visible cache positions [lo, hi] of query row i (of Sq), bottom-right aligned over the
// sequence's keys [first, end): row i's diagonal is key end - Sq + i.
struct RowKeys {
  int lo, hi, diagonal;
};

__device__ __forceinline__ RowKeys row_keys(const tileattn_fwd_params& f, const SequenceKeys& seq, int i) {
  const int64_t diagonal = static_cast<int64_t>(i) + seq.end - f.seqlen_q;
  int64_t lo = seq.first, hi = static_cast<int64_t>(seq.end) - 1;
  if (f.window_left >= 0 && diagonal - f.window_left > lo) lo = diagonal - f.window_left;
  if (f.window_right >= 0 && diagonal + f.window_right < hi) hi = diagonal + f.window_right;
  return RowKeys{static_cast<int>(lo), static_cast<int>(hi), static_cast<int>(diagonal)};
}

// What a thread needs to turn its scores into logits: rows g (mine[0]) and g + 8 (mine[1]).
struct ScoreRules {
  float scale;         // softmax_scale log2(e), or softmax_scale / softcap with a softcap
  float softcap_log2;  // softcap log2(e)
  bool softcap, alibi;
  float slope_log2[2];
  RowKeys mine[2];
};

// s[n][e] holds S for row g + 8 (e / 2), key pos0 + 8n + 2t + (e & 1) (an m16n8 C fragment, kC = 2
// without rows 8..15).  In base 2:  s = scale q.k;  s = softcap tanh(s / softcap);  s -= slope
// |diagonal - j|;  invisible keys -inf.  Then FA2 eq. 5:  m' = max(m, rowmax S),  P = 2^(S - m'),
// l' = 2^(m - m') l + rowsum P; s becomes P and alpha = 2^(m - m') is left for O' = alpha O + P V.
// `plain`: every key of the block is visible to every row and there is no softcap or ALiBi, so
// the logit is the scaled score.
template <int kN, int kC>
__device__ __forceinline__ void softmax_step(float (&s)[kN][kC], int pos0, int t, const ScoreRules& rules, bool plain,
                                             float (&m)[2], float (&l)[2], float (&alpha)[2]) {
  constexpr int kHalves = kC / 2;
  float row_max[2] = {-CUDART_INF_F, -CUDART_INF_F};
#pragma unroll
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int e = 0; e < kC; ++e) {
      const int k = e / 2, key = pos0 + 8 * n + 2 * t + (e & 1);
      float x = s[n][e] * rules.scale;
      if (!plain) {
        if (rules.softcap) x = rules.softcap_log2 * tanhf(x);
        if (rules.alibi) x -= rules.slope_log2[k] * fabsf(static_cast<float>(rules.mine[k].diagonal - key));
        x = key >= rules.mine[k].lo && key <= rules.mine[k].hi ? x : -CUDART_INF_F;
      }
      s[n][e] = x;
      row_max[k] = fmaxf(row_max[k], x);
    }
  }
  float m_use[2];
#pragma unroll
  for (int k = 0; k < kHalves; ++k) {
    row_max[k] = fmaxf(row_max[k], __shfl_xor_sync(0xffffffffu, row_max[k], 1));
    row_max[k] = fmaxf(row_max[k], __shfl_xor_sync(0xffffffffu, row_max[k], 2));
    const float m_new = fmaxf(m[k], row_max[k]);
    alpha[k] = m_new == -CUDART_INF_F ? 1.0f : exp2f(m[k] - m_new);
    m_use[k] = m_new == -CUDART_INF_F ? 0.0f : m_new;  // a row with no visible key yet: P = 0
    m[k] = m_new;
    l[k] *= alpha[k];
  }
#pragma unroll
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int e = 0; e < kC; ++e) {
      s[n][e] = exp2f(s[n][e] - m_use[e / 2]);
      l[e / 2] += s[n][e];
    }
  }
}

}  // namespace tileattn::cuda::decode
