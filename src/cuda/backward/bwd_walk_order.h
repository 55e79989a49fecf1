// The order in which a backward CTA (one key block) walks its query blocks, and, with
// deterministic dQ, its turn at each query block: integer arithmetic shared by the kernels and
// replayed on the host by tests/cpp/test_bwd_walk_order.cpp.
//
// From the top (the plain order): every key block walks down from its last visited block, so
// under no mask all of a head's CTAs meet each query block at the same step and the turns
// (ascending key block, the launch order) make each wait for the one below it, released at once.
//
// Rotated walk: key block n starts n blocks above the bottom of its M visited query blocks and
// walks down, wrapping, so at step t it is at block m = (M - 1 - t + n) mod M, one step behind key
// block n - 1.  The CTAs of one head run at the same time; rotated, they add to different query
// blocks' dQ rows at any moment (L2 serializes atomics to one line), and each reaches a query
// block one step after the key block below it, which was launched just before it.
//
// Up from the diagonal (deterministic calls with a causal or window mask): key block n walks its
// visited blocks upward from the lowest, m_lo(n); m_lo never decreases with n, so at any query
// block the higher key blocks arrive first and the turns go by descending key block.  The grid is
// launched in reverse (key block N - 1 first), so a CTA only ever waits for CTAs launched before
// it: deadlock-free at any length.  Under causal at d128 key block n + 1 reaches each block two
// steps before key block n, so its release may come a step late as well.
//
// Deterministic turns in arrival order: the CTAs adding to block m take turns sorted by (the step
// at which they reach m, key block).  A CTA's predecessor at a block then got there a step
// earlier, so its release, even made a step late (once its atomics have landed and the release's
// fence costs nothing), is there when needed; the plain order (ascending key block, every CTA
// starting at the top) makes every CTA wait for the one below it at every block, right behind its
// atomics.  Valid only when every key block visits all M query blocks (no causal or window mask):
// then the step of n at m is (n - m - 1) mod M and the number of CTAs before n is a closed form.
#pragma once

#include "common/host_device.h"

namespace tileattn::cuda::bwd {

// How a backward CTA walks its query blocks; with deterministic dQ also the turn order.
enum class WalkOrder : int {
  kFromTop,       // from the last visited block down; turns by ascending key block, released at once
  kRotated,       // rotated_walk_block; turns by rotated_turn (no mask only), released a step late
  kUpFromDiagonal,  // m_lo upward, grid reversed; turns by descending key block, released a step late
};

// Query block at step `step` of key block `n`'s rotated walk over blocks [m_lo, m_lo + visited).
TILEATTN_HOST_DEVICE int rotated_walk_block(int n, int step, int m_lo, int visited) {
  return m_lo + (visited - 1 - step + n % visited) % visited;
}

// Of the residues lo, lo + 1, ..., lo + len - 1 (mod m), how many are below `below` (0 <= lo < m).
TILEATTN_HOST_DEVICE int cyclic_count_below(int lo, int len, int m, int below) {
  auto overlap = [below](int begin, int end) {  // |[begin, end) intersected with [0, below)|
    const int clipped = end < below ? end : below;
    return clipped > begin ? clipped - begin : 0;
  };
  if (lo + len <= m) return overlap(lo, lo + len);
  return overlap(lo, m) + overlap(0, lo + len - m);
}

// The turn (0-based) of key block n at query block m when all num_n key blocks visit all num_m
// query blocks on rotated walks.  Key block n' reaches m at step t' = (n' - c) mod num_m with
// c = (m + 1) mod num_m; those with t' < t (n's step) have residues c, c + 1, ..., c + t - 1 mod
// num_m, and residue rho holds num_n / num_m key blocks, plus one when rho < num_n mod num_m; ties
// at step t are the n / num_m key blocks n - num_m, n - 2 num_m, ... >= 0.
TILEATTN_HOST_DEVICE int rotated_turn(int n, int m, int num_n, int num_m) {
  const int c = (m + 1) % num_m;
  const int t = ((n - c) % num_m + num_m) % num_m;
  return t * (num_n / num_m) + cyclic_count_below(c, t, num_m, num_n % num_m) + n / num_m;
}

// Key block of the CTA with grid index `index` of `num_blocks` (up-from-diagonal walks launch the
// highest key block first).
TILEATTN_HOST_DEVICE int key_block_of(int index, int num_blocks, WalkOrder order) {
  return order == WalkOrder::kUpFromDiagonal ? num_blocks - 1 - index : index;
}

// Query block at `step` of a walk over [m_lo, m_hi] (visited = m_hi - m_lo + 1 > 0).
TILEATTN_HOST_DEVICE int walk_block(WalkOrder order, int n, int step, int m_lo, int m_hi) {
  const int visited = m_hi - m_lo + 1;
  if (order == WalkOrder::kRotated) return rotated_walk_block(n, step, m_lo, visited);
  return order == WalkOrder::kUpFromDiagonal ? m_lo + step : m_hi - step;
}

// The deterministic turn of key block n at query block m, which key blocks
// [n_block_min, n_block_max) visit (all num_m query blocks each, for kRotated).
TILEATTN_HOST_DEVICE int walk_turn(WalkOrder order, int n, int m, int n_block_min, int n_block_max, int num_m) {
  if (order == WalkOrder::kRotated) return rotated_turn(n, m, n_block_max, num_m);
  return order == WalkOrder::kUpFromDiagonal ? n_block_max - 1 - n : n - n_block_min;
}

}  // namespace tileattn::cuda::bwd
