// Naive attention for the tests: every score materialized, in float64 (the ground truth) or
// with each intermediate rounded to the storage dtype (the "naive same-precision" computation
// that FA's tolerance rule compares against).  Independent of src/cpu by construction: no tiles,
// no online softmax, natural-base exponentials.
#pragma once

#include <cstdint>
#include <vector>

#include "tileattn/tileattn.h"

namespace tileattn::test {

// One attention problem in canonical packed layout: rows of all sequences stacked,
// q[(row * H + h) * D + d] with row = cu_seqlens_q[b] + i, the same for k, v, dout.
struct Problem {
  int batch, heads, heads_k, dim;
  std::vector<int> cu_q, cu_k;  // B + 1 prefix sums of the stored lengths
  std::vector<int> used_k;      // keys used per sequence (seqused_k, or the stored length)
  double scale;
  int window_left, window_right;
  double softcap;
  std::vector<double> alibi;  // empty, or (B, H) slopes (per-head slopes repeated per batch)
  double dropout_p;
  uint64_t seed, offset;
  std::vector<double> q, k, v, dout;
};

struct Result {
  std::vector<double> out, lse;  // lse[(h * total_q) + row]
  std::vector<double> dq, dk, dv;
};

// exact: float64 throughout.  Otherwise each product and the softmax output are rounded to
// `dtype` as a framework computing in that dtype would (float32 accumulation inside products).
Result reference_attention(const Problem& p, bool exact, tileattn_dtype dtype, bool with_backward);

// The value a float64 takes once stored in dtype.
double round_to(tileattn_dtype dtype, double x);

}  // namespace tileattn::test
