// openblas_kernels (src/cpu/openblas_core.*): OpenBLAS must not run its baseline Prescott kernels on
// a CPU with AVX2 and FMA, which it did on Emerald Rapids (a model newer than its table), 3.7x
// slower; and the reloaded kernels must still multiply correctly.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "cpu/gemm.h"
#include "cpu/openblas_core.h"

namespace {

TEST(OpenBlasCore, NoBaselineKernelsOnAnAvx2Cpu) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) GTEST_SKIP() << "no AVX2 and FMA";
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) GTEST_SKIP() << "OPENBLAS_CORETYPE is set";
  const char* kernels = tileattn::cpu::openblas_kernels();
  ASSERT_NE(kernels, nullptr);
  EXPECT_STRNE(kernels, "Prescott");
  EXPECT_EQ(std::getenv("OPENBLAS_CORETYPE"), nullptr) << "the variable is set for OpenBLAS's reload alone";
}

TEST(OpenBlasCore, TheChosenKernelsMultiply) {
  // C = A B for A (37 x 45), B (45 x 29) of small integers: exact in float32 under any kernel.
  const int m = 37, n = 29, k = 45;
  std::vector<float> a(m * k), b(k * n), c(m * n, -1.0f);
  for (int i = 0; i < m * k; ++i) a[i] = static_cast<float>(i % 7 - 3);
  for (int i = 0; i < k * n; ++i) b[i] = static_cast<float>(i % 5 - 2);
  tileattn::cpu::gemm_nn(m, n, k, {a.data(), k}, {b.data(), n}, 0.0f, c.data(), n);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      float expected = 0.0f;
      for (int l = 0; l < k; ++l) expected += a[i * k + l] * b[l * n + j];
      ASSERT_EQ(c[i * n + j], expected) << i << ", " << j;
    }
  }
}

}  // namespace
