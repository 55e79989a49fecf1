// Whether two strided tensor views touch a common byte.  The API uses it to refuse calls whose
// outputs share memory with another argument (k_cache passed as v_cache with an append, out
// inside q): the kernels read and write in no fixed order, so such a call would return whatever
// order the threads happened to run in.
//
// The test is exact for views whose strides nest (each dim's stride at least the span of the
// dims inside it, as every written tensor's must), which covers the interleaved views of one
// buffer that are legitimate: k and v of a packed (B, S, 2, H, D) tensor, dq, dk, dv of a packed
// gradient.  Two byte ranges that do not meet are disjoint at once, the cost of almost every call.
#pragma once

#include <cstdint>
#include <stdexcept>

namespace tileattn {

struct ByteDim {
  int64_t size;
  int64_t stride;  // in bytes, >= 0
};

// A tensor view: a contiguous run of inner_bytes at base + sum(index[d] * dims[d].stride).
struct MemoryView {
  static constexpr int kMaxDims = 4;

  const char* name = nullptr;
  uintptr_t base = 0;
  int64_t inner_bytes = 0;
  ByteDim dims[kMaxDims];  // the first num_dims; left uninitialized, as a call builds ~16 views
  int num_dims = 0;
  bool stride_overflow = false;  // some stride_elements * element_bytes did not fit int64

  MemoryView() = default;
  MemoryView(const char* name, const void* ptr, int64_t inner_bytes)
      : name(name), base(reinterpret_cast<uintptr_t>(ptr)), inner_bytes(inner_bytes) {}

  // Adds a dim of `size` indices `stride_elements * element_bytes` bytes apart.
  MemoryView& dim(int64_t size, int64_t stride_elements, int element_bytes) {
    if (num_dims == kMaxDims) throw std::logic_error("MemoryView holds at most 4 dims");
    int64_t stride_bytes = 0;
    stride_overflow |= __builtin_mul_overflow(stride_elements, int64_t{element_bytes}, &stride_bytes);
    dims[num_dims++] = {size, stride_bytes};
    return *this;
  }

  // Whether every byte offset of the view fits in 2^62 (a larger one, or one that overflows
  // int64, describes no memory a process has; the overlap checks' arithmetic assumes it).
  bool addressable() const {
    if (stride_overflow) return false;
    int64_t span = inner_bytes, step = 0;
    for (int d = 0; d < num_dims; ++d) {
      if (dims[d].size <= 1) continue;
      if (dims[d].stride == INT64_MIN) return false;  // no magnitude in int64
      if (__builtin_mul_overflow(dims[d].size - 1, dims[d].stride < 0 ? -dims[d].stride : dims[d].stride, &step) ||
          __builtin_add_overflow(span, step, &span)) {
        return false;
      }
    }
    return span <= (int64_t{1} << 62);
  }

  // No byte at all: a null pointer or a zero extent.
  bool empty() const {
    if (base == 0 || inner_bytes <= 0) return true;
    for (int d = 0; d < num_dims; ++d) {
      if (dims[d].size <= 0) return true;
    }
    return false;
  }

  // Bytes from base to one past the last byte of the view.
  int64_t extent() const {
    int64_t span = inner_bytes;
    for (int d = 0; d < num_dims; ++d) span += (dims[d].size - 1) * dims[d].stride;
    return span;
  }
};

// True when some byte lies in both views.  A search that cannot settle within its step budget
// (strides that neither nest nor repeat, far beyond any layout torch produces) answers true.
bool views_share_bytes(const MemoryView& a, const MemoryView& b);

}  // namespace tileattn
