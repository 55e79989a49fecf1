// An array whose elements start uninitialized, for buffers every element of which is written
// before it is read.  std::vector zero-fills: in a bf16 call of S=128 (B=1, H=8, D=64) that memset
// was 10% of the time, on buffers the call then overwrote.
//
// Arrays of 2 MiB and more are aligned to 2 MiB and offered to transparent huge pages (madvise;
// Debian's and Ubuntu's default lets a process ask).  A fresh block of megabytes otherwise takes a
// page fault on the first touch of each 4 KiB page: a bf16 d128 S=1024 backward (B=1, H=8) touched
// ~28 MB of new pages a call, ~7,000 faults, a fifth of its 27 ms on a 2-core Xeon (session 70).
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>
#include <type_traits>

namespace tileattn::cpu {

template <typename T>
class ScratchArray {
  static_assert(std::is_trivially_default_constructible_v<T> && std::is_trivially_destructible_v<T>,
                "ScratchArray holds raw storage: its elements are never constructed or destroyed");

 public:
  ScratchArray() : data_(nullptr), size_(0) {}
  explicit ScratchArray(size_t size) : data_(allocate(size * sizeof(T))), size_(size) {}

  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  size_t size() const { return size_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }

 private:
  static constexpr size_t kHugePage = size_t{2} << 20;

  struct Free {
    void operator()(T* data) const noexcept { std::free(data); }
  };

  static T* allocate(size_t bytes) {
    if (bytes == 0) return nullptr;
    const size_t alignment = bytes >= kHugePage ? kHugePage : 64;
    bytes = (bytes + alignment - 1) / alignment * alignment;  // aligned_alloc takes whole alignments
    void* block = std::aligned_alloc(alignment, bytes);
    if (block == nullptr) throw std::bad_alloc();
    if (alignment == kHugePage) madvise(block, bytes, MADV_HUGEPAGE);  // advice: its failure changes nothing
    return static_cast<T*>(block);
  }

  std::unique_ptr<T[], Free> data_;
  size_t size_;
};

}  // namespace tileattn::cpu
