// KV-cache calls on the forward kernels: the route's rules and its lengths kernel
// (kvcache_forward_route.h says why).
#include "cuda/decode/kvcache_forward_route.h"

#include "common/env_choice.h"
#include "cuda/check.h"
#include "cuda/decode/decode_args.h"

namespace tileattn::cuda::decode {
namespace {

// Measured on an H100 (kvcache_forward_route.h): the forward 1.35x the decode kernels at 16 rows a
// sequence (64 a KV group of 4), behind them at one row.
constexpr int kRouteMinSeqlenQ = 16;
constexpr int kRouteMinGroupRows = 64;

constexpr int kLengthThreads = 256;
constexpr uint16_t kNan16 = 0x7fff;  // NaN in both float16 and bfloat16

// One CTA a sequence.  Launched in stream order after the append kernel (not programmatically), so
// cache_seqlens and the caches are settled.
__global__ void __launch_bounds__(kLengthThreads) route_lengths_kernel(const tileattn_kvcache_params p,
                                                                       int32_t* lengths) {
  const int b = blockIdx.x;
  const SequenceKeys seq = sequence_keys(p, b);
  if (threadIdx.x == 0) lengths[b] = seq.ok ? seq.end : -1;
  if (seq.ok) return;
  const tileattn_fwd_params& f = p.fwd;
  const int64_t elements = static_cast<int64_t>(f.seqlen_q) * f.num_heads * f.head_dim;
  uint16_t* out = static_cast<uint16_t*>(f.out);
  for (int64_t i = threadIdx.x; i < elements; i += kLengthThreads) {
    const int64_t d = i % f.head_dim, h = i / f.head_dim % f.num_heads, r = i / (int64_t{f.head_dim} * f.num_heads);
    out[b * f.out_batch_stride + r * f.out_row_stride + h * f.out_head_stride + d] = kNan16;
  }
  for (int64_t i = threadIdx.x; i < static_cast<int64_t>(f.seqlen_q) * f.num_heads; i += kLengthThreads) {
    const int64_t r = i % f.seqlen_q, h = i / f.seqlen_q;
    f.softmax_lse[b * f.lse_batch_stride + h * f.lse_head_stride + r] = __int_as_float(0x7fffffff);
  }
}

}  // namespace

bool forward_route_possible(const KvCacheParams& p) {
  const ForwardParams& f = p.fwd;
  return p.cache_seqlens != nullptr && p.block_table == nullptr && p.cache_batch_idx == nullptr &&
         p.cache_leftpad == nullptr && p.rotary_cos == nullptr && f.cu_seqlens_q == nullptr &&
         f.cu_seqlens_k == nullptr && f.seqused_k == nullptr && p.num_splits == 0;
}

bool forward_route_taken(const KvCacheParams& p) {
  const int choice = env_choice("TILEATTN_KVCACHE_FORWARD", {"auto", "on", "off"});
  if (choice == 2 || !forward_route_possible(p)) return false;
  if (choice == 1) return true;
  const int64_t group_rows = static_cast<int64_t>(p.fwd.num_heads / p.fwd.num_heads_k) * p.fwd.seqlen_q;
  return p.fwd.seqlen_q >= kRouteMinSeqlenQ && group_rows >= kRouteMinGroupRows;
}

int64_t forward_route_workspace_bytes(const KvCacheParams& p) {
  if (!forward_route_possible(p)) return 0;
  return (static_cast<int64_t>(p.fwd.batch) * sizeof(int32_t) + 255) / 256 * 256;
}

void launch_route_lengths(const KvCacheParams& p, int32_t* lengths, cudaStream_t stream) {
  route_lengths_kernel<<<p.fwd.batch, kLengthThreads, 0, stream>>>(p, lengths);
  check_cuda(cudaGetLastError(), "KV-cache route lengths kernel launch");
}

ForwardParams forward_route_params(const KvCacheParams& p, const int32_t* lengths) {
  ForwardParams f = p.fwd;
  f.seqused_k = lengths;
  return f;
}

}  // namespace tileattn::cuda::decode
