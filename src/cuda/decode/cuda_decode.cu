// tileattn::cuda_forward_kvcache: the checks only the CUDA side can make (architecture, device
// pointers, alignment, grid limits), then the decode launch for the dtype.  Nothing here reads
// device memory, so a call is one stream-ordered sequence that a CUDA graph can capture.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <utility>

#include "api/backends.h"
#include "cuda/check.h"
#include "cuda/decode/decode_launch.h"
#include "cuda/device_checks.h"

namespace tileattn {
namespace {

// 16-byte vectors of 8 elements need a 16-byte aligned base and strides of whole vectors.
bool vector_aligned(const void* ptr, int64_t batch_stride, int64_t row_stride, int64_t head_stride) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && batch_stride % 8 == 0 && row_stride % 8 == 0 &&
         head_stride % 8 == 0;
}

}  // namespace

void cuda_forward_kvcache(const KvCacheParams& p) {
  using namespace cuda;
  const ForwardParams& f = p.fwd;
  require_sm80();
  const std::pair<const void*, const char*> pointers[] = {
      {f.q, "q"}, {f.k, "k_cache"}, {f.v, "v_cache"}, {f.out, "out"}, {f.softmax_lse, "softmax_lse"},
      {f.alibi_slopes, "alibi_slopes"}, {p.cache_seqlens, "cache_seqlens"}, {p.cache_batch_idx, "cache_batch_idx"},
      {p.cache_leftpad, "cache_leftpad"}, {p.block_table, "block_table"}, {p.k_new, "k"}, {p.v_new, "v"},
      {p.rotary_cos, "rotary_cos"}, {p.rotary_sin, "rotary_sin"}};
  for (const auto& [ptr, name] : pointers) require_device_pointer(ptr, name);
  if (f.batch == 0 || f.seqlen_q == 0 || f.num_heads == 0) return;
  require_grid_fits(f);

  decode::DecodeArgs args{};
  args.p = p;
  args.group = f.num_heads / f.num_heads_k;
  args.rows = args.group * f.seqlen_q;
  args.row_blocks = (args.rows + decode::kRows - 1) / decode::kRows;
  args.num_splits = p.num_splits;
  if (static_cast<int64_t>(f.batch) * args.row_blocks > std::numeric_limits<int32_t>::max()) {
    throw Error(ErrorCode::kUnsupported, "q", "batch x ceil(H / Hk x seqlen_q / 16) must fit in 2^31 CUDA blocks");
  }
  args.vector_q = vector_aligned(f.q, f.q_batch_stride, f.q_row_stride, f.q_head_stride);
  args.vector_k = vector_aligned(f.k, f.k_batch_stride, f.k_row_stride, f.k_head_stride);
  args.vector_v = vector_aligned(f.v, f.v_batch_stride, f.v_row_stride, f.v_head_stride);
  const cudaStream_t stream = static_cast<cudaStream_t>(f.stream);
  if (f.dtype == TILEATTN_FLOAT16) {
    decode::run_decode<__half>(args, stream);
  } else if (f.dtype == TILEATTN_BFLOAT16) {
    decode::run_decode<__nv_bfloat16>(args, stream);
  } else {
    throw Error(ErrorCode::kDtype, "q", "the CUDA backend takes float16 or bfloat16");
  }
}

}  // namespace tileattn
