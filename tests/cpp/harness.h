// Builds a random attention problem, runs tileattn's CPU backend on it through the public C++
// API, and measures errors against the float64 and naive same-precision references.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reference.h"
#include "tileattn/tileattn.hpp"

namespace tileattn::test {

enum class Alibi { kNone, kPerHead, kPerBatchHead };

struct Case {
  std::string name;
  tileattn_dtype dtype = TILEATTN_FLOAT32;
  int batch = 1, seqlen_q = 17, seqlen_k = 17, heads = 2, heads_k = 2, dim = 64;
  std::vector<int> varlen_q, varlen_k;  // non-empty: varlen form with these lengths
  bool seqused_k = false;               // pass seqused_k (random, <= each length)
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.0f, dropout_p = 0.0f, scale = 0.0f;
  Alibi alibi = Alibi::kNone;
  bool strided = false;  // padded rows and heads, k/v heads-major: exercises every stride
  bool backward = true;
  bool probs = false;    // also ask for attn_probs (B, H, Sq, Sk)
  int num_threads = 0;
};

// Max |x - ref| over all elements, where equal infinities count as 0 and NaN as +inf.
double max_error(const std::vector<double>& x, const std::vector<double>& ref);

struct Errors {
  double ours, naive, floor;
  bool ok() const { return ours <= 2.0 * naive + floor; }
};

struct Outcome {
  Errors out, lse, dq, dk, dv;
  Result ours;  // canonical layout, for extra checks
  std::vector<float> probs;  // (B, H, Sq, Sk) when Case::probs
  Problem problem;
};

// Runs forward (and backward) once, on fresh random inputs drawn from `seed`.
Outcome run_case(const Case& c, uint64_t seed);

// The bits of dq, dk, dv from one backward run, for determinism checks.
std::vector<uint8_t> backward_bits(const Case& c, uint64_t seed);

}  // namespace tileattn::test
