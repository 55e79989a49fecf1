// Tile sizes of the sm80-family forward kernel, chosen in one place.  Every other header reads
// them through fwd_tile_config(); nothing else hard-codes a tile size.
#pragma once

namespace tileattn::cuda {

struct FwdTileConfig {
  int block_m;    // query rows per CTA (kBlockM)
  int block_n;    // key rows per mainloop step (kBlockN)
  int num_warps;  // warps per CTA, stacked along the query rows (FA2: never split along keys)
};

// The head-dim buckets kernels are compiled for.  A head dim between two buckets runs in the next
// larger one with the extra columns zero-filled on load and never stored (predicated), so every
// head dim 1..256 is served.  src/cuda/CMakeLists.txt generates one translation unit per bucket.
constexpr int kHeadDimBuckets[] = {32, 64, 96, 128, 192, 256};

constexpr int head_dim_bucket(int head_dim) {
  for (int bucket : kHeadDimBuckets) {
    if (head_dim <= bucket) return bucket;
  }
  return 0;  // above 256: validation rejects it before we get here
}

// Shared memory holds Q (block_m x D) plus one K and one V tile (block_n x D each), 2 bytes per
// element.  The choices below start from what FlashAttention-2 ships for Hopper-class parts
// (its run_mha_fwd_hdim* launchers, measured there on H100) and are re-measured on the H200 by
// bench/gpu/fwd_sweep.py; docs/cuda-forward.md records the numbers.
constexpr FwdTileConfig fwd_tile_config(int head_dim) {
  // d <= 64: scores dominate the work, so a wide 128-key step halves the number of softmax
  // rescales per row; 128x128 with 4 warps, 64 KB of smem (255 registers, 136 B stack on sm90).
  // Measured on the H200 it runs 2-6% ahead of FA2 at d64 non-causal.
  if (head_dim <= 64) return {128, 128, 4};
  // d 96..128: 128x64 with 4 warps: at d128 each thread holds 128 O accumulators and 64 scores;
  // a 128-key step would double the scores to 128 floats and spill.
  if (head_dim <= 128) return {128, 64, 4};
  // d 192..256: 8 warps of 16 rows each, so a thread holds 128 O floats at d256; (128 + 2x64)
  // x 256 x 2 B = 128 KB of smem, one CTA per SM.  FA2 picks 64x64 with 4 warps on H100-class
  // parts (96 KB, two CTAs per SM); measured here on the H200 that was 6-10% slower for
  // non-causal and causal >= 2k (d256 16k: 288 vs 308 TFLOP/s), faster only for causal <= 1k.
  return {128, 64, 8};
}

}  // namespace tileattn::cuda
