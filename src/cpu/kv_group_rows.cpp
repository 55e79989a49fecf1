// The ordinary forward (flash_attn_func, flash_attn_varlen_func) on calls of few query rows a
// sequence: a decode step or a few speculative tokens of a model that passes its keys and values
// whole instead of through flash_attn_with_kvcache (Hugging Face's flash-attention path does).  The
// general forward lays K and V out once for all query tiles (a pass over the whole cache) and then
// reads them once per query head; here a KV group's query heads become rows of their KV head
// (FlashAttention's seqlen_q / groups swap, rows (token i, head g) at i * group + g, a token's heads
// sharing its mask through ScoreRule::rows_per_position), so K and V are read in place once per
// group by the KV-cache decode's products (choose_kv_products).  1 x 32k, 32/8 heads, d128, fp32,
// one token: 81 ms on the general path, 7.7 here; 4 tokens 100 -> 22 (2 cores).
#include "cpu/kv_group_rows.h"

#include <climits>
#include <cstddef>
#include <memory>

#include "cpu/forward_kv_tiles.h"
#include "cpu/parallel.h"
#include "cpu/tile_io.h"

namespace tileattn::cpu {
namespace {

// q's packed rows: total_q in varlen form, batch x seqlen_q in batch form.
int64_t packed_query_rows(const ForwardParams& p) {
  return p.cu_seqlens_q != nullptr ? p.total_q : static_cast<int64_t>(p.batch) * p.seqlen_q;
}

}  // namespace

bool kv_group_rows_apply(const ForwardParams& p) {
  const int64_t group = p.num_heads / p.num_heads_k;
  // The swapped call's rows must stay int32 row indices, as cu_seqlens are.
  return kv_groups_as_rows(static_cast<int64_t>(p.seqlen_q) * group, p) &&
         packed_query_rows(p) * group <= INT32_MAX && p.attn_probs == nullptr;
}

void forward_kv_group_rows(const ForwardParams& p) {
  const int B = p.batch, H = p.num_heads, Hk = p.num_heads_k, D = p.head_dim, group = H / Hk;
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int64_t rows = packed_query_rows(p);
  const GroupRows swapped{group, Hk, D};
  const size_t elements = static_cast<size_t>(rows) * H * D;
  std::unique_ptr<float[]> q(new float[elements]), out(new float[elements]);
  std::unique_ptr<float[]> lse(new float[static_cast<size_t>(rows) * H]);
  // Sequence b's packed rows and where its row i lies in q and out.
  auto first_row = [&](int b) -> int64_t {
    return varlen ? p.cu_seqlens_q[b] : static_cast<int64_t>(b) * p.seqlen_q;
  };
  auto q_at = [&](int b, int i) {
    return varlen ? (first_row(b) + i) * p.q_row_stride : b * p.q_batch_stride + i * p.q_row_stride;
  };
  auto out_at = [&](int b, int i) {
    return varlen ? (first_row(b) + i) * p.out_row_stride : b * p.out_batch_stride + i * p.out_row_stride;
  };
  struct None {};
  parallel_tasks<None>(
      B, p.num_threads, [] { return None{}; },
      [&](int64_t task, None&) {
        const int b = static_cast<int>(task);
        for (int i = 0; i < sequence_view(p, b).seqlen_q; ++i) {
          for (int h = 0; h < H; ++h) {
            load_row(p.dtype, p.q, q_at(b, i) + h * p.q_head_stride, D, q.get() + swapped.offset(first_row(b) + i, h));
          }
        }
      });

  // The swapped call: `group` rows a token over Hk heads, float32 q and out, K and V as given, the
  // masks by token (rows_per_position).
  ForwardParams g = p;
  g.q = q.get(), g.out = out.get(), g.softmax_lse = lse.get();
  g.dtype = TILEATTN_FLOAT32;
  g.num_heads = Hk, g.seqlen_q = p.seqlen_q * group;
  g.q_row_stride = g.out_row_stride = static_cast<int64_t>(Hk) * D;
  g.q_head_stride = g.out_head_stride = D;
  g.q_batch_stride = g.out_batch_stride = static_cast<int64_t>(g.seqlen_q) * Hk * D;
  g.lse_batch_stride = static_cast<int64_t>(Hk) * g.seqlen_q;  // batch form: (B, Hk, Sq * group)
  g.lse_head_stride = g.seqlen_q;
  std::unique_ptr<int32_t[]> cu_q;
  if (varlen) {  // sequence b's rows from cu_seqlens_q[b] * group
    cu_q.reset(new int32_t[B + 1]);
    for (int b = 0; b <= B; ++b) cu_q[b] = p.cu_seqlens_q[b] * group;
    g.cu_seqlens_q = cu_q.get();
    g.total_q = rows * group;
    g.lse_batch_stride = 0, g.lse_head_stride = g.total_q;  // (Hk, total_q * group)
  }
  forward_with_kv_tiles(g, p.dtype, nullptr, choose_kv_products(p.dtype, p.dtype, g.seqlen_q, D),
                        group);

  for (int b = 0; b < B; ++b) {
    const SequenceView seq = sequence_view(p, b), swapped_seq = sequence_view(g, b);
    for (int i = 0; i < seq.seqlen_q; ++i) {
      for (int h = 0; h < H; ++h) {
        store_row(p.dtype, out.get() + swapped.offset(first_row(b) + i, h), D, p.out,
                  out_at(b, i) + h * p.out_head_stride);
        p.softmax_lse[lse_offset(p, seq, i, h)] = lse[lse_offset(g, swapped_seq, i * group + h % group, h / group)];
      }
    }
  }
}

}  // namespace tileattn::cpu
