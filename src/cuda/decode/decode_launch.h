// Host side of the CUDA decode: the launcher each dtype instantiates (decode_bf16.cu,
// decode_fp16.cu), called by cuda_forward_kvcache once the arguments are checked and resolved.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/decode/decode_args.h"
#include "cuda/decode/split_heuristic.h"  // RingWave
#include "tileattn/tileattn.hpp"

namespace tileattn::cuda::decode {

// Appends (when k_new is given), picks num_splits, runs the split kernel and, with more than one
// split, the combine kernel, all on `stream`.  args.num_splits holds the caller's request.
template <typename T>
void run_decode(DecodeArgs args, cudaStream_t stream);

// The append kernel alone: k_new/v_new written into the cache (run_decode's first step, and
// kvcache_forward_route.h's calls, which then attend on the forward kernels).
template <typename T>
void run_append(const DecodeArgs& args, cudaStream_t stream);

// A caller's workspace smaller than the `bytes` the call's kernels need is refused, naming it,
// before anything is launched (an append would already have written the cache).  None given: the
// library takes its own.
inline void require_workspace(const tileattn_kvcache_params& p, int64_t bytes) {
  if (p.workspace != nullptr && p.workspace_bytes < bytes) {
    throw Error(ErrorCode::kInvalidArgument, "workspace",
                "the call needs " + std::to_string(bytes) + " bytes of workspace, got " +
                    std::to_string(p.workspace_bytes) + " (tileattn_kvcache_workspace_size)");
  }
}

// Bytes of workspace run_decode may need for these args (args.tma: whether the TMA kernel is
// possible for the call), the most over the kernels it could pick; 0 when none splits.
template <typename T>
int64_t workspace_bytes(const DecodeArgs& args);

// The plan of the TMA loop `loop` (kLoopRing, kLoopWideRing, kLoopRingThree) for these args
// (the wide and three-CTA rings at d128 only; elsewhere the narrow ring's).
template <typename T>
RingWave ring_wave(const DecodeArgs& args, int loop);

}  // namespace tileattn::cuda::decode
