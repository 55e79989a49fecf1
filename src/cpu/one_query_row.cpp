// The ordinary forward (flash_attn_func, flash_attn_varlen_func) where no sequence has more than
// one query row: a decode step of a model that passes its keys and values whole instead of through
// flash_attn_with_kvcache (Hugging Face's flash-attention path does).  The general forward lays K
// and V out once for all query tiles (a pass over the whole cache) and then reads them once per
// query head; here they are read in place once per KV group, as the KV-cache decode does: a group's
// query heads become rows of their KV head (FlashAttention's seqlen_q / groups swap), and the
// products are the KV-cache decode's (choose_kv_products).  1 x 32k, 32/8 heads, d128, fp32: 81 ms
// on the general path, 7.7 here (2 cores).
#include "cpu/one_query_row.h"

#include <cstddef>
#include <memory>

#include "cpu/forward_kv_tiles.h"
#include "cpu/parallel.h"
#include "cpu/tile_io.h"

namespace tileattn::cpu {
namespace {

// Float32 rows in the swapped layout: packed query row r's head h = kv * group + g is row
// r * group + g of KV head kv, (rows, Hk, D).  A sequence's row count in varlen form is 0 or 1.
struct SwappedRows {
  int group, heads_k, dim;
  int64_t offset(int64_t packed_row, int head) const {
    return ((packed_row * group + head % group) * heads_k + head / group) * dim;
  }
};

// Query row 0 of sequence b as a packed row: b in batch form, cu_seqlens_q[b] in varlen form.
int64_t packed_row(const ForwardParams& p, int b) {
  return p.cu_seqlens_q != nullptr ? p.cu_seqlens_q[b] : b;
}

bool has_row(const ForwardParams& p, int b) {
  return p.cu_seqlens_q == nullptr || p.cu_seqlens_q[b + 1] > p.cu_seqlens_q[b];
}

}  // namespace

bool one_query_row_applies(const ForwardParams& p) {
  // The swap gives a group's heads one key span and one score rule: bottom-right alignment puts a
  // lone row at the last key, so a causal mask or right window hides nothing, while a left window,
  // ALiBi (a slope a query head) and dropout (its mask drawn per query head and row) would differ
  // between the group's rows.  attn_probs keep the general path.
  return p.seqlen_q == 1 && p.window_left < 0 && p.alibi_slopes == nullptr && p.dropout_p == 0.0f &&
         p.attn_probs == nullptr;
}

void forward_one_query_row(const ForwardParams& p) {
  const int B = p.batch, H = p.num_heads, Hk = p.num_heads_k, D = p.head_dim, group = H / Hk;
  const int64_t rows = p.cu_seqlens_q != nullptr ? p.total_q : B;  // packed query rows
  const SwappedRows swapped{group, Hk, D};
  const size_t elements = static_cast<size_t>(rows) * H * D;
  std::unique_ptr<float[]> q(new float[elements]), out(new float[elements]);
  std::unique_ptr<float[]> lse(new float[static_cast<size_t>(rows) * H]);
  struct None {};
  parallel_tasks<None>(
      B, p.num_threads, [] { return None{}; },
      [&](int64_t b, None&) {
        if (!has_row(p, static_cast<int>(b))) return;
        const int64_t r = packed_row(p, static_cast<int>(b));
        const int64_t from = (p.cu_seqlens_q != nullptr ? r * p.q_row_stride : b * p.q_batch_stride);
        for (int h = 0; h < H; ++h) load_row(p.dtype, p.q, from + h * p.q_head_stride, D, q.get() + swapped.offset(r, h));
      });

  // The swapped call: `group` query rows a sequence over Hk heads, float32 q and out, K and V as
  // given; no mask (see one_query_row_applies).
  ForwardParams g = p;
  g.q = q.get(), g.out = out.get(), g.softmax_lse = lse.get();
  g.dtype = TILEATTN_FLOAT32;
  g.num_heads = Hk, g.seqlen_q = group;
  g.window_left = g.window_right = -1;
  g.q_row_stride = g.out_row_stride = static_cast<int64_t>(Hk) * D;
  g.q_head_stride = g.out_head_stride = D;
  g.q_batch_stride = g.out_batch_stride = static_cast<int64_t>(group) * Hk * D;
  g.lse_batch_stride = static_cast<int64_t>(Hk) * group;  // batch form: (B, Hk, group)
  g.lse_head_stride = group;
  std::unique_ptr<int32_t[]> cu_q;
  if (p.cu_seqlens_q != nullptr) {  // varlen form: sequence b's rows from cu_seqlens_q[b] * group
    cu_q.reset(new int32_t[B + 1]);
    for (int b = 0; b <= B; ++b) cu_q[b] = p.cu_seqlens_q[b] * group;
    g.cu_seqlens_q = cu_q.get();
    g.total_q = rows * group;
    g.lse_batch_stride = 0, g.lse_head_stride = g.total_q;  // (Hk, total_q * group)
  }
  forward_with_kv_tiles(g, p.dtype, nullptr, choose_kv_products(p.dtype, p.dtype, group, D, p.k_row_stride, false));

  for (int b = 0; b < B; ++b) {
    if (!has_row(p, b)) continue;
    const int64_t r = packed_row(p, b);
    const int64_t to = p.cu_seqlens_q != nullptr ? r * p.out_row_stride : b * p.out_batch_stride;
    const SequenceView seq = sequence_view(p, b);
    for (int h = 0; h < H; ++h) {
      const int64_t at = swapped.offset(r, h);
      store_row(p.dtype, out.get() + at, D, p.out, to + h * p.out_head_stride);
      // (row r * group + h % group, head h / group) of g's LSE.
      const int64_t row = r * group + h % group, head = h / group;
      const int64_t lse_at = p.cu_seqlens_q != nullptr ? head * g.lse_head_stride + row
                                                         : b * g.lse_batch_stride + head * g.lse_head_stride + h % group;
      p.softmax_lse[lse_offset(p, seq, 0, h)] = lse[lse_at];
    }
  }
}

}  // namespace tileattn::cpu
