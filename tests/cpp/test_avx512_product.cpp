// The AVX-512 float32 products (cpu/avx512_product.*) against float64 sums, at sizes that leave a
// partial row block (6 rows), a partial 16-float vector and a partial 64-column panel, with A read
// by rows and transposed (the backward's P^T and dS^T), with and without accumulating into C; C's
// entries past n columns must stay as they were.  Skipped on CPUs without AVX-512F; the
// TILEATTN_CPU_AVX512 switch is checked everywhere.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "cpu/avx512_product.h"
#include "tileattn/tileattn.hpp"

namespace tileattn::cpu {
namespace {

std::vector<float> random_floats(size_t count, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<float> values(count);
  for (float& v : values) v = normal(rng);
  return values;
}

struct Shape {
  int m, n, k;
};

TEST(Avx512Product, MatchesFloat64Sums) {
  if (!avx512::enabled()) GTEST_SKIP() << "no AVX-512F on this CPU";
  std::mt19937 rng(7);
  const float sentinel = 1234.5f;
  for (const Shape s : {Shape{1, 1, 1}, Shape{7, 17, 3}, Shape{6, 64, 128}, Shape{13, 65, 33}, Shape{128, 130, 256},
                        Shape{256, 128, 64}, Shape{5, 15, 1000}}) {
    for (const bool transposed_a : {false, true}) {
      for (const bool accumulate : {false, true}) {
        SCOPED_TRACE(testing::Message() << "m=" << s.m << " n=" << s.n << " k=" << s.k << " A^T=" << transposed_a
                                        << " accumulate=" << accumulate);
        const int64_t ldb = avx512::padded_ld(s.n), ldc = s.n + 5;
        const std::vector<float> a = random_floats(static_cast<size_t>(s.m) * s.k, rng);
        const std::vector<float> b = random_floats(static_cast<size_t>(s.k) * ldb, rng);
        std::vector<float> c = random_floats(static_cast<size_t>(s.m) * ldc, rng);
        for (int i = 0; i < s.m; ++i) {
          for (int j = s.n; j < ldc; ++j) c[i * ldc + j] = sentinel;
        }
        const std::vector<float> c0 = c;
        // A (m x k) stored as rows, or as its transpose (k x m rows), as the backward reads P^T.
        const avx512::StridedOperand a_op = transposed_a ? avx512::StridedOperand{a.data(), 1, s.m}
                                                         : avx512::StridedOperand{a.data(), s.k, 1};
        avx512::product(s.m, s.n, s.k, a_op, b.data(), ldb, c.data(), ldc, accumulate);
        for (int i = 0; i < s.m; ++i) {
          for (int j = 0; j < ldc; ++j) {
            if (j >= s.n) {
              ASSERT_EQ(c[i * ldc + j], sentinel) << "wrote past n at (" << i << ", " << j << ")";
              continue;
            }
            double sum = accumulate ? c0[i * ldc + j] : 0.0, magnitude = std::fabs(sum);
            for (int l = 0; l < s.k; ++l) {
              const double x = a_op.data[i * a_op.row + l * a_op.depth];
              sum += x * b[l * ldb + j];
              magnitude += std::fabs(x * b[l * ldb + j]);
            }
            // float32 sums of k terms: at most ~k ulps of the magnitude (k <= 1000: 6e-5 relative).
            ASSERT_NEAR(c[i * ldc + j], sum, 1e-7 * s.k * magnitude + 1e-6) << "at (" << i << ", " << j << ")";
          }
        }
      }
    }
  }
}

TEST(Avx512Product, TransposeMatchesAndStopsAtColumns) {
  if (!avx512::enabled()) GTEST_SKIP() << "no AVX-512F on this CPU";
  std::mt19937 rng(11);
  for (const Shape s : {Shape{1, 1, 0}, Shape{17, 3, 0}, Shape{128, 128, 0}, Shape{33, 100, 0}}) {
    const int rows = s.m, cols = s.n;
    const int64_t src_ld = cols + 3, dst_ld = avx512::padded_ld(rows);
    const std::vector<float> src = random_floats(static_cast<size_t>(rows) * src_ld, rng);
    std::vector<float> dst(static_cast<size_t>(cols) * dst_ld, -7.0f);
    avx512::transpose(src.data(), src_ld, rows, cols, dst.data(), dst_ld);
    for (int c = 0; c < cols; ++c) {
      for (int r = 0; r < dst_ld; ++r) {
        ASSERT_EQ(dst[c * dst_ld + r], r < rows ? src[r * src_ld + c] : -7.0f)
            << "rows=" << rows << " at (" << c << ", " << r << ")";
      }
    }
  }
}

// Rows 2^28 floats apart (1 GiB) would overflow the gathers' 32-bit offsets; the source is mapped
// but only the touched pages are ever backed.
TEST(Avx512Product, TransposeOfRowsTooFarApartForGathers) {
  if (!avx512::enabled()) GTEST_SKIP() << "no AVX-512F on this CPU";
  const int64_t src_ld = int64_t{1} << 28;
  const int rows = 17, cols = 3;
  const size_t bytes = static_cast<size_t>((rows - 1) * src_ld + cols) * sizeof(float);
  void* mapping = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(mapping, MAP_FAILED);
  float* src = static_cast<float*>(mapping);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) src[r * src_ld + c] = static_cast<float>(r * 10 + c);
  }
  std::vector<float> dst(cols * 32, -1.0f);
  avx512::transpose(src, src_ld, rows, cols, dst.data(), 32);
  munmap(mapping, bytes);
  for (int c = 0; c < cols; ++c) {
    for (int r = 0; r < rows; ++r) ASSERT_EQ(dst[c * 32 + r], static_cast<float>(r * 10 + c)) << r << ", " << c;
  }
}

TEST(Avx512Product, PaddedRowsAreOddLineCounts) {
  for (int n : {1, 16, 17, 64, 128, 130, 256}) {
    const int64_t ld = avx512::padded_ld(n);
    EXPECT_GE(ld, n);
    EXPECT_EQ(ld % 16, 0);
    EXPECT_EQ(ld / 16 % 2, 1) << "n=" << n;
  }
}

TEST(Avx512Product, SwitchTakesAutoAndOffOnly) {
  setenv("TILEATTN_CPU_AVX512", "off", 1);
  EXPECT_FALSE(avx512::enabled());
  setenv("TILEATTN_CPU_AVX512", "yes", 1);
  try {
    avx512::enabled();
    ADD_FAILURE() << "TILEATTN_CPU_AVX512=yes was accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.argument(), "TILEATTN_CPU_AVX512");
  }
  unsetenv("TILEATTN_CPU_AVX512");
}

}  // namespace
}  // namespace tileattn::cpu
