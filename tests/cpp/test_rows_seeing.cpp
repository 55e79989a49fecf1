// rows_seeing (cpu/score_tile.h), which the CPU forward uses to run only the rows of a query tile
// that see a key tile: against a row-by-row scan of visible_columns over causal masks, windows,
// Sq != Sk (rows that see nothing at the top) and key tiles past every row's reach.
#include <gtest/gtest.h>

#include "common/mask.h"
#include "cpu/score_tile.h"

namespace tileattn::cpu {
namespace {

ScoreRule rule_of(int seqlen_q, int seqlen_k, int window_left, int window_right) {
  ScoreRule rule{};
  rule.seqlen_q = seqlen_q;
  rule.seqlen_k = seqlen_k;
  rule.window_left = window_left;
  rule.window_right = window_right;
  return rule;
}

TEST(RowsSeeing, MatchesEveryRowsVisibleColumns) {
  const int shapes[][2] = {{1000, 1000}, {300, 200}, {150, 70}, {70, 300}, {17, 1}, {1, 17}};
  const int windows[][2] = {{-1, -1}, {-1, 0}, {20, 5}, {33, 0}, {0, 0}, {5, -1}, {-1, 40}};
  int checked = 0, partial = 0;
  for (const auto& shape : shapes) {
    for (const auto& window : windows) {
      const ScoreRule rule = rule_of(shape[0], shape[1], window[0], window[1]);
      for (int row0 = 0; row0 < shape[0]; row0 += 256) {
        const int rows = std::min(256, shape[0] - row0);
        for (int col0 = 0; col0 < shape[1]; col0 += 128) {
          const int cols = std::min(128, shape[1] - col0);
          int lo = rows, hi = 0;
          for (int r = 0; r < rows; ++r) {
            const ColumnRange c = visible_columns(row0 + r, shape[0], shape[1], window[0], window[1]);
            if (c.first <= c.last && c.first < col0 + cols && c.last >= col0) {
              lo = std::min(lo, r);
              hi = r + 1;
            }
          }
          const RowRange got = rows_seeing(rule, row0, rows, col0, cols);
          SCOPED_TRACE(testing::Message() << shape[0] << "x" << shape[1] << " window " << window[0] << ","
                                          << window[1] << " rows " << row0 << " cols " << col0);
          if (lo >= hi) {
            EXPECT_EQ(got.lo, got.hi);
          } else {
            EXPECT_EQ(got.lo, lo);
            EXPECT_EQ(got.hi, hi);
            partial += hi - lo < rows;
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(partial, 20);  // the cases reach tiles only some rows see
  EXPECT_GT(checked, 200);
}

}  // namespace
}  // namespace tileattn::cpu
