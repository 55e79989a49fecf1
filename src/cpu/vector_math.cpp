#include "cpu/vector_math.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "cpu/convert.h"
#include "cpu/exp2_poly.h"
#include "cpu/target_clones.h"

namespace tileattn::cpu {
namespace {

// 2^x for x <= 128 (kExp2Poly: the polynomial and its error).  Written as straight-line float
// code so the compiler vectorizes the loops that call it.
inline float exp2_approx(float x) {
  // NaN goes to -127 here (the comparison is false), so no NaN reaches the float -> int conversion
  // below, which C++ leaves undefined for it (UBSan); the NaN comes back at the return.
  const float clamped = x >= -127.0f ? x : -127.0f;
  // Adding 1.5 * 2^23 rounds to the nearest integer in the float unit, vectorizable.
  const float magic = 12582912.0f;
  const float n = (clamped + magic) - magic;
  const float f = clamped - n;
  float p = kExp2Poly[0];
  for (int i = 1; i < 8; ++i) p = p * f + kExp2Poly[i];
  const uint32_t biased = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &biased, sizeof(two_n));
  return x < -126.0f ? 0.0f : x == x ? p * two_n : x;
}

}  // namespace

TILEATTN_CPU_CLONES
float exp2_shifted_sum(const float* x, float scale, float shift, int count, float* y) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int i = 0; i < count; ++i) {
    y[i] = exp2_approx(scale * x[i] - shift);
    sum += y[i];
  }
  return sum;
}

TILEATTN_CPU_CLONES
void exp2_shifted(const float* x, float shift, int count, float* y) {
#pragma omp simd
  for (int i = 0; i < count; ++i) y[i] = exp2_approx(x[i] - shift);
}

TILEATTN_CPU_CLONES
float row_max(const float* x, int count) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int i = 0; i < count; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

TILEATTN_CPU_CLONES
void scale_row(float* x, float factor, int count) {
#pragma omp simd
  for (int i = 0; i < count; ++i) x[i] *= factor;
}

// The bf16 conversions are integer shifts, adds and selects, which every clone vectorizes at its
// width (SSE2's 4 lanes in the baseline build, where the bf16 CPU decode spent most of its time).
TILEATTN_CPU_CLONES
void bf16_row_to_float(const uint16_t* src, int count, float* dst) {
#pragma omp simd
  for (int i = 0; i < count; ++i) dst[i] = bf16_to_float(src[i]);
}

TILEATTN_CPU_CLONES
void float_row_to_bf16(const float* src, int count, uint16_t* dst) {
#pragma omp simd
  for (int i = 0; i < count; ++i) dst[i] = float_to_bf16(src[i]);
}

// GCC 12 vectorizes no _Float16 conversion without AVX512-FP16, and the baseline build, which has
// no F16C, made each element a call to libgcc's soft conversion: 20% of an fp16 D128 forward on a
// Zen 3 host.  F16C (every x86-64 CPU with AVX2) converts 8 lanes in one instruction, rounding to
// nearest even like the cast.
#if defined(__x86_64__) && defined(__GNUC__)
namespace {

bool has_f16c() {
  static const bool f16c = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("f16c") != 0;
  }();
  return f16c;
}

__attribute__((target("avx,f16c"))) void fp16_row_to_float_f16c(const uint16_t* src, int count, float* dst) {
  int i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(half));
  }
  for (; i < count; ++i) dst[i] = fp16_to_float(src[i]);
}

__attribute__((target("avx,f16c"))) void float_row_to_fp16_f16c(const float* src, int count, uint16_t* dst) {
  int i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i half = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), half);
  }
  for (; i < count; ++i) dst[i] = float_to_fp16(src[i]);
}

}  // namespace
#endif

void fp16_row_to_float(const uint16_t* src, int count, float* dst) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (has_f16c()) return fp16_row_to_float_f16c(src, count, dst);
#endif
  for (int i = 0; i < count; ++i) dst[i] = fp16_to_float(src[i]);
}

void float_row_to_fp16(const float* src, int count, uint16_t* dst) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (has_f16c()) return float_row_to_fp16_f16c(src, count, dst);
#endif
  for (int i = 0; i < count; ++i) dst[i] = float_to_fp16(src[i]);
}

}  // namespace tileattn::cpu
