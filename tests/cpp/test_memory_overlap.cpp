// views_share_bytes against the bytes themselves: random views on a small address range,
// enumerated byte by byte, must agree with the search, nested strides or not.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "api/memory_overlap.h"

namespace tileattn::test {
namespace {

std::set<uintptr_t> bytes_of(const MemoryView& v) {
  std::set<uintptr_t> bytes;
  if (v.empty()) return bytes;
  int64_t index[MemoryView::kMaxDims] = {};
  while (true) {
    uintptr_t start = v.base;
    for (int d = 0; d < v.num_dims; ++d) start += index[d] * v.dims[d].stride;
    for (int64_t b = 0; b < v.inner_bytes; ++b) bytes.insert(start + b);
    int d = 0;
    while (d < v.num_dims && ++index[d] == v.dims[d].size) index[d++] = 0;
    if (d == v.num_dims) return bytes;
  }
}

bool brute_force_share(const MemoryView& a, const MemoryView& b) {
  const std::set<uintptr_t> in_a = bytes_of(a);
  for (uintptr_t byte : bytes_of(b)) {
    if (in_a.count(byte)) return true;
  }
  return false;
}

// A view of 1-3 dims of 1-5 indices: with `nested`, each stride steps past the dims inside it
// (as a written tensor's must); otherwise strides anywhere in 0-40 bytes.
MemoryView random_view(std::mt19937& rng, bool nested, const char* name) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int element = pick(0, 1) ? 4 : 2;
  MemoryView v(name, reinterpret_cast<const void*>(uintptr_t{4096} + pick(0, 200)),
               element * pick(1, 4));
  int64_t span = v.inner_bytes;
  const int dims = pick(1, 3);
  for (int d = 0; d < dims; ++d) {
    const int size = pick(1, 5);
    const int64_t stride = nested ? span + element * pick(0, 3) : element * pick(0, 10);
    v.dim(size, stride / element, element);
    span += (size - 1) * stride;
  }
  return v;
}

TEST(MemoryOverlap, AgreesWithTheBytes) {
  std::mt19937 rng(20261205);
  int shared = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const bool nested = trial % 2 == 0;
    const MemoryView a = random_view(rng, nested, "a"), b = random_view(rng, nested, "b");
    const bool expect = brute_force_share(a, b);
    ASSERT_EQ(views_share_bytes(a, b), expect) << "trial " << trial;
    ASSERT_EQ(views_share_bytes(b, a), expect) << "trial " << trial;
    shared += expect;
  }
  // Both answers must be common, or the comparison above proves little.
  EXPECT_GT(shared, 2000);
  EXPECT_LT(shared, 18000);
}

// The layouts that interleave legitimately: k and v of a packed (B, S, 2, H, D) buffer.
TEST(MemoryOverlap, InterleavedHalvesOfOnePackedBuffer) {
  const int B = 3, S = 17, H = 2, D = 8;  // bf16
  static char buffer[B * S * 2 * H * D * 2];
  auto half = [&](int which) {
    MemoryView v("kv", buffer + which * H * D * 2, D * 2);
    v.dim(B, S * 2 * H * D, 2).dim(S, 2 * H * D, 2).dim(H, D, 2);
    return v;
  };
  EXPECT_FALSE(views_share_bytes(half(0), half(1)));
  EXPECT_TRUE(views_share_bytes(half(0), half(0)));
  MemoryView shifted = half(1);
  shifted.base -= 2;  // one element into k's last row
  EXPECT_TRUE(views_share_bytes(half(0), shifted));
}

TEST(MemoryOverlap, EmptyViewsShareNothing) {
  static char buffer[64];
  MemoryView whole("a", buffer, 64);
  EXPECT_FALSE(views_share_bytes(whole, MemoryView("null", nullptr, 64)));
  EXPECT_FALSE(views_share_bytes(whole, MemoryView("no bytes", buffer, 0)));
  MemoryView no_rows("no rows", buffer, 4);
  no_rows.dim(0, 1, 4);
  EXPECT_FALSE(views_share_bytes(whole, no_rows));
}

// Strides 6 and 4 bytes, one byte apart: never a common byte (6i - 4j is even), but each of a's
// million indices leaves a candidate for b's, past the search budget; the answer is then the
// cautious one.
TEST(MemoryOverlap, SearchPastItsBudgetAnswersShared) {
  MemoryView a("a", reinterpret_cast<const void*>(uintptr_t{1} << 20), 1);
  a.dim(1 << 20, 6, 1);
  MemoryView b("b", reinterpret_cast<const void*>((uintptr_t{1} << 20) + 1), 1);
  b.dim(1 << 20, 4, 1);
  EXPECT_TRUE(views_share_bytes(a, b));
}

}  // namespace
}  // namespace tileattn::test
