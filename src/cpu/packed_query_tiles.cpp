#include "cpu/packed_query_tiles.h"

#include <algorithm>
#include <tuple>

#include "cpu/amx_bf16.h"
#include "cpu/parallel.h"

namespace tileattn::cpu {

// A transposed block's depth is a query tile's rows, so those must be whole AMX depth steps.
static_assert(kBwdBlockM % amx::kDepthPerStep == 0, "query tiles must be whole AMX depth steps");

PackedQueryTiles::PackedQueryTiles(const ForwardParams& p, const StridedRows& q, const StridedRows& dout)
    : depth_(amx::round_up(p.head_dim, amx::kDepthPerStep)),
      columns_(amx::round_up(p.head_dim, amx::kColsPerTile)),
      heads_(p.num_heads),
      block_size_(static_cast<int64_t>(kBwdBlockM) * std::max(depth_, columns_)),
      tiles_(p, false, kBwdBlockM) {
  data_ = ScratchArray<uint16_t>(tiles_.count() * heads_ * 4 * block_size_);

  const int dim = p.head_dim;
  parallel_tasks<ScratchArray<float>>(
      tiles_.count() * heads_, p.num_threads, [&] { return ScratchArray<float>(kBwdBlockM * dim); },
      [&](int64_t index, ScratchArray<float>& tile_rows) {
        const auto [b, tile, head] = tiles_.task(index, heads_);
        const SequenceView seq = sequence_view(p, b);
        const int row0 = tile * kBwdBlockM, rows = std::min(kBwdBlockM, seq.seqlen_q - row0);
        for (const auto& [source, as_rows, transposed] : {std::tuple{&q, kQ, kQTransposed}, std::tuple{&dout, kDout, kDoutTransposed}}) {
          load_tile(p.dtype, *source, seq, row0, rows, head, dim, tile_rows.data());
          amx::pack_rows(tile_rows.data(), dim, rows, dim, kBwdBlockM, depth_, data_.data() + offset(as_rows, b, head, tile), depth_);
          amx::pack_rows_transposed(tile_rows.data(), dim, rows, dim, columns_, kBwdBlockM,
                                    data_.data() + offset(transposed, b, head, tile), kBwdBlockM);
        }
      });
}

}  // namespace tileattn::cpu
