// How many splits of the keys a decode call uses.  Shapes only, never cache_seqlens' contents:
// reading those would sync the host with the device and break CUDA-graph capture, and a choice
// that depends on shapes alone replays correctly however the lengths change.
#pragma once

#include <algorithm>
#include <cmath>

#include "cuda/decode/decode_args.h"

namespace tileattn::cuda::decode {

// requested > 0 is honoured (clamped to [1, useful]) and, being independent of the batch, gives
// batch-invariant results.  requested == 0: the `ctas` = batch x KV heads x row blocks CTAs of
// one split run `resident` at a time, each streaming its keys at a rate set by its bytes in
// flight, so the call takes about ceil(waves) CTA lifetimes.  Pick the fewest splits whose last
// wave is at least 90% full (FA2's wave-efficiency rule; 1 x 8 heads at 32k keys: 45 splits, one
// wave of 360 of the 396 slots), else the fullest, but keep >= 4 chunks (one per
// warp) in each split of the longest possible cache.  A split of one chunk a warp waits out one
// memory latency instead of two: 1 x 2k gets 32 splits instead of 16.  `step`: the keys of a
// chunk (16 for the register loop, the TMA loop's block size for it).
inline int choose_num_splits(int requested, int64_t ctas, int resident, int seqlen_k, int step) {
  const int chunks = std::max(1, (seqlen_k + step - 1) / step);
  if (requested > 0) return std::min({requested, kMaxSplits, chunks});
  const int useful = std::max(1, std::min(kMaxSplits, chunks / kWarps));
  int best = 1;
  double best_efficiency = 0.0;
  for (int splits = 1; splits <= useful; ++splits) {
    const double waves = static_cast<double>(ctas) * splits / resident;
    const double efficiency = waves / std::ceil(waves);
    if (efficiency >= 0.9) return splits;
    if (efficiency > best_efficiency) best = splits, best_efficiency = efficiency;
  }
  return best;
}

}  // namespace tileattn::cuda::decode
