// The cache slots an append writes, checked against every slot the call reads.  Two sequences
// that share a cache entry (a repeated cache_batch_idx) or a page, where one of them appends,
// would race: the append of one lands while the other reads or writes the same slot, on the CPU
// backend's threads as on the GPU.  Prefix sharing stays legal: pages that several sequences
// read, while no sequence appends into them.
#pragma once

#include "tileattn/tileattn.hpp"

namespace tileattn {

// Host memory only (it reads cache_seqlens, cache_batch_idx, cache_leftpad and block_table), after
// validate_kvcache_contents has found every index in range.  Throws naming cache_batch_idx when
// the colliding sequences use one cache entry or block-table row, else block_table.
void check_append_slots(const KvCacheParams& p);

}  // namespace tileattn
