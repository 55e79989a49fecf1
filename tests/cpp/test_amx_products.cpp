// The bf16 products on each engine the CPU offers (AMX's tiles, cpu/amx_bf16.*; AVX512-BF16's dot
// products, cpu/bf16_dot_product.*) and their packing against float64 sums of the same bf16-rounded
// operands, at sizes that leave partial tiles in every dimension, for both B layouts the forward and
// backward use (M^T for S = Q K^T, M for O += P V), with and without accumulating into C.  Skipped
// on CPUs with neither; the TILEATTN_CPU_AMX switch is checked everywhere.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "cpu/amx_bf16.h"
#include "cpu/convert.h"
#include "cpu/vector_math.h"
#include "tileattn/tileattn.hpp"

namespace tileattn::cpu {
namespace {

using amx::round_up;

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }

 private:
  const char* name_;
};

// The engine TILEATTN_CPU_AMX=`value` takes, or kNone where it raises (the CPU lacks it).
amx::Engine engine_with(const char* value) {
  ScopedEnv env("TILEATTN_CPU_AMX", value);
  try {
    return amx::engine();
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "TILEATTN_CPU_AMX");
    return amx::Engine::kNone;
  }
}

std::vector<amx::Engine> engines_present() {
  std::vector<amx::Engine> engines;
  for (const char* value : {"on", "dot"}) {
    const amx::Engine engine = engine_with(value);
    if (engine != amx::Engine::kNone) engines.push_back(engine);
  }
  return engines;
}

std::vector<float> random_floats(size_t count, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> values(count);
  for (float& v : values) v = normal(rng);
  return values;
}

double rounded(float x) { return bf16_to_float(float_to_bf16(x)); }

struct Shape {
  int m, n, depth;
};

// C = [C0 +] A^(T) B^(T): A from a matrix (depth x m when a_transposed, else m x depth), B from one
// (n x depth when transposed, else depth x n).
void check_product(amx::Engine engine, const Shape& s, bool a_transposed, bool transposed, bool accumulate,
                   std::mt19937& rng) {
  const int m_pad = round_up(s.m, amx::kRowsPerTile), n_pad = round_up(s.n, amx::kColsPerTile);
  const int depth_pad = round_up(s.depth, amx::kDepthPerStep);
  const int a_ld = (a_transposed ? s.m : s.depth) + 3, b_ld = (transposed ? s.depth : s.n) + 5;  // not packed widths
  const std::vector<float> a = random_floats(static_cast<size_t>(a_transposed ? s.depth : s.m) * a_ld, rng);
  const std::vector<float> b = random_floats(static_cast<size_t>(transposed ? s.n : s.depth) * b_ld, rng);
  auto a_at = [&](int i, int k) { return a_transposed ? a[static_cast<size_t>(k) * a_ld + i] : a[static_cast<size_t>(i) * a_ld + k]; };
  auto b_at = [&](int k, int j) { return transposed ? b[static_cast<size_t>(j) * b_ld + k] : b[static_cast<size_t>(k) * b_ld + j]; };

  const int a_packed_ld = depth_pad + 32;  // rows further apart than they are long
  std::vector<uint16_t> a_packed(static_cast<size_t>(m_pad) * a_packed_ld, 0xFFFF);  // NaN until packed
  std::vector<uint16_t> b_packed(static_cast<size_t>(depth_pad) * n_pad, 0xFFFF);
  if (a_transposed) {
    amx::pack_rows_transposed(a.data(), a_ld, s.depth, s.m, m_pad, depth_pad, a_packed.data(), a_packed_ld);
  } else {
    amx::pack_rows(a.data(), a_ld, s.m, s.depth, m_pad, depth_pad, a_packed.data(), a_packed_ld);
  }
  if (transposed) {
    amx::pack_pairs_transposed(b.data(), b_ld, s.n, s.depth, n_pad, depth_pad, b_packed.data());
  } else {
    amx::pack_pairs(b.data(), b_ld, s.depth, s.n, depth_pad, n_pad, b_packed.data());
  }
  const int ldc = n_pad + 16;
  std::vector<float> c = random_floats(static_cast<size_t>(m_pad) * ldc, rng);
  const std::vector<float> c0 = c;
  amx::product(engine, m_pad, n_pad, depth_pad, {a_packed.data(), a_packed_ld}, {b_packed.data(), 2 * n_pad}, c.data(),
               ldc, accumulate);

  for (int i = 0; i < m_pad; ++i) {
    for (int j = 0; j < ldc; ++j) {
      const size_t at = static_cast<size_t>(i) * ldc + j;
      if (j >= n_pad) {
        ASSERT_EQ(c[at], c0[at]) << "wrote past n at (" << i << ", " << j << ")";
        continue;
      }
      double want = accumulate ? c0[at] : 0.0, magnitude = std::fabs(want);
      if (i < s.m && j < s.n) {
        for (int k = 0; k < s.depth; ++k) {
          const double term = rounded(a_at(i, k)) * rounded(b_at(k, j));
          want += term;
          magnitude += std::fabs(term);
        }
      }
      // float32 sums of exact products: at most depth roundings of the running sum.
      const double tolerance = (s.depth + 2) * 0x1p-24 * magnitude + 1e-30;
      ASSERT_NEAR(c[at], want, tolerance)
          << (engine == amx::Engine::kDot ? "dot" : "tiles") << " m " << s.m << " n " << s.n << " depth " << s.depth
          << " at (" << i << ", " << j << ")" << (a_transposed ? " A^T" : "") << (transposed ? " B^T" : "");
    }
  }
}

TEST(AmxProducts, MatchFloat64SumsOfBf16Operands) {
  const std::vector<amx::Engine> engines = engines_present();
  if (engines.empty()) GTEST_SKIP() << "neither AMX-BF16 nor AVX512-BF16 on this CPU/OS";
  std::mt19937 rng(20261205);
  // n 64, 96, 112 (and 80 above): the dot kernel's column panels of 4 vectors with 0, 2, 3 (and 1) left
  // over.
  for (amx::Engine engine : engines) {
    for (const Shape& s : {Shape{1, 1, 1}, Shape{16, 16, 32}, Shape{17, 33, 47}, Shape{256, 128, 128},
                           Shape{200, 72, 72}, Shape{31, 256, 256}, Shape{48, 16, 200}, Shape{20, 64, 64},
                           Shape{33, 96, 80}, Shape{16, 112, 40}}) {
      for (bool a_transposed : {false, true}) {
        for (bool transposed : {true, false}) {
          for (bool accumulate : {false, true}) check_product(engine, s, a_transposed, transposed, accumulate, rng);
        }
      }
    }
  }
}

TEST(AmxProducts, PackingZeroesThePadding) {
  // Padding must be 0, not just finite: the padded P columns meet V rows that hold real keys.
  if (!amx::enabled()) GTEST_SKIP() << "neither AMX-BF16 nor AVX512-BF16 on this CPU/OS";
  const float nan = std::nanf("");
  std::vector<float> src(4 * 4, nan);
  std::vector<uint16_t> out(64 * 32, 0x7FC0);
  amx::pack_rows(src.data(), 4, 0, 4, 16, 32, out.data(), 32);
  for (uint16_t v : std::vector<uint16_t>(out.begin(), out.begin() + 16 * 32)) ASSERT_EQ(v, 0);
  amx::pack_pairs(src.data(), 4, 3, 2, 32, 16, out.data());
  for (int t = 0; t < 16; ++t) {
    for (int e = 0; e < 32; ++e) {
      const uint16_t v = out[t * 32 + e];
      const bool real = t < 2 && e < 4 && (t * 2 + e % 2) < 3;
      ASSERT_EQ(v != 0, real) << "pair row " << t << " element " << e;
    }
  }
}

TEST(AmxProducts, Exp2RowMatchesTheGenericExp2) {
  // P for the AMX path (AVX-512, FMA) against exp2_shifted_sum (the generic loops) rounded to
  // bf16: within one bf16 step (the two round differently in float's last bit), the same sum to
  // float rounding, 0 for -inf and below -126, NaN kept, zeros in the padding.
  if (!amx::enabled()) GTEST_SKIP() << "neither AMX-BF16 nor AVX512-BF16 on this CPU/OS";
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> spread(-140.0f, 3.0f);
  for (int count : {1, 15, 16, 17, 100, 128}) {
    std::vector<float> x(count), generic(count);
    for (float& v : x) v = spread(rng);
    x[0] = -std::numeric_limits<float>::infinity();
    if (count > 2) x[count / 2] = std::nanf("");
    const int padded = round_up(count, amx::kDepthPerStep);
    std::vector<uint16_t> packed(padded, 0x7FC0);
    const float shift = 0.75f;
    const float sum = amx::exp2_row_to_bf16(x.data(), 1.0f, shift, count, padded, packed.data());
    const float generic_sum = exp2_shifted_sum(x.data(), 1.0f, shift, count, generic.data());
    if (count > 2) {
      EXPECT_TRUE(std::isnan(sum));
    } else {
      EXPECT_NEAR(sum, generic_sum, 1e-6 * std::fabs(generic_sum));
    }
    for (int i = 0; i < padded; ++i) {
      if (i >= count) {
        ASSERT_EQ(packed[i], 0) << "padding at " << i;
      } else if (std::isnan(generic[i])) {
        ASSERT_TRUE(std::isnan(bf16_to_float(packed[i]))) << "NaN lost at " << i;
      } else if (generic[i] == 0.0f) {
        ASSERT_EQ(packed[i], 0) << "x " << x[i];
      } else {
        const int step = std::abs(static_cast<int>(packed[i]) - static_cast<int>(float_to_bf16(generic[i])));
        ASSERT_LE(step, 1) << "x " << x[i] << ": " << bf16_to_float(packed[i]) << " vs " << generic[i];
      }
    }
  }
}

TEST(AmxProducts, PackingBf16RowsGivesTheBitsOfTheirFloat32Values) {
  // The backward packs K and V tiles from their bf16 rows: the same bits as packing the rows
  // widened to float32 (rounding a bf16 value is exact), zeros in the padding, and nothing read
  // past `cols` rows or `depth` elements (NaN there), at widths that end inside a 32-word step.
  if (!amx::enabled()) GTEST_SKIP() << "neither AMX-BF16 nor AVX512-BF16 on this CPU/OS";
  std::mt19937 rng(73);
  for (const auto& [rows, width] : {std::pair{1, 1}, std::pair{17, 40}, std::pair{128, 128}, std::pair{100, 72},
                                    std::pair{33, 256}, std::pair{5, 16}}) {
    const int ld = width + 9;
    std::vector<uint16_t> bits(static_cast<size_t>(rows + 1) * ld, 0x7FC0);  // NaN outside the rows x width
    std::vector<float> widened(bits.size(), std::nanf(""));
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < width; ++c) {
        bits[static_cast<size_t>(r) * ld + c] = float_to_bf16(random_floats(1, rng)[0]);
        widened[static_cast<size_t>(r) * ld + c] = bf16_to_float(bits[static_cast<size_t>(r) * ld + c]);
      }
    }
    // M^T (cols = rows of M, depth = its width) and M (depth = rows of M, cols = its width).
    const int t_cols = round_up(rows, amx::kColsPerTile), t_depth = round_up(width, amx::kDepthPerStep);
    std::vector<uint16_t> from_bits(static_cast<size_t>(t_cols) * t_depth, 1), from_floats(from_bits.size(), 2);
    amx::pack_pairs_transposed(bits.data(), int64_t{ld}, rows, width, t_cols, t_depth, from_bits.data());
    amx::pack_pairs_transposed(widened.data(), ld, rows, width, t_cols, t_depth, from_floats.data());
    ASSERT_EQ(from_bits, from_floats) << rows << " x " << width << " transposed";
    const int p_depth = round_up(rows, amx::kDepthPerStep), p_cols = round_up(width, amx::kColsPerTile);
    from_bits.assign(static_cast<size_t>(p_depth) * p_cols, 1);
    from_floats.assign(from_bits.size(), 2);
    amx::pack_pairs(bits.data(), int64_t{ld}, rows, width, p_depth, p_cols, from_bits.data());
    amx::pack_pairs(widened.data(), ld, rows, width, p_depth, p_cols, from_floats.data());
    ASSERT_EQ(from_bits, from_floats) << rows << " x " << width;
  }
}

// Whether two bf16 values are within one step of each other (both NaN counts as equal).
bool within_one_bf16_step(uint16_t a, uint16_t b) {
  if (std::isnan(bf16_to_float(a)) || std::isnan(bf16_to_float(b))) {
    return std::isnan(bf16_to_float(a)) && std::isnan(bf16_to_float(b));
  }
  return std::abs(static_cast<int>(a) - static_cast<int>(b)) <= 1;
}

TEST(AmxProducts, BackwardOperandsMatchTheSeparateLoops) {
  // One pass (backward_operands) against the loops it replaces: exp2_shifted, dS = P o (dP - D)
  // (times tanh'), then pack_pairs of P and dS and pack_rows of dS.  Within one bf16 step (its
  // exp2 is the degree-4 polynomial), zeros in all the padding, nothing read past the columns
  // (NaN there), -inf scores to 0.
  if (!amx::enabled()) GTEST_SKIP() << "neither AMX-BF16 nor AVX512-BF16 on this CPU/OS";
  constexpr int kLd = 256;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> spread(-30.0f, 2.0f);
  for (int rows : {1, 16, 17, 33, 128}) {
    for (int cols : {1, 15, 17, 100, 256}) {
      for (bool softcap : {false, true}) {
        const float nan = std::nanf("");
        std::vector<float> scores(rows * kLd, nan), dprobs(rows * kLd, nan), dtanh(rows * kLd, nan);
        std::vector<float> lse(rows), delta(rows);
        for (int r = 0; r < rows; ++r) {
          lse[r] = spread(rng) + 20.0f;
          delta[r] = spread(rng) / 10.0f;
          for (int c = 0; c < cols; ++c) {
            scores[r * kLd + c] = (r + c) % 11 == 3 ? -std::numeric_limits<float>::infinity() : spread(rng) + 20.0f;
            dprobs[r * kLd + c] = spread(rng) / 10.0f;
            dtanh[r * kLd + c] = 1.0f + spread(rng) / 40.0f;
          }
        }
        // The separate loops, on float32 P and dS.
        std::vector<float> p(rows * kLd, 0.0f), ds(rows * kLd, 0.0f);
        for (int r = 0; r < rows; ++r) {
          exp2_shifted(scores.data() + r * kLd, lse[r], cols, p.data() + r * kLd);
          for (int c = 0; c < cols; ++c) {
            ds[r * kLd + c] = p[r * kLd + c] * (dprobs[r * kLd + c] - delta[r]) * (softcap ? dtanh[r * kLd + c] : 1.0f);
          }
        }
        const int rows_deep = round_up(rows, amx::kDepthPerStep), rows_tall = round_up(rows, amx::kRowsPerTile);
        const int cols_wide = round_up(cols, amx::kColsPerTile), cols_deep = round_up(cols, amx::kDepthPerStep);
        const size_t pairs_size = static_cast<size_t>(rows_deep) * cols_wide;
        std::vector<uint16_t> p_ref(pairs_size), ds_ref(pairs_size), rows_ref(rows_tall * kLd, 0);
        amx::pack_pairs(p.data(), kLd, rows, cols, rows_deep, cols_wide, p_ref.data());
        amx::pack_pairs(ds.data(), kLd, rows, cols, rows_deep, cols_wide, ds_ref.data());
        amx::pack_rows(ds.data(), kLd, rows, cols, rows_tall, cols_deep, rows_ref.data(), kLd);

        std::vector<uint16_t> p_out(pairs_size, 0x7FC0), ds_out(pairs_size, 0x7FC0), rows_out(rows_tall * kLd, 0x7FC0);
        amx::backward_operands(scores.data(), dprobs.data(), softcap ? dtanh.data() : nullptr, kLd, lse.data(),
                               delta.data(), rows, cols, p_out.data(), ds_out.data(), rows_out.data(), kLd);
        for (size_t i = 0; i < pairs_size; ++i) {
          ASSERT_TRUE(within_one_bf16_step(p_out[i], p_ref[i]))
              << rows << " x " << cols << " P pair element " << i << ": " << bf16_to_float(p_out[i]) << " vs "
              << bf16_to_float(p_ref[i]);
          ASSERT_TRUE(within_one_bf16_step(ds_out[i], ds_ref[i]))
              << rows << " x " << cols << " dS pair element " << i << ": " << bf16_to_float(ds_out[i]) << " vs "
              << bf16_to_float(ds_ref[i]);
        }
        for (int r = 0; r < rows_tall; ++r) {
          for (int c = 0; c < cols_deep; ++c) {
            ASSERT_TRUE(within_one_bf16_step(rows_out[r * kLd + c], rows_ref[r * kLd + c]))
                << rows << " x " << cols << " dS row " << r << " column " << c;
          }
        }
      }
    }
  }
}

TEST(AmxProducts, SwitchReadsTheEnvironment) {
  {
    ScopedEnv off("TILEATTN_CPU_AMX", "off");
    EXPECT_FALSE(amx::enabled());
  }
  {
    ScopedEnv bad("TILEATTN_CPU_AMX", "yes");
    EXPECT_THROW(amx::enabled(), Error);
  }
  // on and dot take their engine or raise naming the variable (engine_with checks the name); auto
  // prefers the tiles, then the dot products.
  const amx::Engine tiles = engine_with("on"), dot = engine_with("dot");
  EXPECT_TRUE(tiles == amx::Engine::kNone || tiles == amx::Engine::kTiles);
  EXPECT_TRUE(dot == amx::Engine::kNone || dot == amx::Engine::kDot);
  EXPECT_EQ(engine_with("auto"), tiles != amx::Engine::kNone ? tiles : dot);
}

}  // namespace
}  // namespace tileattn::cpu
