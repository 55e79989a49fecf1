// The loud end of a CUDA call whose cu_seqlens or seqused_k break the rules that the CPU backend
// checks on the host (validate_sequence_lengths).  On CUDA those arrays stay unread on the host (a
// read would sync, and break CUDA-graph capture); the kernels treat such a sequence as empty
// (sequence_in_bounds), so nothing is read or written out of bounds, and this kernel then
// writes NaN over every output of the call, as the decode kernels do for a bad cache index.  A
// varlen call's outputs are one packed tensor, whose rows the bad entries no longer place, so all
// of it goes, not one sequence's rows.
#pragma once

#include <cuda_runtime.h>

#include "tileattn/tileattn.hpp"

namespace tileattn::cuda {

// After the forward's kernels: out, softmax_lse and attn_probs.  Launches only for calls with
// cu_seqlens or seqused_k (one small kernel that reads them: ~2 us); a no-op otherwise.
void poison_out_of_bounds_forward(const ForwardParams& p, cudaStream_t stream);

// After the backward's kernels: dq, dk and dv.
void poison_out_of_bounds_backward(const BackwardParams& p, cudaStream_t stream);

}  // namespace tileattn::cuda
