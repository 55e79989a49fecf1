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
      first_tile_(p.batch + 1, 0) {
  for (int b = 0; b < p.batch; ++b) first_tile_[b + 1] = first_tile_[b] + ceil_div(sequence_view(p, b).seqlen_q, kBwdBlockM);
  data_ = ScratchArray<uint16_t>(first_tile_[p.batch] * heads_ * 4 * block_size_);

  const int dim = p.head_dim;
  parallel_tasks<std::vector<float>>(
      first_tile_[p.batch] * heads_, p.num_threads, [&] { return std::vector<float>(kBwdBlockM * dim); },
      [&](int64_t task, std::vector<float>& tile_rows) {
        const int64_t tile_index = task / heads_;
        const int head = static_cast<int>(task % heads_);
        const int b = sequence_of_tile(first_tile_, tile_index);
        const int tile = static_cast<int>(tile_index - first_tile_[b]);
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
