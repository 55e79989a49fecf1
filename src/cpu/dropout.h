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
    // One Philox call gives this row four draws: columns j, j + 1, j + 8, j + 9 of a 16-column band
    // (common/philox.h), so the row is walked by band and by column pair within it.
    const int end = col0 + cols;
    for (int band = col0 & ~15; band < end; band += 16) {
      for (int pair = 0; pair < 8; pair += 2) {
        const Philox4x32 draws = dropout_draws(seed, offset, batch_index, head, num_heads, row, band + pair);
        for (int col : {band + pair, band + pair + 1, band + pair + 8, band + pair + 9}) {
          if (col < col0 || col >= end) continue;
          const bool keep = dropout_draw16(draws, dropout_slot(row, col)) >= threshold;
          float& e = x[col - col0];
          e = signed_probs ? (keep ? e : -e) : (keep ? e * keep_scale : 0.0f);
        }
      }
    }
  }
};

}  // namespace tileattn::cpu
