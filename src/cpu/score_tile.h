// One tile of attention scores on the CPU: from the raw products q.k to base-2 logits with the
// scale, softcap, ALiBi and mask applied, plus which key tiles a query tile must visit.
#pragma once

#include "common/sequence.h"
#include "tileattn/tileattn.hpp"

namespace tileattn::cpu {

// Tile sizes: query rows x keys per step.  K/V tiles of 128-256 x D floats (up to 128 KiB at
// D = 128) and score tiles of 32-128 KiB stay in a core's 1 MiB L2, and sgemm gets products
// large enough to run near its peak.  Measured on 2 Zen 4 cores, B=1 H=8 S=2048, quiet machine
// (GFLOP/s fwd / bwd at fp32 D128; docs/perf-log.md has the rest): 128 x 128 148-151 / 150-155,
// 128 x 256 150 / 158-164, 256 x 128 164 / 156.  The forward takes 256 x 128 (fewer passes of
// the online-softmax rescale per query row), the backward 128 x 256 (a task owns 256 keys, so
// dK/dV partials are written half as often).
constexpr int kFwdBlockM = 256;
constexpr int kFwdBlockN = 128;
constexpr int kBwdBlockM = 128;
constexpr int kBwdBlockN = 256;

// log2(e): scores are kept in base 2 so the softmax uses exp2 (FA2's "scale folded into exp2").
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// How the raw product of one (batch, head) becomes a logit in base 2:
//   t = log2(e) * (softcap * tanh(scale * qk / softcap) - slope * |i + Sk - Sq - j|)
struct ScoreRule {
  float product_scale;     // scale * log2(e), or scale / softcap when softcap is on
  float softcap_log2;      // softcap * log2(e); 0 = off
  float alibi_slope_log2;  // slope * log2(e); 0 = off
  int seqlen_q, seqlen_k;  // seqlen_q counts positions
  int window_left, window_right;
  // Query rows a position: row r of a tile sits at position r / rows_per_position.  1 but where a
  // KV group's query heads run as rows of their KV head (FlashAttention's seqlen_q / groups swap:
  // rows (token i, head g) at i * group + g), whose heads share their token's mask.
  int rows_per_position = 1;

  int position(int row) const { return rows_per_position == 1 ? row : row / rows_per_position; }
};

// The rule of (batch_index, head) for a call whose query rows are s.seqlen_q / rows_per_position
// positions of rows_per_position rows each.
ScoreRule make_score_rule(const ForwardParams& p, const SequenceView& s, int batch_index, int head,
                          int rows_per_position = 1);

// The key columns a query tile touches, and the part every one of its rows sees in full; key
// tiles inside `clean` skip the per-element mask (FA2 handles masked tiles apart from the rest).
struct KeySpan {
  int first, last;              // union of the rows' visible columns; empty when first > last
  int clean_first, clean_last;  // columns visible from every row; empty when first > last
};

KeySpan key_span(const ScoreRule& rule, int row0, int rows);

inline bool tile_is_clean(const KeySpan& span, int col0, int cols) {
  return col0 >= span.clean_first && col0 + cols - 1 <= span.clean_last;
}

// The rows of a query tile (row0, rows) that see a key in columns [col0, col0 + cols), local to the
// tile: [lo, hi), empty (lo == hi) when none does.  Each row's visible columns move right with the
// row (common/mask.h), so the rows that meet a column range are one run.
struct RowRange {
  int lo, hi;
};

RowRange rows_seeing(const ScoreRule& rule, int row0, int rows, int col0, int cols);

// Turns s (rows x cols, leading dim lds) of raw products into logits t in place; with `mask`,
// invisible entries become -inf.  dtanh, when given (softcap only), receives 1 - tanh^2 per entry.
void finish_scores(const ScoreRule& rule, float* s, int lds, int row0, int rows, int col0,
                   int cols, bool mask, float* dtanh);

}  // namespace tileattn::cpu
