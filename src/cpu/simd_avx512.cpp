// The products on AVX-512F (simd_block.h's code for 16-float vectors).
#include <algorithm>
#include <cstdint>
#include <limits>

#include "cpu/amx_target.h"  // TILEATTN_AMX_BUILT: x86-64 Linux GCC, immintrin.h included
#include "cpu/simd_product.h"

#if TILEATTN_AMX_BUILT
#pragma GCC push_options
#pragma GCC target("avx512f")
#include "cpu/simd_block.h"

namespace tileattn::cpu::simd {
namespace {

// The register block: 6 rows x 4 vectors of C in 24 of the 32 zmm registers, 4 more for B; a depth
// step loads 4 B vectors and broadcasts 6 A entries for 24 FMAs, 12 cycles on two FMA ports.  12 x
// 2 vectors ran at 40% of this on GCC 12 (it kept 12 row addresses live and spilled), 4 x 4 at
// 0.8-0.9x.
struct Avx512 {
  using Vec = __m512;
  using Mask = __mmask16;
  static constexpr int kLanes = 16, kRows = 6, kVectors = 4;
  static Mask mask(int count) { return count >= kLanes ? Mask(0xFFFF) : static_cast<Mask>((1u << count) - 1); }
  static Vec load(const float* p) { return _mm512_loadu_ps(p); }
  static Vec load_masked(const float* p, Mask m) { return _mm512_maskz_loadu_ps(m, p); }
  static void store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
  static void store_masked(float* p, Mask m, Vec v) { _mm512_mask_storeu_ps(p, m, v); }
  static Vec zero() { return _mm512_setzero_ps(); }
  static Vec broadcast(float x) { return _mm512_set1_ps(x); }
  static Vec fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  static float reduce_add(Vec v) { return _mm512_reduce_add_ps(v); }
  static Vec widen_bf16(const uint16_t* p) {
    const __m512i bits = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
  }
  static Vec widen_fp16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static Vec gather_column(const float* base, int64_t stride, Mask m) {
    const __m512i offsets = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                               _mm512_set1_epi32(static_cast<int>(stride)));
    return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, offsets, base, 4);
  }
};

const Kernels kAvx512{"avx512", block_code::product<Avx512>, block_code::transpose<Avx512>,
                      block_code::few_rows_scores<Avx512>, block_code::few_rows_accumulate<Avx512>};

}  // namespace

const Kernels* avx512_kernels() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has ? &kAvx512 : nullptr;
}

}  // namespace tileattn::cpu::simd
#pragma GCC pop_options

#else

namespace tileattn::cpu::simd {
const Kernels* avx512_kernels() { return nullptr; }
}  // namespace tileattn::cpu::simd

#endif
