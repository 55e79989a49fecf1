// K and V of one forward call laid out once as the SIMD products' B operands
// (cpu/simd_product.h), one block per (sequence, KV head, key tile of kFwdBlockN keys): K^T as
// dim rows of kFwdBlockN keys (for S = Q K^T) and V as kFwdBlockN rows of dim floats (for
// O += P V), rows simd::padded_ld apart.  Every query tile of the head reads them; laid out per
// query tile they would cost what sgemm's packing did.  V is copied even where it is float32
// already: its rows lie H_k x D floats apart in the caller's tensor (4 KB at 8 x 128), all in the
// same few L1 sets, and O += P V read so ran 0.78x its speed on contiguous rows (one core, D128).
// Keys past a sequence's end are zeros.
#pragma once

#include <cstdint>

#include "api/backends.h"
#include "cpu/score_tile.h"
#include "cpu/scratch_array.h"
#include "cpu/simd_product.h"
#include "cpu/tile_io.h"

namespace tileattn::cpu {

class Float32KeyTiles {
 public:
  // k and v: the call's key-side tensors, of kv_dtype elements; K^T made by kernels.transpose.
  Float32KeyTiles(const ForwardParams& p, tileattn_dtype kv_dtype, const StridedRows& k, const StridedRows& v,
                  const simd::Kernels& kernels);

  // The blocks of key tile `tile` (keys tile * kFwdBlockN ...) of sequence b, KV head head_k:
  // K^T with rows kt_ld() floats apart, V with rows v_ld() apart.
  const float* kt_block(int b, int head_k, int tile) const { return k_.data() + block(b, head_k, tile) * kt_size(); }
  const float* v_block(int b, int head_k, int tile) const { return v_.data() + block(b, head_k, tile) * v_size(); }
  int64_t kt_ld() const { return kt_ld_; }
  int64_t v_ld() const { return v_ld_; }

 private:
  int64_t block(int b, int head_k, int tile) const { return (tiles_.first[b] + tile) * heads_k_ + head_k; }
  int64_t kt_size() const { return dim_ * kt_ld_; }
  int64_t v_size() const { return kFwdBlockN * v_ld_; }

  int dim_, heads_k_;
  int64_t kt_ld_, v_ld_;
  SequenceTiles tiles_;  // the sequences' key tiles of kFwdBlockN
  ScratchArray<float> k_, v_;  // every element written, padding keys and columns included
};

}  // namespace tileattn::cpu
