// Moving tiles between the strided storage tensors and the operands the CPU backend computes on.
#pragma once

#include <algorithm>
#include <limits>
#include <vector>

#include "common/sequence.h"
#include "cpu/convert.h"
#include "cpu/gemm.h"

namespace tileattn::cpu {

// A paged KV cache seen as one tensor of rows: row r is slot r % capacity of block-table row
// r / capacity (capacity = max_blocks x page_size keys), which lives in page
// block_table[(r / capacity) * table_stride + (r % capacity) / page_size] at slot r % page_size.
// So the forward addresses a sequence's cache positions as rows from its table row's first, as it
// does a contiguous cache's entries, and reads the pages where they lie.
struct PageMap {
  const int32_t* block_table;
  int64_t table_stride, capacity;
  int page_size;

  // page_stride: elements from one page of the tensor to the next (its batch stride).
  int64_t row_offset(int64_t row, int64_t page_stride, int64_t row_stride) const {
    const int64_t pos = row % capacity;
    const int64_t page = block_table[row / capacity * table_stride + pos / page_size];
    return page * page_stride + pos % page_size * row_stride;
  }
};

// A q-, k- or v-shaped tensor: its data and int64 element strides (head dim contiguous).
struct StridedRows {
  const void* data;
  int64_t batch_stride, row_stride, head_stride;
  bool key_side;  // rows count from the sequence's first key row instead of its first query row
  const PageMap* pages = nullptr;  // key rows in pages; batch_stride then steps a page

  int64_t offset(const SequenceView& s, int row, int head) const {
    if (pages != nullptr) return pages->row_offset(s.k_base_row + row, batch_stride, row_stride) + head * head_stride;
    return key_side ? k_offset(s, batch_stride, row_stride, head_stride, row, head)
                    : q_offset(s, batch_stride, row_stride, head_stride, row, head);
  }
};

// How many rows ahead of the one it converts load_tile requests a row's cache lines.  One head's
// rows lie row_stride apart (H x D or Hk x D elements: 2 KB in a d128 cache of 8 KV heads), a few
// lines then a jump, which the hardware prefetchers do not follow: a bf16 decode of 1 x 32k spent
// 85% of its conversion time on the loads' cache misses (Zen 3).  Eight rows read the same, sixteen
// slower (docs/perf-log.md, session 49).
constexpr int kPrefetchRowsAhead = 4;

// dst (rows x dim, rows dst_ld apart; dim when 0) <- rows row0 .. row0 + rows - 1 of one head, as
// float32.
inline void load_tile(tileattn_dtype dtype, const StridedRows& src, const SequenceView& s, int row0,
                      int rows, int head, int dim, float* dst, int64_t dst_ld = 0) {
  if (dst_ld == 0) dst_ld = dim;
  const int64_t element = dtype == TILEATTN_FLOAT32 ? 4 : 2;
  const char* base = static_cast<const char*>(src.data);
  for (int r = 0; r < rows; ++r) {
    if (r + kPrefetchRowsAhead < rows) {
      const char* ahead = base + src.offset(s, row0 + r + kPrefetchRowsAhead, head) * element;
      for (int64_t byte = 0; byte < dim * element; byte += 64) __builtin_prefetch(ahead + byte);
    }
    load_row(dtype, src.data, src.offset(s, row0 + r, head), dim, dst + r * dst_ld);
  }
}

// The same rows converted into `dst` with rows `ld` apart (the SIMD products' padded B rows).
inline Matrix padded_tile(tileattn_dtype dtype, const StridedRows& src, const SequenceView& s, int row0, int rows,
                          int head, int dim, float* dst, int64_t ld) {
  load_tile(dtype, src, s, row0, rows, head, dim, dst, ld);
  return Matrix{dst, ld};
}

// The addresses of rows row0 .. row0 + rows - 1 of one head where they lie, for kernels that read
// rows one by one (any stride and element type): a contiguous cache's one stride apart, a paged
// cache's a page's run at a time (a page lookup and four 64-bit divisions a run of up to page_size
// rows, not a row: tens of cycles each, against ~150 to stream a 512-byte row at 10 GB/s).
inline void row_addresses(tileattn_dtype dtype, const StridedRows& src, const SequenceView& s, int row0, int rows,
                          int head, const void** out) {
  const int64_t element = dtype == TILEATTN_FLOAT32 ? 4 : 2;
  const char* base = static_cast<const char*>(src.data);
  for (int r = 0; r < rows;) {
    int run = rows - r;
    if (src.pages != nullptr) {
      const int64_t slot = (s.k_base_row + row0 + r) % src.pages->capacity % src.pages->page_size;
      run = static_cast<int>(std::min<int64_t>(run, src.pages->page_size - slot));
    }
    const char* first = base + src.offset(s, row0 + r, head) * element;
    for (int i = 0; i < run; ++i) out[r + i] = first + i * src.row_stride * element;
    r += run;
  }
}

// The same rows as a product operand.  float32 storage is used in place (its row stride becomes
// the operand's leading dim); other dtypes are converted into `scratch`.
inline Matrix tile_operand(tileattn_dtype dtype, const StridedRows& src, const SequenceView& s,
                           int row0, int rows, int head, int dim, float* scratch) {
  const bool in_place = dtype == TILEATTN_FLOAT32 && rows > 0 && src.pages == nullptr && src.row_stride >= dim &&
                        src.row_stride <= std::numeric_limits<int32_t>::max();
  if (!in_place) {
    load_tile(dtype, src, s, row0, rows, head, dim, scratch);
    return Matrix{scratch, dim};
  }
  return Matrix{static_cast<const float*>(src.data) + src.offset(s, row0, head), src.row_stride};
}

// Rows of a tensor we write, from src rows src_ld floats apart.
inline void store_tile(tileattn_dtype dtype, const float* src, int src_ld, int rows, int dim, void* data,
                       const StridedRows& layout, const SequenceView& s, int row0, int head) {
  for (int r = 0; r < rows; ++r) {
    store_row(dtype, src + static_cast<int64_t>(r) * src_ld, dim, data, layout.offset(s, row0 + r, head));
  }
}

inline int ceil_div(int a, int b) { return (a + b - 1) / b; }

// The query or key tiles of a call's sequences laid end to end, for work spread one task per
// (tile, head): first[b] is sequence b's first tile, first[batch] the count of all.
struct SequenceTiles {
  std::vector<int64_t> first;

  SequenceTiles(const tileattn_fwd_params& p, bool keys, int block) : first(p.batch + 1, 0) {
    for (int b = 0; b < p.batch; ++b) {
      const SequenceView s = sequence_view(p, b);
      first[b + 1] = first[b] + ceil_div(keys ? s.seqlen_k : s.seqlen_q, block);
    }
  }
  int64_t count() const { return first.back(); }

  struct Task {
    int b, tile, head;
  };
  // Task `index` of count() x heads, head fastest.  A sequence without tiles is never the answer:
  // upper_bound passes over its equal entry.
  Task task(int64_t index, int heads) const {
    const int64_t tile_index = index / heads;
    const int b = static_cast<int>(std::upper_bound(first.begin(), first.end(), tile_index) - first.begin()) - 1;
    return {b, static_cast<int>(tile_index - first[b]), static_cast<int>(index % heads)};
  }
};

}  // namespace tileattn::cpu
