// The SIMD float32 products (cpu/simd_product.*), AVX-512 and AVX2 each, against float64 sums, at
// sizes that leave a partial row block (6 rows), a partial vector (16 or 8 floats) and a partial
// column panel, with A read by rows and transposed (the backward's P^T and dS^T), with and without
// accumulating into C; C's entries past n columns must stay as they were.  An instruction set the
// CPU lacks is skipped; the TILEATTN_CPU_SIMD switch is checked everywhere.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cpu/convert.h"
#include "cpu/simd_product.h"
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

class SimdProduct : public testing::TestWithParam<const char*> {
 protected:
  // The kernels under test, or null (then the test skips).
  const simd::Kernels* kernels() const {
    return std::string(GetParam()) == "avx512" ? simd::avx512_kernels() : simd::avx2_kernels();
  }
};

TEST_P(SimdProduct, MatchesFloat64Sums) {
  const simd::Kernels* simd = kernels();
  if (simd == nullptr) GTEST_SKIP() << "this CPU lacks " << GetParam();
  std::mt19937 rng(7);
  const float sentinel = 1234.5f;
  for (const Shape s : {Shape{1, 1, 1}, Shape{7, 17, 3}, Shape{6, 64, 128}, Shape{13, 65, 33}, Shape{128, 130, 256},
                        Shape{256, 128, 64}, Shape{5, 15, 1000}}) {
    for (const bool transposed_a : {false, true}) {
      for (const bool accumulate : {false, true}) {
        SCOPED_TRACE(testing::Message() << "m=" << s.m << " n=" << s.n << " k=" << s.k << " A^T=" << transposed_a
                                        << " accumulate=" << accumulate);
        const int64_t ldb = simd::padded_ld(s.n), ldc = s.n + 5;
        const std::vector<float> a = random_floats(static_cast<size_t>(s.m) * s.k, rng);
        const std::vector<float> b = random_floats(static_cast<size_t>(s.k) * ldb, rng);
        std::vector<float> c = random_floats(static_cast<size_t>(s.m) * ldc, rng);
        for (int i = 0; i < s.m; ++i) {
          for (int j = s.n; j < ldc; ++j) c[i * ldc + j] = sentinel;
        }
        const std::vector<float> c0 = c;
        // A (m x k) stored as rows, or as its transpose (k x m rows), as the backward reads P^T.
        const simd::StridedOperand a_op = transposed_a ? simd::StridedOperand{a.data(), 1, s.m}
                                                         : simd::StridedOperand{a.data(), s.k, 1};
        simd->product(s.m, s.n, s.k, a_op, b.data(), ldb, c.data(), ldc, accumulate);
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

TEST_P(SimdProduct, TransposeMatchesAndStopsAtColumns) {
  const simd::Kernels* simd = kernels();
  if (simd == nullptr) GTEST_SKIP() << "this CPU lacks " << GetParam();
  std::mt19937 rng(11);
  for (const Shape s : {Shape{1, 1, 0}, Shape{17, 3, 0}, Shape{128, 128, 0}, Shape{33, 100, 0}}) {
    const int rows = s.m, cols = s.n;
    const int64_t src_ld = cols + 3, dst_ld = simd::padded_ld(rows);
    const std::vector<float> src = random_floats(static_cast<size_t>(rows) * src_ld, rng);
    std::vector<float> dst(static_cast<size_t>(cols) * dst_ld, -7.0f);
    simd->transpose(src.data(), src_ld, rows, cols, dst.data(), dst_ld);
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
TEST_P(SimdProduct, TransposeOfRowsTooFarApartForGathers) {
  const simd::Kernels* simd = kernels();
  if (simd == nullptr) GTEST_SKIP() << "this CPU lacks " << GetParam();
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
  simd->transpose(src, src_ld, rows, cols, dst.data(), 32);
  munmap(mapping, bytes);
  for (int c = 0; c < cols; ++c) {
    for (int r = 0; r < rows; ++r) ASSERT_EQ(dst[c * 32 + r], static_cast<float>(r * 10 + c)) << r << ", " << c;
  }
}

// The few-row kernels of a decode step: S = Q K^T and O += P V for 1-9 query rows (a partial chunk
// of 4), head dims with a partial vector, K and V rows of float32, bf16 and fp16 far apart (a cache's
// head stride) and in shuffled order (pages), each reached through its address, rows listed past
// the last column requested but not used, and S's and O's entries past their rows and columns left
// as they were.
TEST_P(SimdProduct, FewRowKernelsMatchFloat64Sums) {
  constexpr int kListedPast = simd::kFewRowsAhead;
  const simd::Kernels* simd = kernels();
  if (simd == nullptr) GTEST_SKIP() << "this CPU lacks " << GetParam();
  std::mt19937 rng(5);
  const float sentinel = -99.0f;
  for (const tileattn_dtype dtype : {TILEATTN_FLOAT32, TILEATTN_BFLOAT16, TILEATTN_FLOAT16}) {
    for (const int rows : {1, 4, 5, 9}) {
      for (const int cols : {1, 17, 128}) {
        for (const int dim : {8, 72, 128, 256}) {
          SCOPED_TRACE(testing::Message() << "dtype=" << dtype << " rows=" << rows << " cols=" << cols << " dim=" << dim);
          const int64_t ldq = dim + 3, ldk = 4 * dim + 16, lds = cols + 2, ldo = dim + 5;
          const std::vector<float> q = random_floats(static_cast<size_t>(rows) * ldq, rng);
          // K and V in the element type, and the floats they hold (the reference's operands); the
          // kernels' lists also hold kListedPast rows of NaN past cols, only to be requested.
          const int listed = cols + kListedPast;
          std::vector<float> k = random_floats(static_cast<size_t>(listed) * ldk, rng);
          std::vector<float> v = random_floats(static_cast<size_t>(listed) * ldk, rng);
          std::fill(k.begin() + cols * ldk, k.end(), std::nanf(""));
          std::fill(v.begin() + cols * ldk, v.end(), std::nanf(""));
          std::vector<uint16_t> k16(k.size()), v16(v.size());
          if (dtype != TILEATTN_FLOAT32) {
            for (size_t i = 0; i < k.size(); ++i) {
              const bool bf16 = dtype == TILEATTN_BFLOAT16;
              k16[i] = bf16 ? float_to_bf16(k[i]) : float_to_fp16(k[i]);
              v16[i] = bf16 ? float_to_bf16(v[i]) : float_to_fp16(v[i]);
              k[i] = bf16 ? bf16_to_float(k16[i]) : fp16_to_float(k16[i]);
              v[i] = bf16 ? bf16_to_float(v16[i]) : fp16_to_float(v16[i]);
            }
          }
          // Key c's K and V rows are stored rows at[c] of k and v.
          std::vector<int> at(listed);
          std::iota(at.begin(), at.end(), 0);
          std::shuffle(at.begin(), at.begin() + cols, rng);
          std::vector<const void*> k_rows(listed), v_rows(listed);
          for (int c = 0; c < listed; ++c) {
            const int64_t offset = at[c] * ldk;
            k_rows[c] = dtype == TILEATTN_FLOAT32 ? static_cast<const void*>(k.data() + offset) : k16.data() + offset;
            v_rows[c] = dtype == TILEATTN_FLOAT32 ? static_cast<const void*>(v.data() + offset) : v16.data() + offset;
          }
          std::vector<float> s(static_cast<size_t>(rows + 1) * lds, sentinel);
          simd->few_rows_scores(rows, cols, listed, dim, q.data(), ldq, k_rows.data(), dtype, s.data(), lds);
          std::vector<float> o = random_floats(static_cast<size_t>(rows + 1) * ldo, rng);
          for (int r = 0; r <= rows; ++r) {
            for (int d = 0; d < ldo; ++d) {
              if (r == rows || d >= dim) o[r * ldo + d] = sentinel;
            }
          }
          const std::vector<float> o0 = o;
          simd->few_rows_accumulate(rows, cols, listed, dim, s.data(), lds, v_rows.data(), dtype, o.data(), ldo);
          for (int r = 0; r <= rows; ++r) {
            for (int c = 0; c < lds; ++c) {
              if (r == rows || c >= cols) {
                ASSERT_EQ(s[r * lds + c], sentinel) << "S written at (" << r << ", " << c << ")";
                continue;
              }
              double sum = 0.0, magnitude = 0.0;
              for (int d = 0; d < dim; ++d) {
                sum += static_cast<double>(q[r * ldq + d]) * k[at[c] * ldk + d];
                magnitude += std::fabs(static_cast<double>(q[r * ldq + d]) * k[at[c] * ldk + d]);
              }
              ASSERT_NEAR(s[r * lds + c], sum, 1e-7 * dim * magnitude + 1e-6) << "S at (" << r << ", " << c << ")";
            }
            for (int d = 0; d < ldo; ++d) {
              if (r == rows || d >= dim) {
                ASSERT_EQ(o[r * ldo + d], sentinel) << "O written at (" << r << ", " << d << ")";
                continue;
              }
              double sum = o0[r * ldo + d], magnitude = std::fabs(sum);
              for (int c = 0; c < cols; ++c) {
                sum += static_cast<double>(s[r * lds + c]) * v[at[c] * ldk + d];
                magnitude += std::fabs(static_cast<double>(s[r * lds + c]) * v[at[c] * ldk + d]);
              }
              ASSERT_NEAR(o[r * ldo + d], sum, 1e-7 * cols * magnitude + 1e-6) << "O at (" << r << ", " << d << ")";
            }
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(InstructionSets, SimdProduct, testing::Values("avx512", "avx2"));

TEST(SimdProductLayout, PaddedRowsAreOddLineCounts) {
  for (int n : {1, 16, 17, 64, 128, 130, 256}) {
    const int64_t ld = simd::padded_ld(n);
    EXPECT_GE(ld, n);
    EXPECT_EQ(ld % 16, 0);
    EXPECT_EQ(ld / 16 % 2, 1) << "n=" << n;
  }
}

TEST(SimdProductSwitch, TakesAutoAvx2AndOffOnly) {
  setenv("TILEATTN_CPU_SIMD", "off", 1);
  EXPECT_EQ(simd::kernels(), nullptr);
  setenv("TILEATTN_CPU_SIMD", "avx2", 1);
  if (simd::avx2_kernels() != nullptr) EXPECT_EQ(simd::kernels(), simd::avx2_kernels());
  unsetenv("TILEATTN_CPU_SIMD");
  const simd::Kernels* best = simd::avx512_kernels() != nullptr ? simd::avx512_kernels() : simd::avx2_kernels();
  EXPECT_EQ(simd::kernels(), best);
  setenv("TILEATTN_CPU_SIMD", "avx512", 1);  // auto picks it; not a value
  try {
    simd::kernels();
    ADD_FAILURE() << "TILEATTN_CPU_SIMD=avx512 was accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.argument(), "TILEATTN_CPU_SIMD");
  }
  unsetenv("TILEATTN_CPU_SIMD");
}

}  // namespace
}  // namespace tileattn::cpu
