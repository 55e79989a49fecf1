// K and V of one forward call packed once into the AMX operand layouts (cpu/amx_bf16.h), one block
// per (sequence, KV head, key tile of kFwdBlockN keys): K as the pairs layout of K^T (for S = Q K^T),
// V as the pairs layout of V (for O += P V).  Packing per query tile instead would convert every
// K/V tile once for each query tile that reads it, 2 x 128 x D conversions against 2 x 256 x 128 x D
// multiply-adds that AMX runs in a few microseconds: the packing would cost as much as the products.
// Packed once, it is O(N D) per call; keys past a sequence's end are zeros, so no NaN in unused
// rows (seqused_k, a partial last tile) can reach a product.
#pragma once

#include <cstdint>
#include <vector>

#include "api/backends.h"
#include "cpu/score_tile.h"
#include "cpu/scratch_array.h"
#include "cpu/tile_io.h"

namespace tileattn::cpu {

class PackedKeyTiles {
 public:
  // k and v: the call's key-side tensors, of kv_dtype elements (their batch/row/head strides, and
  // page map where they are pages).
  PackedKeyTiles(const ForwardParams& p, tileattn_dtype kv_dtype, const StridedRows& k, const StridedRows& v);

  int depth() const { return depth_; }      // padded head dim of S = Q K^T, a multiple of 32
  int columns() const { return columns_; }  // padded head dim of O, a multiple of 16

  // The blocks of key tile `tile` (keys tile * kFwdBlockN ...) of sequence b, KV head head_k.
  // K block: depth() / 2 pair rows of 2 kFwdBlockN; V block: kFwdBlockN / 2 pair rows of 2 columns().
  const uint16_t* k_block(int b, int head_k, int tile) const { return k_.data() + block(b, head_k, tile) * k_block_size(); }
  const uint16_t* v_block(int b, int head_k, int tile) const { return v_.data() + block(b, head_k, tile) * v_block_size(); }

 private:
  int64_t block(int b, int head_k, int tile) const { return (tiles_.first[b] + tile) * heads_k_ + head_k; }
  int64_t k_block_size() const { return static_cast<int64_t>(depth_) * kFwdBlockN; }
  int64_t v_block_size() const { return static_cast<int64_t>(kFwdBlockN) * columns_; }

  int depth_, columns_, heads_k_;
  SequenceTiles tiles_;  // the sequences' key tiles of kFwdBlockN
  ScratchArray<uint16_t> k_, v_;  // every element written by the packing, padding included
};

}  // namespace tileattn::cpu
