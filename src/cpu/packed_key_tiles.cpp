#include "cpu/packed_key_tiles.h"

#include <algorithm>

#include "cpu/amx_bf16.h"
#include "cpu/parallel.h"

namespace tileattn::cpu {

// The AMX depth step is 32 bf16 and a tile of P is kFwdBlockN keys deep, so whole steps cover it.
static_assert(kFwdBlockN % amx::kDepthPerStep == 0, "key tiles must be whole AMX depth steps");

PackedKeyTiles::PackedKeyTiles(const ForwardParams& p, const StridedRows& k, const StridedRows& v)
    : depth_(amx::round_up(p.head_dim, amx::kDepthPerStep)),
      columns_(amx::round_up(p.head_dim, amx::kColsPerTile)),
      heads_k_(p.num_heads_k),
      first_tile_(p.batch + 1, 0) {
  for (int b = 0; b < p.batch; ++b) first_tile_[b + 1] = first_tile_[b] + ceil_div(sequence_view(p, b).seqlen_k, kFwdBlockN);
  const int64_t blocks = first_tile_[p.batch] * heads_k_;
  k_.resize(blocks * k_block_size());
  v_.resize(blocks * v_block_size());

  // One task per (sequence, key tile), all KV heads: each row's heads lie next to each other.
  struct Rows {
    std::vector<float> tile;
  };
  const int dim = p.head_dim;
  parallel_tasks<Rows>(
      first_tile_[p.batch], p.num_threads, [&] { return Rows{std::vector<float>(kFwdBlockN * dim)}; },
      [&](int64_t task, Rows& w) {
        const int b = static_cast<int>(std::upper_bound(first_tile_.begin(), first_tile_.end(), task) - first_tile_.begin()) - 1;
        const int tile = static_cast<int>(task - first_tile_[b]);
        const SequenceView seq = sequence_view(p, b);
        const int row0 = tile * kFwdBlockN, keys = std::min(kFwdBlockN, seq.seqlen_k - row0);
        for (int h = 0; h < heads_k_; ++h) {
          uint16_t* k_out = k_.data() + block(b, h, tile) * k_block_size();
          uint16_t* v_out = v_.data() + block(b, h, tile) * v_block_size();
          load_tile(p.dtype, k, seq, row0, keys, h, dim, w.tile.data());
          amx::pack_pairs_transposed(w.tile.data(), dim, keys, dim, kFwdBlockN, depth_, k_out);
          load_tile(p.dtype, v, seq, row0, keys, h, dim, w.tile.data());
          amx::pack_pairs(w.tile.data(), dim, keys, dim, kFwdBlockN, columns_, v_out);
        }
      });
}

}  // namespace tileattn::cpu
