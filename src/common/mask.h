// Which key columns a query row may see: causal and sliding-window masks, bottom-right aligned so
// that the last query row lines up with the last key (flash-attn >= 2.1).  Shared by every backend.
#pragma once

#include "common/host_device.h"

namespace tileattn {

// The visible columns of one row form one interval [first, last] (empty when first > last).
struct ColumnRange {
  int first;
  int last;
};

// Row i sees column j when i + (Sk - Sq) - window_left <= j <= i + (Sk - Sq) + window_right,
// each bound dropped when its window is -1, and always 0 <= j < Sk.
TILEATTN_HOST_DEVICE ColumnRange visible_columns(int row, int seqlen_q, int seqlen_k,
                                                 int window_left, int window_right) {
  const long long diagonal = static_cast<long long>(row) + seqlen_k - seqlen_q;
  long long first = 0;
  long long last = seqlen_k - 1;
  if (window_left >= 0 && diagonal - window_left > first) first = diagonal - window_left;
  if (window_right >= 0 && diagonal + window_right < last) last = diagonal + window_right;
  if (first > last) return ColumnRange{0, -1};
  return ColumnRange{static_cast<int>(first), static_cast<int>(last)};
}

// |i + Sk - Sq - j|: the ALiBi distance; the bias is -slope * distance.
TILEATTN_HOST_DEVICE float alibi_distance(int row, int col, int seqlen_q, int seqlen_k) {
  const long long d = static_cast<long long>(row) + seqlen_k - seqlen_q - col;
  return static_cast<float>(d < 0 ? -d : d);
}

}  // namespace tileattn
