// How many splits of the keys a decode call uses.  Shapes only, never cache_seqlens' contents:
// reading those would sync the host with the device and break CUDA-graph capture, and a choice
// that depends on shapes alone replays correctly however the lengths change.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cuda/decode/decode_shape.h"

namespace tileattn::cuda::decode {

// requested > 0 is honoured (clamped to [1, useful]) and, being independent of the batch, gives
// batch-invariant results.  requested == 0: `ctas` = batch x KV heads x row blocks CTAs of one
// split run `resident` at a time, and a split's kWarps warps take its chunks round robin, so the
// call takes about
//   ceil(ctas x splits / resident) waves x (its busiest warp's ceil(chunks / (splits x kWarps))
//                                           chunks + a CTA's fixed cost)
// and the split count with the least of that is taken, the fewest splits on a tie (each adds
// combine work), with at least one chunk a warp in a split of the longest possible cache.  The
// fixed cost, kFixedChunks, is what a CTA spends besides streaming (session 19's timeline of a
// 1 x 2k call: ~1.3 us for the bounds, ~1 us to the first block, ~1.5 us of merge and stores)
// in units of one chunk of a warp streaming at full rate (~2 us at 1 x 32k, 16 blocks a warp in
// ~36 us); without it the waves' rounding favours hundreds of splits at batch 32-128.  Until
// session 21 the rule was the fewest splits whose last wave is at least 90% full: 30 at batch
// 1 x 8 KV heads, where a 4k cache's 256 blocks gave each split 9, its first warp 3 and the
// others 2; 32 splits give every warp 2 (measured with the TMA loop: 1 x 4k +6%, 1 x 8k-128k
// +2%; docs/perf-log.md).  `step`: the keys of a chunk (16 for the register loop, the TMA loop's
// block size for it).
constexpr int kFixedChunks = 2;
// A split CTA's fixed cost when the splits merge inside a cluster (cluster_merge.cuh): no partial
// stores and no combine kernel after the grid.  Measured on the H200 (perf log, session 35): 16 x 2k
// at 2 splits, 40.1 -> 37.3 us a call, 2.8 us saved of the ~4 us that kFixedChunks' 2 chunks of ~2
// us stand for, so one chunk.
constexpr int kFixedClusterChunks = 1;

// How a call splits its keys: `splits` CTAs per (sequence, KV head, row block), merged inside a
// cluster (`cluster`) or by the combine kernel.
struct SplitPlan {
  int splits;
  bool cluster;
};

// cluster_resident: nullptr when the cluster merge does not apply (the register loop, compute
// capability below 9.0, TILEATTN_DECODE_SPLIT_MERGE=combine); else cluster_resident[s] for s in
// [2, kMaxClusterSplits] is how many CTAs run at once in clusters of s (cudaOccupancyMaxActiveClusters
// x s: on the H200 at two CTAs an SM 264 for s = 2, but 248 for 4 and 240 for 8, a GPC's SMs
// not dividing evenly).  The cluster merge is costed by the same model with kFixedClusterChunks and
// the clusters' waves, and taken only where strictly cheaper than the combine's best count: 8 x 8
// KV heads at 4 splits (64 clusters of 4, 62 resident: a second wave, -25% measured) keeps the
// combine kernel.
// The combine and the cluster merge give the same bits (cluster_merge.cuh), so the choice, which
// depends on the batch, keeps a fixed num_splits batch-invariant.
inline SplitPlan choose_split_plan(int requested, int64_t ctas, int resident, const int* cluster_resident, int seqlen_k,
                                   int step) {
  const int chunks = std::max(1, (seqlen_k + step - 1) / step);
  auto waves = [&](int splits, int64_t slots) { return (ctas * splits + slots - 1) / slots; };
  auto busiest_warp = [&](int splits) {
    return (chunks + int64_t{splits} * kWarps - 1) / (int64_t{splits} * kWarps);
  };
  auto cluster_fits = [&](int splits) {
    return cluster_resident != nullptr && splits >= 2 && splits <= kMaxClusterSplits && cluster_resident[splits] > 0;
  };
  if (requested > 0) {
    const int splits = std::min({requested, kMaxSplits, chunks});
    return {splits, cluster_fits(splits) && waves(splits, cluster_resident[splits]) <= waves(splits, resident)};
  }
  // Unsplit CTAs that already fill their waves to 90% (batch >= 32 x 8 KV heads) stay whole: the
  // model's gain from finer waves there is a few percent, less than it can resolve.
  const int64_t unsplit_waves = (ctas + resident - 1) / resident;
  if (ctas >= 0.9 * unsplit_waves * resident) return {1, false};
  const int useful = std::max(1, std::min(kMaxSplits, chunks / kWarps));
  // The combine's best count first, then a cluster count only where strictly cheaper: the model
  // resolves a chunk, and on a tie the cluster's count is the smaller one, with fewer warps in
  // flight (4 x 8 KV heads x 2k: 7 splits in clusters 18.3 us, 8 splits and the combine 15.7 us,
  // session 36; both cost 6 chunks in the model).
  SplitPlan best{1, false};
  int64_t best_cost = INT64_MAX;
  for (int splits = 1; splits <= useful; ++splits) {
    const int64_t cost = waves(splits, resident) * (busiest_warp(splits) + kFixedChunks);
    if (cost < best_cost) best = {splits, false}, best_cost = cost;
  }
  for (int splits = 2; splits <= std::min(useful, kMaxClusterSplits); ++splits) {
    if (!cluster_fits(splits)) continue;
    const int64_t cost = waves(splits, cluster_resident[splits]) * (busiest_warp(splits) + kFixedClusterChunks);
    if (cost < best_cost) best = {splits, true}, best_cost = cost;
  }
  return best;
}

// A TMA ring's split plan for a call and the CTAs the device runs at once with it, which
// cuda_decode.cu's ring choice compares.
struct RingWave {
  int64_t ctas;  // the plan's CTAs: split_ctas x splits
  int splits;
  int resident;  // CTAs resident over all SMs
  // Whether the plan's CTAs all run at once, in one wave.
  bool runs_one_wave() const { return ctas <= resident; }
  // Whether they also fill at least 90% of that wave.
  bool fills_one_wave() const { return runs_one_wave() && 10 * ctas >= 9 * static_cast<int64_t>(resident); }
};

// The split count alone, for a loop without the cluster merge.
inline int choose_num_splits(int requested, int64_t ctas, int resident, int seqlen_k, int step) {
  return choose_split_plan(requested, ctas, resident, nullptr, seqlen_k, step).splits;
}

}  // namespace tileattn::cuda::decode
