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

// Whether sequence b's cu_seqlens / seqused_k entries obey validate_sequence_lengths' rules: its
// rows inside the packed tensors and no longer than max_seqlen, its seqused_k within its keys.  The
// CPU backend checks the arrays on the host; on CUDA they stay unread there (a read would sync and
// break CUDA-graph capture), so every kernel that reads a sequence's rows skips a sequence for which
// this is false (no read or write out of bounds), and poison_out_of_bounds_forward / _backward
// (cuda/index_poison.h) then write NaN over every output of the call.  A separate test rather than
// an emptied SequenceView: computed into the view, the selects kept its fields in registers through
// the FA2 backward's main loop, which then spilled (0 -> 194 spill instructions at d64).
TILEATTN_HOST_DEVICE bool sequence_in_bounds(const tileattn_fwd_params& p, int b) {
  int64_t keys = p.seqlen_k;
  if (p.cu_seqlens_q != nullptr) {
    const int64_t q0 = p.cu_seqlens_q[b], q1 = p.cu_seqlens_q[b + 1];
    const int64_t k0 = p.cu_seqlens_k[b], k1 = p.cu_seqlens_k[b + 1];
    if (q0 < 0 || q1 < q0 || q1 > p.total_q || q1 - q0 > p.seqlen_q) return false;
    if (k0 < 0 || k1 < k0 || k1 > p.total_k || k1 - k0 > p.seqlen_k) return false;
    keys = k1 - k0;
  }
  return p.seqused_k == nullptr || (p.seqused_k[b] >= 0 && p.seqused_k[b] <= keys);
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
