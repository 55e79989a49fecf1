// The products on AVX2 with FMA and F16C (simd_block.h's code for 8-float vectors), for x86 CPUs
// without AVX-512 (AMD Zen 2 and 3, Intel's client cores).
#include <algorithm>
#include <cstdint>
#include <limits>

#include "cpu/amx_target.h"  // TILEATTN_AMX_BUILT: x86-64 Linux GCC, immintrin.h included
#include "cpu/simd_product.h"

#if TILEATTN_AMX_BUILT
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include "cpu/simd_block.h"

namespace tileattn::cpu::simd {
namespace {

// The register block: 6 rows x 2 vectors of C in 12 of the 16 ymm registers, 2 for B and one for
// the broadcast; a depth step loads 2 B vectors and broadcasts 6 A entries for 12 FMAs.  3 x 4
// vectors (one register short) ran 0.7x, 4 x 3 0.75-0.95x (one Emerald Rapids core, AVX2 code).
struct Avx2 {
  using Vec = __m256;
  using Mask = __m256i;
  static constexpr int kLanes = 8, kRows = 6, kVectors = 2;
  static Mask mask(int count) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static Vec load(const float* p) { return _mm256_loadu_ps(p); }
  static Vec load_masked(const float* p, Mask m) { return _mm256_maskload_ps(p, m); }
  static void store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
  static void store_masked(float* p, Mask m, Vec v) { _mm256_maskstore_ps(p, m, v); }
  static Vec zero() { return _mm256_setzero_ps(); }
  static Vec broadcast(float x) { return _mm256_set1_ps(x); }
  static Vec fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  static Vec widen_bf16(const uint16_t* p) {
    const __m256i bits = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(bits, 16));
  }
  static Vec widen_fp16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static float reduce_add(Vec v) {
    const __m128 half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 pairs = _mm_add_ps(half, _mm_movehl_ps(half, half));
    return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehdup_ps(pairs)));
  }
  static Vec gather_column(const float* base, int64_t stride, Mask m) {
    const __m256i offsets = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                               _mm256_set1_epi32(static_cast<int>(stride)));
    return _mm256_mask_i32gather_ps(_mm256_setzero_ps(), base, offsets, _mm256_castsi256_ps(m), 4);
  }
};

const Kernels kAvx2{"avx2", block_code::product<Avx2>, block_code::transpose<Avx2>, block_code::few_rows_scores<Avx2>,
                    block_code::few_rows_accumulate<Avx2>};

}  // namespace

const Kernels* avx2_kernels() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          __builtin_cpu_supports("f16c");
  return has ? &kAvx2 : nullptr;
}

}  // namespace tileattn::cpu::simd
#pragma GCC pop_options

#else

namespace tileattn::cpu::simd {
const Kernels* avx2_kernels() { return nullptr; }
}  // namespace tileattn::cpu::simd

#endif
