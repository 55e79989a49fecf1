// One tile of attention scores on the CPU: from the raw products q.k to base-2 logits with the
// scale, softcap, ALiBi and mask applied, plus which key tiles a query tile must visit.
#pragma once

#include "common/sequence.h"
#include "tileattn/tileattn.hpp"

namespace tileattn::cpu {

// Query rows per task and keys per step.  128 x 128: the K and V tiles (128 x D floats, 64 KiB
// at D = 128) and the 64 KiB score tile stay in a core's 1 MiB L2, and sgemm gets products of
// 128 x 128 x D, large enough to run near its peak.  Measured on 2 Zen 4 cores (bench/cpu.py,
// B=1 H=8 S=2048): 64 x 128 gave 121-145 GFLOP/s forward, 128 x 128 139-148, 128 x 256 129-151
// (docs/perf-log.md).
// TILEATTN_CPU_BLOCK_M/N override them for tuning runs (bench/cpu.py against two builds).
#ifndef TILEATTN_CPU_BLOCK_M
#define TILEATTN_CPU_BLOCK_M 128
#endif
#ifndef TILEATTN_CPU_BLOCK_N
#define TILEATTN_CPU_BLOCK_N 128
#endif
constexpr int kBlockM = TILEATTN_CPU_BLOCK_M;
constexpr int kBlockN = TILEATTN_CPU_BLOCK_N;

// log2(e): scores are kept in base 2 so the softmax uses exp2 (FA2's "scale folded into exp2").
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// How the raw product of one (batch, head) becomes a logit in base 2:
//   t = log2(e) * (softcap * tanh(scale * qk / softcap) - slope * |i + Sk - Sq - j|)
struct ScoreRule {
  float product_scale;     // scale * log2(e), or scale / softcap when softcap is on
  float softcap_log2;      // softcap * log2(e); 0 = off
  float alibi_slope_log2;  // slope * log2(e); 0 = off
  int seqlen_q, seqlen_k;
  int window_left, window_right;
};

ScoreRule make_score_rule(const ForwardParams& p, const SequenceView& s, int batch_index, int head);

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

// Turns s (rows x cols, leading dim lds) of raw products into logits t in place; with `mask`,
// invisible entries become -inf.  dtanh, when given (softcap only), receives 1 - tanh^2 per entry.
void finish_scores(const ScoreRule& rule, float* s, int lds, int row0, int rows, int col0,
                   int cols, bool mask, float* dtanh);

}  // namespace tileattn::cpu
