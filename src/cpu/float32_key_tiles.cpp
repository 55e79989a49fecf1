#include "cpu/float32_key_tiles.h"

#include <algorithm>

#include "cpu/parallel.h"

namespace tileattn::cpu {

Float32KeyTiles::Float32KeyTiles(const ForwardParams& p, tileattn_dtype kv_dtype, const StridedRows& k,
                                 const StridedRows& v, const simd::Kernels& kernels)
    : dim_(p.head_dim),
      heads_k_(p.num_heads_k),
      kt_ld_(simd::padded_ld(kFwdBlockN)),
      v_ld_(simd::padded_ld(p.head_dim)),
      tiles_(p, true, kFwdBlockN) {
  const int64_t blocks = tiles_.count() * heads_k_;
  k_ = ScratchArray<float>(blocks * kt_size());
  v_ = ScratchArray<float>(blocks * v_size());

  // One task per (sequence, key tile, KV head), as PackedKeyTiles: a short call has fewer key
  // tiles than threads.  The padding columns are zeroed too, so no block holds an unwritten float.
  const int dim = dim_;
  parallel_tasks<ScratchArray<float>>(
      blocks, p.num_threads, [&] { return ScratchArray<float>(kFwdBlockN * dim); },
      [&](int64_t index, ScratchArray<float>& key_rows) {
        const auto [b, tile, h] = tiles_.task(index, heads_k_);
        const SequenceView seq = sequence_view(p, b);
        const int row0 = tile * kFwdBlockN, keys = std::min(kFwdBlockN, seq.seqlen_k - row0);
        load_tile(kv_dtype, k, seq, row0, keys, h, dim, key_rows.data());
        std::fill(key_rows.data() + static_cast<int64_t>(keys) * dim, key_rows.data() + kFwdBlockN * dim, 0.0f);
        float* kt = k_.data() + block(b, h, tile) * kt_size();
        kernels.transpose(key_rows.data(), dim, kFwdBlockN, dim, kt, kt_ld_);
        for (int d = 0; d < dim; ++d) std::fill(kt + d * kt_ld_ + kFwdBlockN, kt + (d + 1) * kt_ld_, 0.0f);

        float* vb = v_.data() + block(b, h, tile) * v_size();
        load_tile(kv_dtype, v, seq, row0, keys, h, dim, vb, v_ld_);
        for (int key = 0; key < kFwdBlockN; ++key) {
          float* row = vb + key * v_ld_;
          std::fill(row + (key < keys ? dim : 0), row + v_ld_, 0.0f);
        }
      });
}

}  // namespace tileattn::cpu
