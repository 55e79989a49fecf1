#include "api/host_index_copy.h"

namespace tileattn {

// storage_ may reallocate as arrays are added: its vectors move, and a moved vector keeps its
// buffer, so the pointers already handed out stay valid.
void HostIndexCopy::mirror(const int32_t** array, int64_t count, CopyToHost copy) {
  if (*array == nullptr) return;
  std::vector<int32_t>& host = storage_.emplace_back(static_cast<size_t>(count));
  if (count > 0) copy(host.data(), *array, static_cast<size_t>(count) * sizeof(int32_t), kv_.fwd.stream);
  *array = host.data();
}

void HostIndexCopy::mirror_sequence_arrays(CopyToHost copy) {
  ForwardParams& f = kv_.fwd;
  mirror(&f.cu_seqlens_q, f.batch + 1, copy);
  mirror(&f.cu_seqlens_k, f.batch + 1, copy);
  mirror(&f.seqused_k, f.batch, copy);
}

HostIndexCopy::HostIndexCopy(const ForwardParams& params, CopyToHost copy) {
  kv_.fwd = params;
  mirror_sequence_arrays(copy);
}

HostIndexCopy::HostIndexCopy(const KvCacheParams& params, CopyToHost copy) : kv_(params) {
  mirror_sequence_arrays(copy);
  const int batch = kv_.fwd.batch;
  mirror(&kv_.cache_seqlens, batch, copy);
  mirror(&kv_.cache_batch_idx, batch, copy);
  mirror(&kv_.cache_leftpad, batch, copy);
  if (kv_.num_cache_entries > 0) {
    mirror(&kv_.block_table,
           static_cast<int64_t>(kv_.num_cache_entries - 1) * kv_.block_table_batch_stride + kv_.max_blocks, copy);
  }
}

}  // namespace tileattn
