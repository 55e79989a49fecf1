// The token of a query row when a KV group's g query heads are packed into the rows token by token
// (row r = token t * g + head j; sm90/packed_heads_sm90.h), compiled for the host too
// (tests/cpp/test_row_tokens.cpp).  g is the constant 1 outside the sequence-bounds kernels, where
// token() folds to the row and the code stays what it was.  On the packed path a row's token is a
// multiply-shift (FastDivisor) and a select: the first form divided with `/`, a ~25-instruction
// sequence each, and its 38 divisions grew each bounds kernel by ~1,300 SASS lines.
#pragma once

#include "common/fast_divisor.h"
#include "common/host_device.h"

namespace tileattn::cuda::sm90 {

struct RowTokens {
  int g;
  FastDivisor divisor;  // of g
  // Rows above a shifted first tile are negative, down to -(block_m - 1) >= -191 (sm90_tile_first_row),
  // so the division runs on row + 256 g, which is never negative, and takes 256 back off: floor(row / g).
  static constexpr int kRowBias = 256;

  TILEATTN_HOST_DEVICE int token(int row) const { return g == 1 ? row : divisor.div(row + kRowBias * g) - kRowBias; }
  // Tokens of a sequence of `rows` rows (a multiple of g).
  TILEATTN_HOST_DEVICE int tokens(int rows) const { return g == 1 ? rows : divisor.div(rows); }
};

}  // namespace tileattn::cuda::sm90
