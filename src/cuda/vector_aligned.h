// Whether a tensor takes 16-byte vectors of 8 fp16/bf16 elements: a 16-byte aligned base and
// strides of whole vectors (a varlen tensor's batch stride is unused).  Shared by the forward's
// dispatch, the decode kernels' choice of loads and the KV-cache route's copies.
#pragma once

#include <cstdint>

namespace tileattn::cuda {

inline bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

inline bool vector_aligned(const void* ptr, int64_t batch_stride, int64_t row_stride, int64_t head_stride,
                           bool varlen = false) {
  constexpr int64_t kVector = 8;
  return aligned16(ptr) && row_stride % kVector == 0 && head_stride % kVector == 0 &&
         (varlen || batch_stride % kVector == 0);
}

}  // namespace tileattn::cuda
