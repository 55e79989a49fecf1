// huge_block_pool (cpu/huge_block_pool.*) and ScratchArray's use of it: a block given back is the
// one the next request of a size it fits gets (its pages still in), never one more than twice the
// request, the pool keeps at most kMaxKeptBytes, and ScratchArray's moves hand their block over
// once.
#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "cpu/huge_block_pool.h"
#include "cpu/scratch_array.h"

namespace tileattn::cpu {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

void empty_pool() {
  huge_block_pool::free_kept();
  ASSERT_EQ(huge_block_pool::kept_bytes(), 0u);
}

TEST(HugeBlockPool, AGivenBackBlockServesTheNextRequestThatFits) {
  empty_pool();
  const huge_block_pool::Block first = huge_block_pool::take(8 * kMiB);
  ASSERT_EQ(first.bytes, 8 * kMiB);
  ASSERT_EQ(reinterpret_cast<uintptr_t>(first.data) % (2 * kMiB), 0u);
  static_cast<char*>(first.data)[8 * kMiB - 1] = 7;
  huge_block_pool::give_back(first);
  EXPECT_EQ(huge_block_pool::kept_bytes(), 8 * kMiB);

  // 2 MiB is under half of it: a fresh block, the kept one stays.
  const huge_block_pool::Block small = huge_block_pool::take(2 * kMiB);
  EXPECT_NE(small.data, first.data);
  EXPECT_EQ(small.bytes, 2 * kMiB);
  // 6 MiB fits it: the same block, with its size, and out of the pool.
  const huge_block_pool::Block again = huge_block_pool::take(6 * kMiB);
  EXPECT_EQ(again.data, first.data);
  EXPECT_EQ(again.bytes, 8 * kMiB);
  EXPECT_EQ(static_cast<char*>(again.data)[8 * kMiB - 1], 7);
  EXPECT_EQ(huge_block_pool::kept_bytes(), 0u);
  huge_block_pool::give_back(small);
  huge_block_pool::give_back(again);
  EXPECT_EQ(huge_block_pool::kept_bytes(), 10 * kMiB);
  empty_pool();
}

TEST(HugeBlockPool, KeepsNoMoreThanItsLimit) {
  empty_pool();
  const size_t half = huge_block_pool::kMaxKeptBytes / 2;
  std::vector<huge_block_pool::Block> blocks;
  for (int i = 0; i < 3; ++i) blocks.push_back(huge_block_pool::take(half));
  for (const huge_block_pool::Block& block : blocks) huge_block_pool::give_back(block);
  EXPECT_EQ(huge_block_pool::kept_bytes(), huge_block_pool::kMaxKeptBytes);  // the third was freed
  empty_pool();
}

TEST(HugeBlockPool, ScratchArraysReuseTheirBlocksAndMoveThemOnce) {
  empty_pool();
  const size_t floats = 3 * kMiB / sizeof(float);  // 3 MiB: a 4 MiB block
  const float* first = nullptr;
  {
    ScratchArray<float> a(floats);
    first = a.data();
    a[floats - 1] = 1.5f;
    ScratchArray<float> b(std::move(a));
    EXPECT_EQ(a.data(), nullptr);
    EXPECT_EQ(b.data(), first);
    ScratchArray<float> c;
    c = std::move(b);
    EXPECT_EQ(c.data(), first);
    EXPECT_EQ(c.size(), floats);
    EXPECT_EQ(huge_block_pool::kept_bytes(), 0u);
  }
  EXPECT_EQ(huge_block_pool::kept_bytes(), 4 * kMiB);  // given back once, by c
  ScratchArray<float> next(floats);
  EXPECT_EQ(next.data(), first);
  EXPECT_EQ(huge_block_pool::kept_bytes(), 0u);
  ScratchArray<float> small(16);  // under 2 MiB: not from the pool
  EXPECT_NE(small.data(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.data()) % 64, 0u);
}

}  // namespace
}  // namespace tileattn::cpu
