// Q and dO of one backward call packed once into AMX operands (cpu/amx_bf16.h), one block each per
// (sequence, query head, query tile of kBwdBlockM rows): as rows (the A of S = Q K^T and
// dP = dO V^T) and transposed (the A of dK^T += Q^T dS and dV^T += dO^T P, which take dS and P in
// the pairs layout, an interleave of two rows, instead of the transpose that dK += dS^T Q would
// need on every tile pair).  Every key tile of a task reads every query tile, so packing once
// turns O(N^2 D / kBwdBlockN) conversions into O(N D).  Rows past a sequence's end are zeros.
#pragma once

#include <cstdint>
#include <vector>

#include "api/backends.h"
#include "cpu/score_tile.h"
#include "cpu/scratch_array.h"
#include "cpu/tile_io.h"

namespace tileattn::cpu {

class PackedQueryTiles {
 public:
  // q and dout: the call's q-shaped tensors, of p.dtype elements (their strides).
  PackedQueryTiles(const ForwardParams& p, const StridedRows& q, const StridedRows& dout);

  int depth() const { return depth_; }      // head dim padded to 32: the rows' length
  int columns() const { return columns_; }  // head dim padded to 16: the transposed blocks' rows

  enum Block { kQ, kDout, kQTransposed, kDoutTransposed };
  // kQ, kDout: kBwdBlockM rows of depth(); the transposed: columns() rows of kBwdBlockM.
  const uint16_t* block(Block which, int b, int head, int tile) const { return data_.data() + offset(which, b, head, tile); }

 private:
  int64_t offset(Block which, int b, int head, int tile) const {
    return (((tiles_.first[b] + tile) * heads_ + head) * 4 + which) * block_size_;
  }

  int depth_, columns_, heads_;
  int64_t block_size_;                // elements of the largest block
  SequenceTiles tiles_;              // the sequences' query tiles of kBwdBlockM
  ScratchArray<uint16_t> data_;       // the blocks' padding written too; their unused tails never read
};

}  // namespace tileattn::cpu
