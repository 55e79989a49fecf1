// The online-softmax state of one query row (FA2, Algorithm 1): running max m and running sum l,
// both in base 2, with the output accumulator left unnormalized until finalize().
#pragma once

#include <cmath>
#include <limits>

#include "cpu/score_tile.h"

namespace tileattn::cpu {

struct RowSoftmax {
  float max = -std::numeric_limits<float>::infinity();  // m, in log2 units
  float sum = 0.0f;                                     // l = sum of 2^(t - m)

  // Folds in a tile whose largest logit is tile_max.  Returns the exponent base to subtract
  // from the tile's logits and sets *rescale to the factor 2^(m_old - m_new) the row's sum and
  // output accumulator must be multiplied by.  A row that has seen only -inf keeps base 0, so
  // 2^(-inf - 0) = 0 and no -inf - (-inf) = NaN appears.
  float update_max(float tile_max, float* rescale) {
    const float new_max = std::max(max, tile_max);
    const float base = new_max == -std::numeric_limits<float>::infinity() ? 0.0f : new_max;
    // The max of most tiles after the first few leaves m unchanged, and then 2^0 = 1 without the
    // libm call (3% of a bf16 forward on AMX, where it runs once a row and tile).
    *rescale = base == max ? 1.0f : std::exp2(max - base);
    max = new_max;
    sum *= *rescale;
    return base;
  }

  // 1/l for the output, 0 for a row that saw no key (its output is 0, never NaN).  A NaN score
  // (a NaN in q or k) leaves max alone (std::max drops it) but makes l NaN, and the comparisons
  // with 0 below let that NaN through, so such a row reads NaN, not "saw no key".
  float output_scale() const { return sum == 0.0f ? 0.0f : 1.0f / sum; }

  // LSE = ln(sum_j e^{s_j}) = (m + log2 l) * ln 2, +inf for a row that saw no key, NaN after a
  // NaN score.
  float lse() const {
    return sum == 0.0f ? std::numeric_limits<float>::infinity() : (max + std::log2(sum)) * kLn2;
  }
};

}  // namespace tileattn::cpu
