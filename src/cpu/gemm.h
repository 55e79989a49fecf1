// The tile products, through OpenBLAS's sgemm (row-major; see cmake/openblas.cmake for why the
// OpenMP build).  Named by the transposes the attention tiles need.
#pragma once

#include <cblas.h>

namespace tileattn::cpu {

// C (m x n) = beta * C + A (m x k) * B^T, B stored (n x k): S = Q K^T and dP = dO V^T.
inline void gemm_nt(int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                    float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
}

// C (m x n) = beta * C + A (m x k) * B (k x n): O += P V and dQ += dS K.
inline void gemm_nn(int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                    float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
}

// C (m x n) = beta * C + A^T * B, A stored (k x m): dV += P^T dO and dK += dS^T Q.
inline void gemm_tn(int m, int n, int k, const float* a, int lda, const float* b, int ldb,
                    float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace tileattn::cpu
