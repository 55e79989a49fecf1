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

inline int choose_num_splits(int requested, int64_t ctas, int resident, int seqlen_k, int step) {
  const int chunks = std::max(1, (seqlen_k + step - 1) / step);
  if (requested > 0) return std::min({requested, kMaxSplits, chunks});
  // Unsplit CTAs that already fill their waves to 90% (batch >= 32 x 8 KV heads) stay whole: the
  // model's gain from finer waves there is a few percent, less than it can resolve.
  const int64_t unsplit_waves = (ctas + resident - 1) / resident;
  if (ctas >= 0.9 * unsplit_waves * resident) return 1;
  const int useful = std::max(1, std::min(kMaxSplits, chunks / kWarps));
  int best = 1;
  int64_t best_cost = INT64_MAX;
  for (int splits = 1; splits <= useful; ++splits) {
    const int64_t waves = (ctas * splits + resident - 1) / resident;
    const int64_t busiest_warp = (chunks + int64_t{splits} * kWarps - 1) / (int64_t{splits} * kWarps);
    const int64_t cost = waves * (busiest_warp + kFixedChunks);
    if (cost < best_cost) best = splits, best_cost = cost;
  }
  return best;
}

}  // namespace tileattn::cuda::decode
