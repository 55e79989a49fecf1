#include "cpu/score_tile.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/mask.h"
#include "cpu/target_clones.h"

namespace tileattn::cpu {

ScoreRule make_score_rule(const ForwardParams& p, const SequenceView& s, int batch_index, int head,
                          int rows_per_position) {
  ScoreRule rule;
  const bool softcap = p.softcap > 0.0f;
  rule.product_scale = softcap ? p.softmax_scale / p.softcap : p.softmax_scale * kLog2e;
  rule.softcap_log2 = softcap ? p.softcap * kLog2e : 0.0f;
  rule.alibi_slope_log2 =
      p.alibi_slopes ? p.alibi_slopes[batch_index * p.alibi_batch_stride + head] * kLog2e : 0.0f;
  rule.seqlen_q = s.seqlen_q / rows_per_position;
  rule.seqlen_k = s.seqlen_k;
  rule.rows_per_position = rows_per_position;
  rule.window_left = p.window_left;
  rule.window_right = p.window_right;
  return rule;
}

KeySpan key_span(const ScoreRule& rule, int row0, int rows) {
  KeySpan span{rule.seqlen_k, -1, 0, rule.seqlen_k - 1};
  for (int r = row0; r < row0 + rows; ++r) {
    const ColumnRange c =
        visible_columns(rule.position(r), rule.seqlen_q, rule.seqlen_k, rule.window_left, rule.window_right);
    span.first = std::min(span.first, c.first);
    span.last = std::max(span.last, c.last);
    if (c.first > c.last) {
      span.clean_last = -1;  // an empty row makes every tile need the mask
    } else {
      span.clean_first = std::max(span.clean_first, c.first);
      span.clean_last = std::min(span.clean_last, c.last);
    }
  }
  if (span.first > span.last) span.first = 0, span.last = -1;
  return span;
}

RowRange rows_seeing(const ScoreRule& rule, int row0, int rows, int col0, int cols) {
  auto sees = [&](int r) {
    const ColumnRange c =
        visible_columns(rule.position(row0 + r), rule.seqlen_q, rule.seqlen_k, rule.window_left, rule.window_right);
    return c.first <= c.last && c.first < col0 + cols && c.last >= col0;
  };
  RowRange range{0, rows};
  while (range.lo < rows && !sees(range.lo)) ++range.lo;
  while (range.hi > range.lo && !sees(range.hi - 1)) --range.hi;
  return range;
}

// Each row's masked columns are filled with -inf first, and the scale, softcap and ALiBi run over
// its visible columns alone, a span the compiler vectorizes: the per-column mask test, on the
// library's baseline SSE2, was 17.7% of a causal bf16 d128 S=1024 forward (its diagonal tiles are
// 40% of the tiles there; session 70).
TILEATTN_CPU_CLONES
void finish_scores(const ScoreRule& rule, float* s, int lds, int row0, int rows, int col0,
                   int cols, bool mask, float* dtanh) {
  const float minus_inf = -std::numeric_limits<float>::infinity();
  for (int r = 0; r < rows; ++r) {
    float* t = s + static_cast<int64_t>(r) * lds;
    float* d = dtanh ? dtanh + static_cast<int64_t>(r) * lds : nullptr;
    const int row = rule.position(row0 + r);
    int begin = 0, end = cols;
    if (mask) {
      const ColumnRange v =
          visible_columns(row, rule.seqlen_q, rule.seqlen_k, rule.window_left, rule.window_right);
      begin = std::clamp(v.first - col0, 0, cols);
      end = std::clamp(v.last + 1 - col0, begin, cols);
      std::fill(t, t + begin, minus_inf);
      std::fill(t + end, t + cols, minus_inf);
      if (d) {  // P is 0 there; tanh' is 0 too, so that no stale value meets it
        std::fill(d, d + begin, 0.0f);
        std::fill(d + end, d + cols, 0.0f);
      }
    }
    if (rule.softcap_log2 > 0.0f) {
      for (int c = begin; c < end; ++c) {
        const float th = std::tanh(t[c] * rule.product_scale);
        if (d) d[c] = 1.0f - th * th;
        t[c] = rule.softcap_log2 * th;
      }
    } else {
#pragma omp simd
      for (int c = begin; c < end; ++c) t[c] *= rule.product_scale;
    }
    if (rule.alibi_slope_log2 != 0.0f) {
      for (int c = begin; c < end; ++c) {
        t[c] -= rule.alibi_slope_log2 * alibi_distance(row, col0 + c, rule.seqlen_q, rule.seqlen_k);
      }
    }
  }
}

}  // namespace tileattn::cpu
