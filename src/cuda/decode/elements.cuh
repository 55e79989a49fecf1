// The 16-bit element types of the decode kernels (__half, __nv_bfloat16): conversions, packing of
// two values into one 32-bit mma operand register, 16-byte loads, and mma.sync m16n8k16.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

namespace tileattn::cuda::decode {

template <typename T>
__device__ __forceinline__ float to_float(T x) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half2float(x);
  } else {
    return __bfloat162float(x);
  }
}

template <typename T>
__device__ __forceinline__ T from_float(float x) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(x);
  } else {
    return __float2bfloat16_rn(x);
  }
}

// lo in bits 0..15, hi in bits 16..31: the order mma.sync expects for two consecutive k.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t bits;
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 v = __floats2half2_rn(lo, hi);
    bits = *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    bits = *reinterpret_cast<const uint32_t*>(&v);
  }
  return bits;
}

// Two quiet NaNs: what a K/V vector of an out-of-range page reads as, so the output shows it.
template <typename T>
constexpr uint32_t kNanPair = std::is_same_v<T, __half> ? 0x7E007E00u : 0x7FC07FC0u;

// Eight elements at row[dim0 ..], zero past head_dim or when !valid.  One 16-byte load when the
// caller's layout allows it (`vector`: 16-byte aligned base and strides, checked on the host),
// else element by element.
template <typename T>
__device__ __forceinline__ uint4 load8(const T* row, int dim0, int head_dim, bool vector, bool valid) {
  uint4 v = make_uint4(0, 0, 0, 0);
  if (!valid) return v;
  if (vector && dim0 + 8 <= head_dim) return __ldg(reinterpret_cast<const uint4*>(row + dim0));
  T e[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) e[i] = dim0 + i < head_dim ? row[dim0 + i] : from_float<T>(0.0f);
  return *reinterpret_cast<const uint4*>(e);
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// c += a b for one m16n8k16 tile, float accumulators.  Fragment ownership (PTX ISA, "Matrix
// Fragments for mma.m16n8k16"), with g = lane / 4 and t = lane % 4:
//   a[0] = A[g][2t, 2t+1]   a[1] = A[g+8][2t, 2t+1]   a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][2t+8, 2t+9]
//   b0   = B[2t, 2t+1][g]   b1   = B[2t+8, 2t+9][g]
//   c[0..1] = C[g][2t, 2t+1]   c[2..3] = C[g+8][2t, 2t+1]
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint4& a, uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
  }
}

// The same product when only rows 0..7 of the tile are real (A's rows 8..15 are zero): rows
// 8..15 of C start at 0 and their results go to scratch registers that die at once, so a caller
// keeps 2 accumulator floats per tile instead of 4 (32 registers fewer for O at D = 128).
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[2], const uint4& a, uint32_t b0, uint32_t b1) {
  float unused2, unused3;
  if constexpr (std::is_same_v<T, __half>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%10,%10};\n"
        : "+f"(c[0]), "+f"(c[1]), "=f"(unused2), "=f"(unused3)
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1), "f"(0.0f));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%10,%10};\n"
        : "+f"(c[0]), "+f"(c[1]), "=f"(unused2), "=f"(unused3)
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1), "f"(0.0f));
  }
}

// Four 8x8 matrices of 16-bit elements from shared memory, one row address a lane (lanes 8i..8i+7
// give matrix i's rows); lane (g, t) receives row g, columns 2t, 2t+1 of each: with rows = keys
// that is the B fragment of Q K^T.  The .trans form gives rows 2t, 2t+1 of column g instead: the B
// fragment of P V from V stored key by key.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

}  // namespace tileattn::cuda::decode
