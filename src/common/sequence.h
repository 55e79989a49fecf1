// Where one sequence of the batch lives: its lengths and its first packed row.  Batch form and
// varlen form resolve to the same description, so kernels index rows one way.
#pragma once

#include <stdint.h>

#include "common/host_device.h"
#include "tileattn/tileattn.h"

namespace tileattn {

struct SequenceView {
  int seqlen_q;  // query rows of this sequence
  int seqlen_k;  // keys it attends to (seqused_k applied)
  int64_t q_base_row;  // first packed row (varlen), 0 in batch form
  int64_t k_base_row;
  int64_t q_batch;     // the batch index used with batch strides (0 in varlen form)
};

// Pointers are read where the call runs: host memory on the CPU backend, device memory in kernels.
TILEATTN_HOST_DEVICE SequenceView sequence_view(const tileattn_fwd_params& p, int b) {
  SequenceView s;
  if (p.cu_seqlens_q != nullptr) {
    s.q_base_row = p.cu_seqlens_q[b];
    s.k_base_row = p.cu_seqlens_k[b];
    s.seqlen_q = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
    s.seqlen_k = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
    s.q_batch = 0;
  } else {
    s.q_base_row = 0;
    s.k_base_row = 0;
    s.seqlen_q = p.seqlen_q;
    s.seqlen_k = p.seqlen_k;
    s.q_batch = b;
  }
  if (p.seqused_k != nullptr) s.seqlen_k = p.seqused_k[b];
  return s;
}

// Element offset of (row, head) of a tensor with the given strides, for sequence s.
TILEATTN_HOST_DEVICE int64_t q_offset(const SequenceView& s, int64_t batch_stride,
                                      int64_t row_stride, int64_t head_stride, int row, int head) {
  return s.q_batch * batch_stride + (s.q_base_row + row) * row_stride + head * head_stride;
}
TILEATTN_HOST_DEVICE int64_t k_offset(const SequenceView& s, int64_t batch_stride,
                                      int64_t row_stride, int64_t head_stride, int row, int head) {
  return s.q_batch * batch_stride + (s.k_base_row + row) * row_stride + head * head_stride;
}
// softmax_lse: (B, H, Sq) in batch form, (H, total_q) in varlen form.
TILEATTN_HOST_DEVICE int64_t lse_offset(const tileattn_fwd_params& p, const SequenceView& s,
                                        int row, int head) {
  return s.q_batch * p.lse_batch_stride + head * p.lse_head_stride + s.q_base_row + row;
}

// Row index of (sequence, row) in a packed (rows, ...) work buffer that holds every query row of
// the call: cu_seqlens_q[b] + row in varlen form, b * seqlen_q + row in batch form.
TILEATTN_HOST_DEVICE int64_t packed_q_row(const tileattn_fwd_params& p, const SequenceView& s, int row) {
  return s.q_batch * p.seqlen_q + s.q_base_row + row;
}
TILEATTN_HOST_DEVICE int64_t packed_k_row(const tileattn_fwd_params& p, const SequenceView& s, int row) {
  return s.q_batch * p.seqlen_k + s.k_base_row + row;
}

}  // namespace tileattn
