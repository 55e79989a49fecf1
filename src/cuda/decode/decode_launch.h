// Host side of the CUDA decode: the launcher each dtype instantiates (decode_bf16.cu,
// decode_fp16.cu), called by cuda_forward_kvcache once the arguments are checked and resolved.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/decode/decode_args.h"

namespace tileattn::cuda::decode {

// Appends (when k_new is given), picks num_splits, runs the split kernel and, with more than one
// split, the combine kernel, all on `stream`.  args.num_splits holds the caller's request.
template <typename T>
void run_decode(DecodeArgs args, cudaStream_t stream);

// Bytes of workspace run_decode may need for these args (args.tma: whether the TMA kernel is
// possible for the call), the most over the kernels it could pick; 0 when none splits.
template <typename T>
int64_t workspace_bytes(const DecodeArgs& args);

// Whether the wide ring's split plan for these args (d128) runs all its CTAs in one wave, one CTA
// an SM: where it does not, the split kernel's CTAs wait for a second wave that two narrow CTAs an
// SM would have run beside the first (cuda_decode.cu, wide_ring_chosen).
template <typename T>
bool wide_ring_runs_one_wave(const DecodeArgs& args);

}  // namespace tileattn::cuda::decode
