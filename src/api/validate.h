// Every rule the Params structs imply, checked in one place for every backend.  Each failure
// throws tileattn::Error naming the argument and the values involved.
#pragma once

#include <cstdint>
#include <vector>

#include "tileattn/tileattn.hpp"

namespace tileattn {

// Rules that read only the struct (sizes, strides, dtypes, options): cheap, run on every call.
void validate_forward(const ForwardParams& p);
void validate_backward(const BackwardParams& p);
void validate_kvcache(const KvCacheParams& p);

// Rules on the contents of cu_seqlens_q/k and seqused_k.  They read those arrays, so they need
// host memory: the CPU backend runs them; on CUDA the kernels apply them per sequence instead
// (sequence_in_bounds in common/sequence.h) and a call that breaks one gets NaN outputs, unless
// TILEATTN_CHECK_CONTENTS=on runs them on host copies (host_index_copy.h).
void validate_sequence_lengths(const ForwardParams& p);

// Rules on the contents of cache_seqlens, cache_batch_idx, cache_leftpad and block_table (host
// memory, as above), the slots an append writes included (append_slots.h).
void validate_kvcache_contents(const KvCacheParams& p);

// The cache lengths of a kvcache call that gives them through fwd.cu_seqlens_k and seqused_k
// (after checking those arrays' rules; host memory) or as one uniform cache_seqlen instead of the
// cache_seqlens array (tileattn.h), for the host code that reads cache_seqlens[b]; empty where
// the call gives the array.
std::vector<int32_t> cache_lengths_array(const KvCacheParams& p);

// p with `lengths` as its cache_seqlens array (cu_seqlens_k, seqused_k and the uniform length
// cleared); `lengths` must outlive the result.
KvCacheParams with_cache_lengths(const KvCacheParams& p, const std::vector<int32_t>& lengths);

}  // namespace tileattn
