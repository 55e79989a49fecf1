// The row conversions of vector_math.cpp (8-16 lanes, F16C for fp16) against the scalar element
// conversions of convert.h, bit for bit: every fp16 and bf16 pattern up, and down a set of floats
// with the cases rounding gets wrong (ties, the overflow edge, subnormals, NaN), at a length that
// leaves a tail after the 8-lane loop.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cpu/convert.h"
#include "cpu/vector_math.h"

namespace tileattn::cpu {
namespace {

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

float float_of(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}

// Same bits, or both NaN (F16C and the soft conversion may keep different NaN payloads).
void expect_same_float(float got, float want, size_t i) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << "element " << i;
  } else {
    EXPECT_EQ(bits_of(got), bits_of(want)) << "element " << i;
  }
}

bool half_is_nan(uint16_t h, bool bf16) {
  return bf16 ? (h & 0x7FFFu) > 0x7F80u : (h & 0x7FFFu) > 0x7C00u;
}

std::vector<float> floats_to_round() {
  std::vector<float> x = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.0f, 65520.0f, 65536.0f, 1e-8f, -6e-8f,
                          3e-5f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::denorm_min()};
  // Ties to even in both formats: 1 + 2^-11 (fp16's half ulp at 1), 1 + 3 * 2^-11, and bf16's
  // 1 + 2^-8, 1 + 3 * 2^-8.
  for (float t : {1.0f + 0x1p-11f, 1.0f + 0x3p-11f, 1.0f + 0x1p-8f, 1.0f + 0x3p-8f}) {
    x.push_back(t);
    x.push_back(-t);
  }
  std::mt19937 rng(20261204);
  std::uniform_int_distribution<uint32_t> any_bits;
  std::normal_distribution<float> normal(0.0f, 100.0f);
  while (x.size() < 20003) {  // not a multiple of 8 or 16: the rows end in a tail
    x.push_back(normal(rng));
    x.push_back(float_of(any_bits(rng)));
  }
  return x;
}

TEST(RowConversions, EveryHalfPatternToFloat) {
  std::vector<uint16_t> halves(65536 + 5);
  for (size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<uint16_t>(i);
  std::vector<float> got(halves.size());
  fp16_row_to_float(halves.data(), static_cast<int>(halves.size()), got.data());
  for (size_t i = 0; i < halves.size(); ++i) expect_same_float(got[i], fp16_to_float(halves[i]), i);
  bf16_row_to_float(halves.data(), static_cast<int>(halves.size()), got.data());
  for (size_t i = 0; i < halves.size(); ++i) expect_same_float(got[i], bf16_to_float(halves[i]), i);
}

TEST(RowConversions, FloatsRoundLikeTheScalarConversions) {
  const std::vector<float> x = floats_to_round();
  std::vector<uint16_t> fp16(x.size()), bf16(x.size());
  float_row_to_fp16(x.data(), static_cast<int>(x.size()), fp16.data());
  float_row_to_bf16(x.data(), static_cast<int>(x.size()), bf16.data());
  for (size_t i = 0; i < x.size(); ++i) {
    const uint16_t want16 = float_to_fp16(x[i]), want_bf = float_to_bf16(x[i]);
    if (half_is_nan(want16, false)) {
      EXPECT_TRUE(half_is_nan(fp16[i], false)) << "fp16 element " << i;
    } else {
      EXPECT_EQ(fp16[i], want16) << "fp16 element " << i << " = " << x[i];
    }
    if (half_is_nan(want_bf, true)) {
      EXPECT_TRUE(half_is_nan(bf16[i], true)) << "bf16 element " << i;
    } else {
      EXPECT_EQ(bf16[i], want_bf) << "bf16 element " << i << " = " << x[i];
    }
  }
}

}  // namespace
}  // namespace tileattn::cpu
