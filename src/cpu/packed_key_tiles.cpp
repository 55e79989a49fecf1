#include "cpu/packed_key_tiles.h"

#include <algorithm>

#include "cpu/amx_bf16.h"
#include "cpu/parallel.h"

namespace tileattn::cpu {

// The AMX depth step is 32 bf16 and a tile of P is kFwdBlockN keys deep, so whole steps cover it.
static_assert(kFwdBlockN % amx::kDepthPerStep == 0, "key tiles must be whole AMX depth steps");

PackedKeyTiles::PackedKeyTiles(const ForwardParams& p, tileattn_dtype kv_dtype, const StridedRows& k, const StridedRows& v)
    : depth_(amx::round_up(p.head_dim, amx::kDepthPerStep)),
      columns_(amx::round_up(p.head_dim, amx::kColsPerTile)),
      heads_k_(p.num_heads_k),
      tiles_(p, true, kFwdBlockN) {
  const int64_t blocks = tiles_.count() * heads_k_;
  k_ = ScratchArray<uint16_t>(blocks * k_block_size());
  v_ = ScratchArray<uint16_t>(blocks * v_block_size());

  // One task per (sequence, key tile, KV head): a short call has fewer key tiles than threads
  // (S=128: one), and with a task per tile one thread packed while the others waited.
  const int dim = p.head_dim;
  parallel_tasks<ScratchArray<float>>(
      blocks, p.num_threads, [&] { return ScratchArray<float>(kFwdBlockN * dim); },
      [&](int64_t index, ScratchArray<float>& tile_rows) {
        const auto [b, tile, h] = tiles_.task(index, heads_k_);
        const SequenceView seq = sequence_view(p, b);
        const int row0 = tile * kFwdBlockN, keys = std::min(kFwdBlockN, seq.seqlen_k - row0);
        load_tile(kv_dtype, k, seq, row0, keys, h, dim, tile_rows.data());
        amx::pack_pairs_transposed(tile_rows.data(), dim, keys, dim, kFwdBlockN, depth_, k_.data() + block(b, h, tile) * k_block_size());
        load_tile(kv_dtype, v, seq, row0, keys, h, dim, tile_rows.data());
        amx::pack_pairs(tile_rows.data(), dim, keys, dim, kFwdBlockN, columns_, v_.data() + block(b, h, tile) * v_block_size());
      });
}

}  // namespace tileattn::cpu
