// What the dispatcher (cuda_forward.cu) sees of the kernels: the per-bucket entry points, declared
// without any CuTe type so that the dispatcher compiles fast.  The generated translation units
// define them; fwd_instances.inc (generated too) lists those that were built.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "common/fast_divisor.h"
#include "tileattn/tileattn.hpp"

namespace tileattn::cuda {

// Where K/V rows come from on the KV-cache route (decode/kvcache_forward_route.h), read by the sm90
// family's sequence-bounds kernels only: sequence b's keys are cache entry batch_idx[b] (NULL: b),
// or, with block_table, its key row r lies in page block_table[entry * table_stride + r /
// page_size], k/v being the (num_units, page_size, Hk, D) pages.  num_units: cache
// entries or pages (the K/V tensors' batch extent); 0 when unused.  query_heads_packed: divisor
// g >= 2 when q's rows are a KV group's g query heads token by token (row r is token r / g:
// sm90/packed_heads_sm90.h), 1 otherwise.
struct KvIndex {
  const int32_t* batch_idx;
  const int32_t* block_table;
  int64_t table_stride;
  int page_size;
  int num_units;
  FastDivisor query_heads_packed;
};

// Host-resolved values the kernel needs beside the params.
struct FwdKernelArgs {
  ForwardParams params;
  KvIndex kv;  // all zero outside the KV-cache route
  float scale_log2;    // softmax_scale * log2(e) (plain scores) or log2(e) (transformed scores)
  float output_scale;  // 1 / (1 - dropout_p), or 1
  uint32_t dropout_threshold;
};

struct FwdVariant {
  bool transformed_scores;  // softcap, ALiBi or a negative softmax scale
  bool dropout;
};

template <int kHeadDim, typename Element>
void run_fwd(const FwdKernelArgs& args, const FwdVariant& variant, cudaStream_t stream);

template <int kHeadDim, typename Element>
int fwd_smem_bytes();

}  // namespace tileattn::cuda
