// FastDivisor (src/common/fast_divisor.h) replaces the sm90 tile scheduler's divisions and the
// decode's page and row lookups: a wrong quotient or remainder would send a CTA to the wrong
// (query block, batch, head) tile or a TMA box to the wrong page row.  Checked against the
// built-in division at the dividends where a rounding error would show first (just below and at
// each multiple of the divisor, and the top of the range) for small divisors, powers of two and
// their neighbours, and large ones.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "common/fast_divisor.h"

namespace {

using tileattn::FastDivisor;

void check_divisor(int d) {
  const FastDivisor f = FastDivisor::make(d);
  ASSERT_EQ(f.divisor, static_cast<uint32_t>(d));
  constexpr int kTop = 0x7fffffff;
  std::vector<int> dividends = {0, 1, 2, d - 1, d, kTop, kTop - 1, kTop - d};
  if (d < kTop) dividends.push_back(d + 1);
  for (int k : {2, 3, 7, 1000, 65537}) {
    const int64_t m = static_cast<int64_t>(k) * d;
    if (m <= kTop) dividends.insert(dividends.end(), {static_cast<int>(m - 1), static_cast<int>(m)});
  }
  const int64_t last = static_cast<int64_t>(kTop / d) * d;  // the largest multiple in range
  dividends.insert(dividends.end(), {static_cast<int>(last), static_cast<int>(last - 1)});
  for (int n = 0; n < 3000; ++n) dividends.push_back(n);
  for (int n : dividends) {
    if (n < 0) continue;
    ASSERT_EQ(f.div(n), n / d) << "n " << n << " d " << d;
    ASSERT_EQ(f.mod(n), n % d) << "n " << n << " d " << d;
  }
}

TEST(FastDivisor, MatchesIntegerDivisionAndRemainder) {
  for (int d = 1; d <= 2000; ++d) check_divisor(d);
  for (int bit = 1; bit < 31; ++bit) {
    const int p = 1 << bit;
    for (int d : {p - 1, p, p + 1}) check_divisor(d);
  }
  for (int d : {12345, 1000003, 99999989, 0x3fffffff, 0x40000001, 0x7ffffffe, 0x7fffffff}) check_divisor(d);
}

}  // namespace
