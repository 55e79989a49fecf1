// An array whose elements start uninitialized, for buffers every element of which is written
// before it is read.  std::vector zero-fills: in a bf16 call of S=128 (B=1, H=8, D=64) that memset
// was 10% of the time, on buffers the call then overwrote.
#pragma once

#include <cstddef>
#include <memory>

namespace tileattn::cpu {

template <typename T>
class ScratchArray {
 public:
  explicit ScratchArray(size_t size = 0) : data_(size > 0 ? new T[size] : nullptr), size_(size) {}

  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  size_t size() const { return size_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }

 private:
  std::unique_ptr<T[]> data_;  // new T[n]: default-initialized, which for arithmetic T is no write
  size_t size_;
};

}  // namespace tileattn::cpu
