// Dropout on the CPU, drawing the mask through the shared Philox mapping (common/philox.h).
#pragma once

#include "common/philox.h"
#include "tileattn/tileattn.hpp"

namespace tileattn::cpu {

struct DropoutRule {
  bool enabled;
  uint32_t threshold;
  float keep_scale;  // 1 / (1 - p)
  uint64_t seed, offset;
  int batch_index, head, num_heads;

  static DropoutRule make(const ForwardParams& p, int batch_index, int head) {
    return DropoutRule{p.dropout_p > 0.0f, dropout_threshold(p.dropout_p), 1.0f / (1.0f - p.dropout_p),
                       p.philox_seed, p.philox_offset, batch_index, head, p.num_heads};
  }

  // Scales kept entries of one row by 1/(1-p) and zeroes dropped ones.  When `signed_probs` is
  // true it instead negates dropped entries and leaves kept ones alone (the attn_probs encoding).
  void apply_row(float* x, int row, int col0, int cols, bool signed_probs) const {
    for (int c = 0; c < cols;) {
      // One Philox call gives the draws of the four columns of one aligned group of 4.
      const int group = (col0 + c) & ~3;
      const Philox4x32 draws = dropout_draws(seed, offset, batch_index, head, num_heads, row, group);
      for (int lane = col0 + c - group; lane < 4 && c < cols; ++lane, ++c) {
        const bool keep = draws.x[lane] >= threshold;
        x[c] = signed_probs ? (keep ? x[c] : -x[c]) : (keep ? x[c] * keep_scale : 0.0f);
      }
    }
  }
};

}  // namespace tileattn::cpu
