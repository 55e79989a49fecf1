// An array whose elements start uninitialized, for buffers every element of which is written
// before it is read.  std::vector zero-fills: in a bf16 call of S=128 (B=1, H=8, D=64) that memset
// was 10% of the time, on buffers the call then overwrote.
//
// Arrays of 2 MiB and more are aligned to 2 MiB and offered to transparent huge pages (madvise;
// Debian's and Ubuntu's default lets a process ask).  A fresh block of megabytes otherwise takes a
// page fault on the first touch of each 4 KiB page: a bf16 d128 S=1024 backward (B=1, H=8) touched
// ~28 MB of new pages a call, ~7,000 faults, a fifth of its 27 ms on a 2-core Xeon (session 70).
// They come from and go back to huge_block_pool.h, which keeps them, faulted in, for the next call.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>
#include <type_traits>
#include <utility>

#include "cpu/huge_block_pool.h"

namespace tileattn::cpu {

template <typename T>
class ScratchArray {
  static_assert(std::is_trivially_default_constructible_v<T> && std::is_trivially_destructible_v<T>,
                "ScratchArray holds raw storage: its elements are never constructed or destroyed");

 public:
  ScratchArray() = default;
  explicit ScratchArray(size_t size) : block_(allocate(size * sizeof(T))), size_(size) {}
  ScratchArray(ScratchArray&& other) noexcept
      : block_(std::exchange(other.block_, huge_block_pool::Block{nullptr, 0})), size_(std::exchange(other.size_, 0)) {}
  ScratchArray& operator=(ScratchArray&& other) noexcept {
    if (this != &other) {
      release();
      block_ = std::exchange(other.block_, huge_block_pool::Block{nullptr, 0});
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  ~ScratchArray() { release(); }

  T* data() { return static_cast<T*>(block_.data); }
  const T* data() const { return static_cast<const T*>(block_.data); }
  size_t size() const { return size_; }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }

 private:
  static constexpr size_t kHugePage = huge_block_pool::kHugePage;

  // Blocks of 2 MiB and more from the pool; smaller ones 64-byte aligned.
  static huge_block_pool::Block allocate(size_t bytes) {
    if (bytes == 0) return {nullptr, 0};
    if (bytes >= kHugePage) return huge_block_pool::take(bytes);
    bytes = (bytes + 63) / 64 * 64;  // aligned_alloc takes whole alignments
    void* data = std::aligned_alloc(64, bytes);
    if (data == nullptr) throw std::bad_alloc();
    return {data, bytes};
  }

  void release() noexcept {
    if (block_.bytes >= kHugePage) {
      huge_block_pool::give_back(block_);
    } else {
      std::free(block_.data);
    }
    block_ = {nullptr, 0};
  }

  huge_block_pool::Block block_{nullptr, 0};
  size_t size_ = 0;
};

}  // namespace tileattn::cpu
