#include "cuda/simple_kernels.h"

#include <cutlass/numeric_types.h>

#include "common/mask.h"
#include "common/philox.h"
#include "common/sequence.h"
#include "cuda/check.h"

namespace tileattn::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kMaxDimsPerLane = 256 / 32;  // head_dim <= 256

template <typename Element>
__device__ float load_float(const void* base, int64_t index) {
  return static_cast<float>(static_cast<const Element*>(base)[index]);
}

// The score of (row, col) in natural units: tileattn.h's formula.
template <typename Element>
__device__ float score_at(const ForwardParams& p, const SequenceView& seq, int b, int h, int kv_head,
                          int row, int col) {
  const int64_t q_base = q_offset(seq, p.q_batch_stride, p.q_row_stride, p.q_head_stride, row, h);
  const int64_t k_base = k_offset(seq, p.k_batch_stride, p.k_row_stride, p.k_head_stride, col, kv_head);
  float dot = 0.f;
  for (int d = 0; d < p.head_dim; ++d) {
    dot += load_float<Element>(p.q, q_base + d) * load_float<Element>(p.k, k_base + d);
  }
  float s = dot * p.softmax_scale;
  if (p.softcap > 0.f) s = p.softcap * tanhf(s / p.softcap);
  if (p.alibi_slopes != nullptr) {
    s -= p.alibi_slopes[b * p.alibi_batch_stride + h] * alibi_distance(row, col, seq.seqlen_q, seq.seqlen_k);
  }
  return s;
}

struct RowCoords {
  int b, h, row, lane;
};
__device__ RowCoords row_coords() {
  return RowCoords{static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.z),
                   static_cast<int>(blockIdx.x * kWarpsPerBlock + threadIdx.x / 32),
                   static_cast<int>(threadIdx.x % 32)};
}

// attn_probs[b, h, row, col] = exp(s - lse), negated where dropout drops it, 0 where masked or
// outside this sequence's (seqlen_q, seqlen_k).
template <typename Element>
__global__ void attn_probs_kernel(const FwdKernelArgs args) {
  const ForwardParams& p = args.params;
  const RowCoords rc = row_coords();
  if (rc.row >= p.seqlen_q || !sequence_in_bounds(p, rc.b)) return;  // index_poison.h fills those
  const SequenceView seq = sequence_view(p, rc.b);
  const int kv_head = rc.h / (p.num_heads / p.num_heads_k);
  float* out = p.attn_probs + rc.b * p.probs_batch_stride + rc.h * p.probs_head_stride +
               static_cast<int64_t>(rc.row) * p.probs_row_stride;
  const bool row_valid = rc.row < seq.seqlen_q;
  const float lse = row_valid ? p.softmax_lse[lse_offset(p, seq, rc.row, rc.h)] : INFINITY;
  const ColumnRange visible = row_valid ? visible_columns(rc.row, seq.seqlen_q, seq.seqlen_k,
                                                          p.window_left, p.window_right)
                                        : ColumnRange{0, -1};
  for (int col = rc.lane; col < p.seqlen_k; col += 32) {
    float prob = 0.f;
    if (col >= visible.first && col <= visible.last) {
      prob = expf(score_at<Element>(p, seq, rc.b, rc.h, kv_head, rc.row, col) - lse);
      if (p.dropout_p > 0.f &&
          !dropout_keep(p.philox_seed, p.philox_offset, rc.b, rc.h, p.num_heads, rc.row, col,
                        args.dropout_threshold)) {
        prob = -prob;
      }
    }
    out[col] = prob;
  }
}

// One warp per row: 32 columns at a time, each lane scoring one column, then every lane
// accumulating its head-dim slice (dims lane, lane + 32, ...) of P V.
template <typename Element>
__global__ void fallback_forward_kernel(const FwdKernelArgs args) {
  const ForwardParams& p = args.params;
  const RowCoords rc = row_coords();
  if (!sequence_in_bounds(p, rc.b)) return;  // bad cu_seqlens / seqused_k: index_poison.h
  const SequenceView seq = sequence_view(p, rc.b);
  if (rc.row >= seq.seqlen_q) return;
  const int kv_head = rc.h / (p.num_heads / p.num_heads_k);
  const ColumnRange visible =
      visible_columns(rc.row, seq.seqlen_q, seq.seqlen_k, p.window_left, p.window_right);
  float acc[kMaxDimsPerLane] = {};
  float row_max = -INFINITY, row_sum = 0.f;
  for (int base = visible.first; base <= visible.last; base += 32) {
    const int col = base + rc.lane;
    const bool valid = col <= visible.last;
    const float s = valid ? score_at<Element>(p, seq, rc.b, rc.h, kv_head, rc.row, col) : -INFINITY;
    float chunk_max = s;
    for (int o = 16; o > 0; o /= 2) chunk_max = fmaxf(chunk_max, __shfl_xor_sync(0xffffffffu, chunk_max, o));
    const float new_max = fmaxf(row_max, chunk_max);  // finite: lane 0's column is visible
    const float correction = expf(row_max - new_max);
    float prob = valid ? expf(s - new_max) : 0.f;
    float chunk_sum = prob;
    for (int o = 16; o > 0; o /= 2) chunk_sum += __shfl_xor_sync(0xffffffffu, chunk_sum, o);
    row_sum = row_sum * correction + chunk_sum;
    row_max = new_max;
    if (valid && p.dropout_p > 0.f &&
        !dropout_keep(p.philox_seed, p.philox_offset, rc.b, rc.h, p.num_heads, rc.row, col,
                      args.dropout_threshold)) {
      prob = 0.f;
    }
    for (int t = 0; t < kMaxDimsPerLane; ++t) acc[t] *= correction;
    const int columns = min(32, visible.last - base + 1);
    for (int j = 0; j < columns; ++j) {
      const float pj = __shfl_sync(0xffffffffu, prob, j);
      const int64_t v_base =
          k_offset(seq, p.v_batch_stride, p.v_row_stride, p.v_head_stride, base + j, kv_head);
      for (int t = 0; t < kMaxDimsPerLane; ++t) {
        const int d = rc.lane + 32 * t;
        if (d < p.head_dim) acc[t] += pj * load_float<Element>(p.v, v_base + d);
      }
    }
  }
  const bool empty = row_sum == 0.f;  // a NaN sum (a NaN score) is not empty: O and LSE come out NaN
  const float inv = empty ? 0.f : args.output_scale / row_sum;
  Element* out = static_cast<Element*>(p.out) +
                 q_offset(seq, p.out_batch_stride, p.out_row_stride, p.out_head_stride, rc.row, rc.h);
  for (int t = 0; t < kMaxDimsPerLane; ++t) {
    const int d = rc.lane + 32 * t;
    if (d < p.head_dim) out[d] = static_cast<Element>(acc[t] * inv);
  }
  if (rc.lane == 0) p.softmax_lse[lse_offset(p, seq, rc.row, rc.h)] = empty ? INFINITY : row_max + logf(row_sum);
}

dim3 row_grid(const ForwardParams& p) {
  return dim3((p.seqlen_q + kWarpsPerBlock - 1) / kWarpsPerBlock, p.batch, p.num_heads);
}

}  // namespace

void launch_attn_probs(const FwdKernelArgs& args, cudaStream_t stream) {
  if (args.params.dtype == TILEATTN_FLOAT16) {
    attn_probs_kernel<cutlass::half_t><<<row_grid(args.params), kWarpsPerBlock * 32, 0, stream>>>(args);
  } else {
    attn_probs_kernel<cutlass::bfloat16_t><<<row_grid(args.params), kWarpsPerBlock * 32, 0, stream>>>(args);
  }
  check_cuda(cudaGetLastError(), "attn_probs kernel launch");
}

void launch_fallback_forward(const FwdKernelArgs& args, cudaStream_t stream) {
  if (args.params.dtype == TILEATTN_FLOAT16) {
    fallback_forward_kernel<cutlass::half_t><<<row_grid(args.params), kWarpsPerBlock * 32, 0, stream>>>(args);
  } else {
    fallback_forward_kernel<cutlass::bfloat16_t><<<row_grid(args.params), kWarpsPerBlock * 32, 0, stream>>>(args);
  }
  check_cuda(cudaGetLastError(), "fallback forward kernel launch");
}

}  // namespace tileattn::cuda
