// flash_attn_with_kvcache with packed query rows (cu_seqlens_q) on the CPU.
#pragma once

#include "api/backends.h"

namespace tileattn::cpu {

// p as for cpu_forward_kvcache, with p.fwd.cu_seqlens_q set (validated: no append, no rotary).
void forward_kvcache_packed_q(const KvCacheParams& p);

}  // namespace tileattn::cpu
