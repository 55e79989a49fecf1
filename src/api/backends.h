// The entry points each backend implements.  They receive params that src/api has validated and
// resolved (softmax_scale filled in), and may assume every rule in validate.h holds.
#pragma once

#include "tileattn/tileattn.hpp"

namespace tileattn {

void cpu_forward(const ForwardParams& params);
void cpu_backward(const BackwardParams& params);
void cpu_forward_kvcache(const KvCacheParams& params);

#ifdef TILEATTN_WITH_CUDA
void cuda_forward(const ForwardParams& params);
void cuda_backward(const BackwardParams& params);
// The most workspace the kernel sequences cuda_backward could pick for these shapes need.
int64_t cuda_backward_workspace_size(const BackwardParams& params);
void cuda_forward_kvcache(const KvCacheParams& params);
// The most workspace any kernel sequence cuda_forward_kvcache could pick for these shapes needs.
int64_t cuda_kvcache_workspace_size(const KvCacheParams& params);
// A CopyToHost (host_index_copy.h) on the call's stream; refuses a stream that is being captured.
void cuda_copy_to_host(void* destination, const void* source, size_t bytes, void* stream);
#endif

}  // namespace tileattn
