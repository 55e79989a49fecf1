// RowTokens (src/cuda/sm90/row_tokens.h): the packed KV-cache route's masks read a row's token
// through it; a slip would mask a row as a neighbouring token, off by one key, silently.  Checked
// against floor division for every group size the route can pack and every row a tile can hold,
// the negative padding rows above a shifted first tile included.
#include <gtest/gtest.h>

#include <cmath>

#include "cuda/sm90/row_tokens.h"

namespace {

using tileattn::FastDivisor;
using tileattn::cuda::sm90::RowTokens;

TEST(RowTokens, TokenIsTheFloorOfRowOverGroup) {
  for (int g = 1; g <= 64; ++g) {
    const RowTokens rows{g, FastDivisor::make(g)};
    for (int row = -191; row < 70000; ++row) {
      ASSERT_EQ(rows.token(row), static_cast<int>(std::floor(static_cast<double>(row) / g))) << "g " << g << " row " << row;
    }
    for (int tokens = 0; tokens < 5000; ++tokens) ASSERT_EQ(rows.tokens(tokens * g), tokens) << "g " << g;
  }
}

TEST(RowTokens, LargeRowCounts) {
  // 2^31 / 256 rows: a sequence of up to ~8M packed rows keeps row + 256 g inside FastDivisor's range.
  for (int g : {2, 7, 8, 31, 128}) {
    const RowTokens rows{g, FastDivisor::make(g)};
    for (int row : {1 << 20, (1 << 23) - 1, (1 << 24) + 3}) {
      EXPECT_EQ(rows.token(row), row / g) << "g " << g << " row " << row;
    }
  }
}

}  // namespace
