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

}  // namespace
