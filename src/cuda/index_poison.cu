#include "cuda/index_poison.h"

#include <algorithm>
#include <cstdint>

#include "common/sequence.h"
#include "cuda/check.h"

namespace tileattn::cuda {
namespace {

// One output as (batches, rows, heads, inner) with element strides; inner is contiguous.
struct NanTarget {
  void* ptr = nullptr;
  int element_bytes = 0;  // 2 (fp16/bf16) or 4 (float32)
  uint32_t nan_bits = 0;  // the dtype's quiet NaN
  int64_t batches = 0, rows = 0, heads = 0, inner = 0;
  int64_t batch_stride = 0, row_stride = 0, head_stride = 0;
};

constexpr int kMaxTargets = 3;
constexpr int kThreads = 256;
// Every block of a valid call reads the B + 1 index entries and returns, so few of them: 32 blocks
// write a bad call's outputs at a fraction of the bandwidth, which only such a call pays.
constexpr int kMaxBlocks = 32;

struct PoisonArgs {
  tileattn_fwd_params f;  // the call's sizes and index arrays
  NanTarget targets[kMaxTargets];
  int num_targets = 0;
};

uint32_t nan_bits(tileattn_dtype dtype) {
  return dtype == TILEATTN_FLOAT16 ? 0x7E00u : dtype == TILEATTN_BFLOAT16 ? 0x7FC0u : 0x7FC00000u;
}

__global__ void __launch_bounds__(kThreads) poison_kernel(const __grid_constant__ PoisonArgs args) {
  // Every block decides alone (no grid-wide sync): the index arrays are B + 1 ints, from L2.
  bool bad = false;
  for (int b = threadIdx.x; b < args.f.batch; b += kThreads) bad = bad || !sequence_in_bounds(args.f, b);
  if (!__syncthreads_or(bad)) return;
  for (int t = 0; t < args.num_targets; ++t) {
    const NanTarget& x = args.targets[t];
    const int64_t count = x.batches * x.rows * x.heads * x.inner;
    for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < count; i += int64_t{gridDim.x} * kThreads) {
      int64_t rest = i;
      const int64_t e = rest % x.inner;
      rest /= x.inner;
      const int64_t h = rest % x.heads;
      rest /= x.heads;
      const int64_t r = rest % x.rows, b = rest / x.rows;
      const int64_t at = b * x.batch_stride + r * x.row_stride + h * x.head_stride + e;
      if (x.element_bytes == 2) {
        static_cast<uint16_t*>(x.ptr)[at] = static_cast<uint16_t>(x.nan_bits);
      } else {
        static_cast<uint32_t*>(x.ptr)[at] = x.nan_bits;
      }
    }
  }
}

bool reads_index_arrays(const ForwardParams& f) { return f.cu_seqlens_q != nullptr || f.seqused_k != nullptr; }

// A q- or k-shaped tensor of the call: (B, rows, heads, D), or one batch of total rows in varlen form.
NanTarget qkv_target(const ForwardParams& f, void* ptr, int64_t rows_per_batch, int64_t total_rows, int heads,
                     int64_t batch_stride, int64_t row_stride, int64_t head_stride) {
  const bool varlen = f.cu_seqlens_q != nullptr;
  NanTarget x;
  x.ptr = ptr;
  x.element_bytes = 2;
  x.nan_bits = nan_bits(f.dtype);
  x.batches = varlen ? 1 : f.batch;
  x.rows = varlen ? total_rows : rows_per_batch;
  x.heads = heads;
  x.inner = f.head_dim;
  x.batch_stride = batch_stride, x.row_stride = row_stride, x.head_stride = head_stride;
  return x;
}

void launch(const PoisonArgs& args, cudaStream_t stream) {
  int64_t largest = 0;
  for (int t = 0; t < args.num_targets; ++t) {
    const NanTarget& x = args.targets[t];
    largest = std::max(largest, x.batches * x.rows * x.heads * x.inner);
  }
  const int blocks = static_cast<int>(std::min<int64_t>(kMaxBlocks, std::max<int64_t>(1, (largest + kThreads - 1) / kThreads)));
  poison_kernel<<<blocks, kThreads, 0, stream>>>(args);
  check_cuda(cudaGetLastError(), "poison_kernel launch");
}

}  // namespace

void poison_out_of_bounds_forward(const ForwardParams& f, cudaStream_t stream) {
  if (!reads_index_arrays(f) || f.batch == 0) return;
  const bool varlen = f.cu_seqlens_q != nullptr;
  PoisonArgs args;
  args.f = f;
  args.targets[args.num_targets++] = qkv_target(f, f.out, f.seqlen_q, f.total_q, f.num_heads, f.out_batch_stride,
                                                f.out_row_stride, f.out_head_stride);
  NanTarget lse;
  lse.ptr = f.softmax_lse;
  lse.element_bytes = 4;
  lse.nan_bits = nan_bits(TILEATTN_FLOAT32);
  lse.batches = varlen ? 1 : f.batch;
  lse.rows = 1;
  lse.heads = f.num_heads;
  lse.inner = varlen ? f.total_q : f.seqlen_q;
  lse.batch_stride = f.lse_batch_stride, lse.head_stride = f.lse_head_stride;
  args.targets[args.num_targets++] = lse;
  if (f.attn_probs != nullptr) {
    NanTarget probs;
    probs.ptr = f.attn_probs;
    probs.element_bytes = 4;
    probs.nan_bits = nan_bits(TILEATTN_FLOAT32);
    probs.batches = f.batch, probs.rows = f.seqlen_q, probs.heads = f.num_heads, probs.inner = f.seqlen_k;
    probs.batch_stride = f.probs_batch_stride, probs.row_stride = f.probs_row_stride;
    probs.head_stride = f.probs_head_stride;
    args.targets[args.num_targets++] = probs;
  }
  launch(args, stream);
}

void poison_out_of_bounds_backward(const BackwardParams& p, cudaStream_t stream) {
  const ForwardParams& f = p.fwd;
  if (!reads_index_arrays(f) || f.batch == 0) return;
  PoisonArgs args;
  args.f = f;
  args.targets[args.num_targets++] = qkv_target(f, p.dq, f.seqlen_q, f.total_q, f.num_heads, p.dq_batch_stride,
                                                p.dq_row_stride, p.dq_head_stride);
  args.targets[args.num_targets++] = qkv_target(f, p.dk, f.seqlen_k, f.total_k, f.num_heads_k, p.dk_batch_stride,
                                                p.dk_row_stride, p.dk_head_stride);
  args.targets[args.num_targets++] = qkv_target(f, p.dv, f.seqlen_k, f.total_k, f.num_heads_k, p.dv_batch_stride,
                                                p.dv_row_stride, p.dv_head_stride);
  launch(args, stream);
}

}  // namespace tileattn::cuda
