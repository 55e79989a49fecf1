// Packed query rows through the batch-form KV-cache forward.  The rows are laid into a
// (B, S, H, D) block, S the longest sequence's rows (at most max_seqlen_q), with each sequence's L
// rows at the END of its S slots: the batch form aligns masks and ALiBi distances to the bottom
// right of an S x keys block, so slot S - L + i sees exactly the keys (j <= i + keys - L, and the
// window's left edge) row i of a sequence of L rows sees.  The leading slots hold zeros and their
// outputs are dropped: at most S - L wasted rows a sequence, which for the calls this serves
// (decode steps, a few speculative tokens) is a few rows against a cache of thousands of keys.
#include "cpu/kvcache_packed_q.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace tileattn::cpu {

void forward_kvcache_packed_q(const KvCacheParams& p) {
  const ForwardParams& f = p.fwd;
  // The slots a sequence needs are its own rows; max_seqlen_q is only an upper bound (often the
  // model's largest, far above a decode step's rows), so the block is sized by the longest
  // sequence instead (cu_seqlens_q's contents are checked before this runs).
  int longest = 0;
  for (int b = 0; b < f.batch; ++b) longest = std::max(longest, f.cu_seqlens_q[b + 1] - f.cu_seqlens_q[b]);
  if (longest == 0) return;  // no row: nothing to write (and no block of B x H x D to allocate)
  const int B = f.batch, S = std::min(f.seqlen_q, longest), H = f.num_heads, D = f.head_dim;
  const size_t element = f.dtype == TILEATTN_FLOAT32 ? 4 : 2;
  const int64_t row = static_cast<int64_t>(H) * D;  // elements of one block row
  std::vector<char> q_block(static_cast<size_t>(B) * S * row * element, 0);
  std::vector<char> out_block(q_block.size());
  std::vector<float> lse_block(static_cast<size_t>(B) * H * S);

  // (sequence b, slot) -> packed row, or -1 for a leading slot.
  auto packed_row = [&](int b, int slot) -> int64_t {
    const int first = S - (f.cu_seqlens_q[b + 1] - f.cu_seqlens_q[b]);
    return slot < first ? -1 : static_cast<int64_t>(f.cu_seqlens_q[b]) + slot - first;
  };
  for (int b = 0; b < B; ++b) {
    for (int slot = 0; slot < S; ++slot) {
      const int64_t r = packed_row(b, slot);
      if (r < 0) continue;
      for (int h = 0; h < H; ++h) {
        std::memcpy(q_block.data() + ((static_cast<int64_t>(b) * S + slot) * row + h * D) * element,
                    static_cast<const char*>(f.q) + (r * f.q_row_stride + h * f.q_head_stride) * element,
                    D * element);
      }
    }
  }

  KvCacheParams g = p;
  g.fwd.cu_seqlens_q = nullptr;
  g.fwd.seqlen_q = S;
  g.fwd.total_q = 0;
  g.fwd.q = q_block.data();
  g.fwd.out = out_block.data();
  g.fwd.softmax_lse = lse_block.data();
  g.fwd.q_batch_stride = g.fwd.out_batch_stride = S * row;
  g.fwd.q_row_stride = g.fwd.out_row_stride = row;
  g.fwd.q_head_stride = g.fwd.out_head_stride = D;
  g.fwd.lse_batch_stride = static_cast<int64_t>(H) * S;
  g.fwd.lse_head_stride = S;
  cpu_forward_kvcache(g);

  for (int b = 0; b < B; ++b) {
    for (int slot = 0; slot < S; ++slot) {
      const int64_t r = packed_row(b, slot);
      if (r < 0) continue;
      for (int h = 0; h < H; ++h) {
        std::memcpy(static_cast<char*>(f.out) + (r * f.out_row_stride + h * f.out_head_stride) * element,
                    out_block.data() + ((static_cast<int64_t>(b) * S + slot) * row + h * D) * element,
                    D * element);
        f.softmax_lse[h * f.lse_head_stride + r] = lse_block[(static_cast<size_t>(b) * H + h) * S + slot];
      }
    }
  }
}

}  // namespace tileattn::cpu
