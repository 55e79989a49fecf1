// The backward's rotated walk and deterministic turn order (src/cuda/backward/bwd_walk_order.h):
// a wrong turn number makes a CTA wait for a turn that never comes (a hang on the GPU) or two CTAs
// add at once (results that differ between runs).  Here every walk is replayed on the host: each
// key block visits each query block once, and at every query block the turns are a permutation of
// 0..num_n-1 that sorts the CTAs by (arrival step, key block).
#include <gtest/gtest.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "cuda/backward/bwd_walk_order.h"

namespace {

using tileattn::cuda::bwd::rotated_turn;
using tileattn::cuda::bwd::rotated_walk_block;

TEST(BwdWalkOrder, EveryQueryBlockOnceAndTurnsInArrivalOrder) {
  for (int num_m : {1, 2, 3, 7, 16, 64, 129}) {
    for (int num_n : {1, 2, 5, 16, 63, 64, 65, 130, 300}) {
      // arrivals[m]: (step, key block, turn) of every visit to query block m.
      std::vector<std::vector<std::tuple<int, int, int>>> arrivals(static_cast<size_t>(num_m));
      for (int n = 0; n < num_n; ++n) {
        std::vector<int> seen(static_cast<size_t>(num_m), 0);
        for (int step = 0; step < num_m; ++step) {
          const int m = rotated_walk_block(n, step, 0, num_m);
          ASSERT_GE(m, 0);
          ASSERT_LT(m, num_m);
          ++seen[static_cast<size_t>(m)];
          arrivals[static_cast<size_t>(m)].emplace_back(step, n, rotated_turn(n, m, num_n, num_m));
        }
        for (int m = 0; m < num_m; ++m) ASSERT_EQ(seen[static_cast<size_t>(m)], 1) << "n=" << n << " m=" << m;
      }
      for (int m = 0; m < num_m; ++m) {
        auto& a = arrivals[static_cast<size_t>(m)];
        std::sort(a.begin(), a.end());
        for (int i = 0; i < num_n; ++i) {
          ASSERT_EQ(std::get<2>(a[static_cast<size_t>(i)]), i)
              << "num_m=" << num_m << " num_n=" << num_n << " m=" << m << " key block " << std::get<1>(a[static_cast<size_t>(i)]);
        }
      }
    }
  }
}

TEST(BwdWalkOrder, OffsetRangeStaysInside) {
  for (int n = 0; n < 50; ++n) {
    for (int step = 0; step < 9; ++step) {
      const int m = rotated_walk_block(n, step, 5, 9);
      EXPECT_GE(m, 5);
      EXPECT_LT(m, 14);
    }
  }
}

// Visible (query block, key block) pairs of a causal / window mask, by brute force over rows and
// columns: row i sees columns [i + Sk - Sq - left, i + Sk - Sq + right] (negative: unbounded).
bool block_visible(int m, int n, int bm, int bn, int sq, int sk, int left, int right) {
  for (int i = m * bm; i < std::min((m + 1) * bm, sq); ++i) {
    for (int j = n * bn; j < std::min((n + 1) * bn, sk); ++j) {
      const int d = j - (i + sk - sq);
      if ((left < 0 || d >= -left) && (right < 0 || d <= right)) return true;
    }
  }
  return false;
}

// Up-from-diagonal walks where the host picks them (Sk - Sq + right < bn): at every query block the
// turns are a permutation 0..k-1, the CTA before each one in turn order was launched before it
// (the grid runs in reverse) and reached the block at an earlier step, so a turn released a step
// late is never what a CTA queues behind.
TEST(BwdWalkOrder, UpFromDiagonalTurnsFollowLaunchAndArrival) {
  using tileattn::cuda::bwd::key_block_of;
  using tileattn::cuda::bwd::walk_block;
  using tileattn::cuda::bwd::walk_turn;
  using tileattn::cuda::bwd::WalkOrder;
  struct Case { int bm, bn, sq, sk, left, right; };
  for (const Case& c : {Case{64, 128, 1000, 1000, -1, 0}, Case{128, 128, 2048, 2048, -1, 0},
                        Case{64, 64, 300, 127, -1, 0}, Case{64, 128, 777, 700, 300, 20},
                        Case{64, 64, 129, 129, 0, 0}, Case{64, 128, 1, 1, -1, 0}}) {
    ASSERT_LT(c.sk - c.sq + c.right, c.bn);
    const int num_m = (c.sq + c.bm - 1) / c.bm, num_n = (c.sk + c.bn - 1) / c.bn;
    // arrivals[m]: (turn, launch index, step) of every visit to query block m.
    std::vector<std::vector<std::tuple<int, int, int>>> arrivals(static_cast<size_t>(num_m));
    for (int index = 0; index < num_n; ++index) {
      const int n = key_block_of(index, num_n, WalkOrder::kUpFromDiagonal);
      int m_lo = -1, m_hi = -1;
      for (int m = 0; m < num_m; ++m) {
        if (!block_visible(m, n, c.bm, c.bn, c.sq, c.sk, c.left, c.right)) continue;
        if (m_lo < 0) m_lo = m;
        m_hi = m;
      }
      if (m_lo < 0) continue;
      for (int step = 0; step <= m_hi - m_lo; ++step) {
        const int m = walk_block(WalkOrder::kUpFromDiagonal, n, step, m_lo, m_hi);
        int n_min = num_n, n_max = 0;  // the key blocks that visit m
        for (int k = 0; k < num_n; ++k) {
          if (block_visible(m, k, c.bm, c.bn, c.sq, c.sk, c.left, c.right)) {
            n_min = std::min(n_min, k);
            n_max = k + 1;
          }
        }
        arrivals[static_cast<size_t>(m)].emplace_back(
            walk_turn(WalkOrder::kUpFromDiagonal, n, m, n_min, n_max, m_hi - m_lo + 1), index, step);
      }
    }
    for (auto& a : arrivals) {
      std::sort(a.begin(), a.end());
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_EQ(std::get<0>(a[i]), static_cast<int>(i)) << "sq=" << c.sq << " sk=" << c.sk;
        if (i > 0) {
          EXPECT_LT(std::get<1>(a[i - 1]), std::get<1>(a[i])) << "turn order against launch order";
          EXPECT_LT(std::get<2>(a[i - 1]), std::get<2>(a[i])) << "predecessor did not arrive earlier";
        }
      }
    }
  }
}

}  // namespace
