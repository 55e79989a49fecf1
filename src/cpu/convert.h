// Element conversions between the storage dtypes and float32, the CPU backend's compute type.
#pragma once

#include <cstdint>
#include <cstring>

#include "cpu/vector_math.h"
#include "tileattn/tileattn.h"

namespace tileattn::cpu {

inline float bf16_to_float(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, sizeof(f));
  return f;
}

// Round to nearest even; NaN stays NaN (quiet bit forced so it cannot round into infinity).
inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// IEEE binary16 through the compiler's _Float16 (GCC >= 12 on x86-64), exact both ways.
inline float fp16_to_float(uint16_t bits) {
  _Float16 h;
  std::memcpy(&h, &bits, sizeof(h));
  return static_cast<float>(h);
}

inline uint16_t float_to_fp16(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t bits;
  std::memcpy(&bits, &h, sizeof(bits));
  return bits;
}

// Copies `count` elements of one row from storage to float.
inline void load_row(tileattn_dtype dtype, const void* src, int64_t offset, int count, float* dst) {
  switch (dtype) {
    case TILEATTN_FLOAT32: {
      std::memcpy(dst, static_cast<const float*>(src) + offset, sizeof(float) * count);
      return;
    }
    case TILEATTN_BFLOAT16: {
      bf16_row_to_float(static_cast<const uint16_t*>(src) + offset, count, dst);
      return;
    }
    case TILEATTN_FLOAT16: {
      fp16_row_to_float(static_cast<const uint16_t*>(src) + offset, count, dst);
      return;
    }
  }
}

// Rounds `count` floats into one row of storage.
inline void store_row(tileattn_dtype dtype, const float* src, int count, void* dst, int64_t offset) {
  switch (dtype) {
    case TILEATTN_FLOAT32: {
      std::memcpy(static_cast<float*>(dst) + offset, src, sizeof(float) * count);
      return;
    }
    case TILEATTN_BFLOAT16: {
      float_row_to_bf16(src, count, static_cast<uint16_t*>(dst) + offset);
      return;
    }
    case TILEATTN_FLOAT16: {
      float_row_to_fp16(src, count, static_cast<uint16_t*>(dst) + offset);
      return;
    }
  }
}

}  // namespace tileattn::cpu
