// Host copies of a call's index arrays (cu_seqlens_q/k, seqused_k, cache_seqlens, cache_batch_idx,
// cache_leftpad, block_table), for checking a CUDA call's contents with the rules the CPU backend
// applies (validate.h) when TILEATTN_CHECK_CONTENTS=on.  Without it those arrays stay unread on the
// host, since reading them waits for the stream and cannot be captured into a CUDA graph, and the
// kernels turn a bad entry into NaN outputs instead of an error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tileattn/tileattn.hpp"

namespace tileattn {

// Copies `bytes` from `source` (device memory) to `destination` (host) once the work queued on
// `stream` before it has run; throws tileattn::Error on failure.
using CopyToHost = void (*)(void* destination, const void* source, size_t bytes, void* stream);

// params() is the call's params with every index array it holds replaced by a host copy of the
// entries the content rules read: B + 1 of each cu_seqlens, B of the per-sequence arrays, and the
// block table's rows from the first to the last entry of the last row,
// (num_cache_entries - 1) * block_table_batch_stride + max_blocks.  The params must have passed
// validate_forward / validate_kvcache, which bound those counts.
class HostIndexCopy {
 public:
  HostIndexCopy(const ForwardParams& params, CopyToHost copy);
  HostIndexCopy(const KvCacheParams& params, CopyToHost copy);
  HostIndexCopy(const HostIndexCopy&) = delete;  // the params point into this object's storage
  HostIndexCopy& operator=(const HostIndexCopy&) = delete;

  const ForwardParams& forward_params() const { return kv_.fwd; }
  const KvCacheParams& kvcache_params() const { return kv_; }

 private:
  // Replaces *array with a host copy of its first `count` entries; a null array stays null.
  void mirror(const int32_t** array, int64_t count, CopyToHost copy);
  void mirror_sequence_arrays(CopyToHost copy);

  KvCacheParams kv_;  // a forward call's params live in kv_.fwd, the rest unused
  std::vector<std::vector<int32_t>> storage_;
};

}  // namespace tileattn
