// The tile products, through OpenBLAS's sgemm (see cmake/openblas.cmake for why its OpenMP
// build).  Operands are float32 rows at any row stride, so float32 tiles are read straight from
// the caller's tensors without a copy.  (Debian's OpenBLAS 0.3.21 is built without sbgemm, so
// bfloat16 and float16 tiles are converted to float32 first; see docs/perf-log.md.)
#pragma once

#include <cblas.h>

#include <cstdint>

#include "cpu/openblas_core.h"

namespace tileattn::cpu {

// A row-major float32 matrix operand whose rows are `ld` elements apart.
struct Matrix {
  const float* data;
  int64_t ld;
};

// C (m x n) = beta * C + op(A) op(B), op = transpose when the flag is set.
inline void gemm(bool trans_a, bool trans_b, int m, int n, int k, const Matrix& a, const Matrix& b,
                 float beta, float* c, int ldc) {
  openblas_kernels();  // every sgemm passes here, so OpenBLAS's kernels are settled before the first
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              m, n, k, 1.0f, a.data, static_cast<blasint>(a.ld), b.data, static_cast<blasint>(b.ld),
              beta, c, ldc);
}

// S = Q K^T and dP = dO V^T: B is stored (n x k).
inline void gemm_nt(int m, int n, int k, const Matrix& a, const Matrix& b, float beta, float* c, int ldc) {
  gemm(false, true, m, n, k, a, b, beta, c, ldc);
}
// O += P V and dQ += dS K.
inline void gemm_nn(int m, int n, int k, const Matrix& a, const Matrix& b, float beta, float* c, int ldc) {
  gemm(false, false, m, n, k, a, b, beta, c, ldc);
}
// dV += P^T dO and dK += dS^T Q: A is stored (k x m).
inline void gemm_tn(int m, int n, int k, const Matrix& a, const Matrix& b, float beta, float* c, int ldc) {
  gemm(true, false, m, n, k, a, b, beta, c, ldc);
}

}  // namespace tileattn::cpu
