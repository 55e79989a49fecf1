// The head-dim buckets of the CUDA backward, and the tile sizes and shared-memory layout of its
// WMMA fallback (bwd_kernels.cuh); the FA2 kernel's tiles are in bwd_fa2_traits.h.
#pragma once

#include <cstddef>

namespace tileattn::cuda::bwd {

// The head-dim buckets the backward is compiled for; a head dim runs in the smallest bucket that
// holds it, its extra columns zero-filled on load and never stored.
constexpr int kHeadDimBuckets[] = {64, 128, 256};

constexpr int head_dim_bucket(int head_dim) {
  for (int bucket : kHeadDimBuckets) {
    if (head_dim <= bucket) return bucket;
  }
  return 0;
}

// Query rows a step of the warp-specialized Hopper kernel (sm90/bwd_ws_traits.h takes its kBlockM
// from here).  The deterministic turn counters, allocated before the kernel is chosen, are sized for
// the smaller of its blocks and the FA2-structured kernel's (128 rows at d64: sized for those, the
// warp-specialized kernel's turns ran past the counters and check_backward hung on the H200).
constexpr int kWsBlockM = 64;

// The most floats the warp-specialized kernel pads a row of the dQ workspace by (its staging rows'
// pitch, bwd_ws_dq_pitch): the workspace size query, which does not know the kernel, allows for it.
constexpr int kWsDqPadMax = 8;

template <int kHeadDim>
struct BwdConfig {
  static constexpr int kDim = kHeadDim;  // padded head dim, a multiple of 16 (the MMA's k)
  // 64 x 64 tiles up to d128: K, V, Q, dO and the score tiles take 121 KB of shared memory at
  // d128, and the dK/dV accumulators 64 registers per thread.  At d256 a 64-row step would need
  // 128 accumulator registers per thread and 227 KB of smem, so the tiles shrink to 32 x 32.
  static constexpr int kBlockM = kHeadDim <= 128 ? 64 : 32;  // query rows per step
  static constexpr int kBlockN = kHeadDim <= 128 ? 64 : 32;  // key rows per CTA
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  // Row pitches, padded so the 16 rows one MMA fragment reads start in different banks; WMMA
  // needs pitches that are multiples of 8 (16-bit) or 4 (float) elements.
  static constexpr int kPitch = kDim + 8;      // 16-bit tiles of width kDim
  static constexpr int kAccPitch = kDim + 4;   // float tiles of width kDim
  static constexpr int kScorePitch = kBlockN + 4;  // float score tiles
  static constexpr int kProbPitch = kBlockN + 8;   // 16-bit P and dS tiles
};

constexpr size_t align128(size_t bytes) { return (bytes + 127) / 128 * 128; }

// Byte offsets of each tile in dynamic shared memory.  dK, dV (main kernel) and dQ (deterministic
// dQ kernel) accumulate in registers; `scratch` holds S and dP, later one step's dQ (the score
// tiles are dead by then), and at the end the accumulators on their way to global memory.
template <int kHeadDim>
struct BwdSmem {
  using C = BwdConfig<kHeadDim>;
  static_assert(C::kBlockM == C::kBlockN, "the epilogue stages kBlockN rows where kBlockM fit");
  static constexpr size_t kKeyTile = align128(size_t(C::kBlockN) * C::kPitch * 2);
  static constexpr size_t kQueryTile = align128(size_t(C::kBlockM) * C::kPitch * 2);
  static constexpr size_t kScoreTile = align128(size_t(C::kBlockM) * C::kScorePitch * 4);
  static constexpr size_t kAccTile = align128(size_t(C::kBlockM) * C::kAccPitch * 4);
  static constexpr size_t kScratch = 2 * kScoreTile > kAccTile ? 2 * kScoreTile : kAccTile;
  static constexpr size_t kProbTile = align128(size_t(C::kBlockM) * C::kProbPitch * 2);
  static constexpr size_t kRowStats = align128(size_t(C::kBlockM) * 4);

  static constexpr size_t k = 0;
  static constexpr size_t v = k + kKeyTile;
  static constexpr size_t q = v + kKeyTile;
  static constexpr size_t dout = q + kQueryTile;
  static constexpr size_t scratch = dout + kQueryTile;
  static constexpr size_t probs = scratch + kScratch;
  static constexpr size_t dscores = probs + kProbTile;
  static constexpr size_t lse_log2 = dscores + kProbTile;
  static constexpr size_t delta = lse_log2 + kRowStats;
  static constexpr size_t bytes = delta + kRowStats;
};

}  // namespace tileattn::cuda::bwd
