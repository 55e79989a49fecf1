// The CUDA forward's kernel choice and launches (cuda_forward.cu), apart from its entry point's
// checks and the poison of bad index arrays, for a caller that checks the sequences its own way:
// the KV-cache calls with many query rows (decode/kvcache_forward_route.h).
#pragma once

#include "cuda/launch_api.h"
#include "tileattn/tileattn.hpp"

namespace tileattn::cuda {

// Runs the forward for params the entry point has checked (device pointers, a non-empty call whose
// grid fits): the sm90 family where it serves the call, else the sm80 family, else the fallback
// kernel, then attn_probs when asked.  A sequence whose cu_seqlens / seqused_k entries break the
// rules (sequence_in_bounds) is skipped: nothing of it is read or written.  `kv` (launch_api.h):
// K/V read through cache_batch_idx or pages, which only the sm90 family's sequence-bounds kernels
// do: the caller asks sm90_forward_serves first (an internal error otherwise).
void run_forward_kernels(const ForwardParams& params, const KvIndex& kv = {});

// Whether the sm90 family serves these params on this device (TILEATTN_FORWARD_FAMILY, alignment,
// strides, the built buckets).
bool sm90_forward_serves(const ForwardParams& params);

}  // namespace tileattn::cuda
