// float32 copies of bfloat16/float16 inputs, made once per call.  Converting a K or V tile for
// every query tile that reads it cost about a quarter of the bfloat16 forward (two conversions of
// 128 x D elements against 64 x 128 x D x 4 FLOPs per tile pair); one pass over each input costs
// O(N D), and the tiles are then read in place by sgemm like float32 inputs.
#pragma once

#include "cpu/parallel.h"
#include "cpu/scratch_array.h"
#include "cpu/tile_io.h"

namespace tileattn::cpu {

struct Float32Rows {
  ScratchArray<float> storage;  // empty when the input already was float32; every element written
  StridedRows rows;             // float32 data and strides to read
};

// batches x rows_per_batch x heads x dim elements of `src` (varlen: batches = 1, all rows).
inline Float32Rows float32_rows(tileattn_dtype dtype, const StridedRows& src, int batches,
                                int64_t rows_per_batch, int heads, int dim, int num_threads) {
  Float32Rows out;
  if (dtype == TILEATTN_FLOAT32) {
    out.rows = src;
    return out;
  }
  out.storage = ScratchArray<float>(static_cast<size_t>(batches) * rows_per_batch * heads * dim);
  const int64_t row_stride = static_cast<int64_t>(heads) * dim;
  out.rows = StridedRows{out.storage.data(), rows_per_batch * row_stride, row_stride, dim, src.key_side};
  struct None {};
  parallel_tasks<None>(
      static_cast<int64_t>(batches) * rows_per_batch, num_threads, [] { return None{}; },
      [&](int64_t task, None&) {
        const int64_t b = task / rows_per_batch, r = task % rows_per_batch;
        for (int h = 0; h < heads; ++h) {
          const int64_t from = b * src.batch_stride + r * src.row_stride + h * src.head_stride;
          load_row(dtype, src.data, from, dim, out.storage.data() + task * row_stride + h * dim);
        }
      });
  return out;
}

// A q-shaped (query_side) or k/v-shaped tensor of the call as float32 rows.
inline Float32Rows float32_operand(const ForwardParams& p, const void* data, int64_t batch_stride,
                                   int64_t row_stride, int64_t head_stride, bool key_side) {
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int64_t rows = key_side ? (varlen ? p.total_k : p.seqlen_k) : (varlen ? p.total_q : p.seqlen_q);
  return float32_rows(p.dtype, StridedRows{data, batch_stride, row_stride, head_stride, key_side},
                      varlen ? 1 : p.batch, rows, key_side ? p.num_heads_k : p.num_heads, p.head_dim,
                      p.num_threads);
}

}  // namespace tileattn::cpu
