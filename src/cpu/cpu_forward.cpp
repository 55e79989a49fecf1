// The CPU forward: FlashAttention-2's Algorithm 1 on float32 tiles.  One task owns one query tile
// of one (batch, head) and sweeps the key tiles it can see, keeping only kFwdBlockM x kFwdBlockN scores
// alive at a time; no seqlen^2 buffer exists.
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "api/backends.h"
#include "cpu/dropout.h"
#include "cpu/forward_kv_tiles.h"
#include "cpu/float32_copy.h"
#include "cpu/gemm.h"
#include "cpu/online_softmax.h"
#include "cpu/parallel.h"
#include "cpu/score_tile.h"
#include "cpu/tile_io.h"
#include "cpu/vector_math.h"

namespace tileattn {
namespace cpu {
namespace {

struct ForwardScratch {
  std::vector<float> q, k, v, scores, out;  // q, k, v hold converted tiles (not float32)
  std::vector<RowSoftmax> rows;

  explicit ForwardScratch(int dim)
      : q(kFwdBlockM * dim), k(kFwdBlockN * dim), v(kFwdBlockN * dim), scores(kFwdBlockM * kFwdBlockN),
        out(kFwdBlockM * dim), rows(kFwdBlockM) {}
};

struct QueryTile {
  int batch_index, head, row0;
};

// q, k and v as rows to read: float32 (copies of bfloat16/float16 inputs, made once), or k and v
// in their own dtype (kv_dtype), converted tile by tile as they are read.
struct Inputs {
  Float32Rows q, k, v;
  tileattn_dtype kv_dtype = TILEATTN_FLOAT32;
};

StridedRows rows_of(const void* data, int64_t b, int64_t r, int64_t h, bool key_side) {
  return StridedRows{data, b, r, h, key_side};
}

// attn_probs for one finished query tile: P = 2^(t - lse * log2 e), dropped entries negated.
void write_probs(const ForwardParams& p, const ScoreRule& rule, const KeySpan& span,
                 const DropoutRule& dropout, const QueryTile& tile, int rows, const Matrix& q_tile,
                 const StridedRows& k, tileattn_dtype kv_dtype, const SequenceView& seq, int head_k,
                 ForwardScratch& w) {
  const int dim = p.head_dim;
  for (int col0 = span.first; col0 <= span.last; col0 += kFwdBlockN) {
    const int cols = std::min(kFwdBlockN, span.last + 1 - col0);
    const Matrix k_tile = tile_operand(kv_dtype, k, seq, col0, cols, head_k, dim, w.k.data());
    gemm_nt(rows, cols, dim, q_tile, k_tile, 0.0f, w.scores.data(), kFwdBlockN);
    finish_scores(rule, w.scores.data(), kFwdBlockN, tile.row0, rows, col0, cols, true, nullptr);
    for (int r = 0; r < rows; ++r) {
      float* prob = w.scores.data() + r * kFwdBlockN;
      exp2_shifted(prob, w.rows[r].lse() * kLog2e, cols, prob);
      if (dropout.enabled) dropout.apply_row(prob, tile.row0 + r, col0, cols, true);
      float* dst = p.attn_probs + tile.batch_index * p.probs_batch_stride +
                   tile.head * p.probs_head_stride + (tile.row0 + r) * p.probs_row_stride + col0;
      std::memcpy(dst, prob, sizeof(float) * cols);
    }
  }
}

void forward_tile(const ForwardParams& p, const Inputs& in, const QueryTile& tile, ForwardScratch& w) {
  const SequenceView seq = sequence_view(p, tile.batch_index);
  const int dim = p.head_dim;
  const int rows = std::min(kFwdBlockM, seq.seqlen_q - tile.row0);
  const int head_k = tile.head / (p.num_heads / p.num_heads_k);
  const StridedRows& q = in.q.rows;
  const StridedRows& k = in.k.rows;
  const StridedRows& v = in.v.rows;
  const ScoreRule rule = make_score_rule(p, seq, tile.batch_index, tile.head);
  const DropoutRule dropout = DropoutRule::make(p, tile.batch_index, tile.head);

  const Matrix q_tile = tile_operand(TILEATTN_FLOAT32, q, seq, tile.row0, rows, tile.head, dim, w.q.data());
  std::fill(w.out.begin(), w.out.end(), 0.0f);
  std::fill(w.rows.begin(), w.rows.end(), RowSoftmax{});

  const KeySpan span = key_span(rule, tile.row0, rows);
  for (int col0 = span.first; col0 <= span.last; col0 += kFwdBlockN) {
    const int cols = std::min(kFwdBlockN, span.last + 1 - col0);
    const Matrix k_tile = tile_operand(in.kv_dtype, k, seq, col0, cols, head_k, dim, w.k.data());
    const Matrix v_tile = tile_operand(in.kv_dtype, v, seq, col0, cols, head_k, dim, w.v.data());

    // S = Q K^T, then t = log2(e) * score, masked only on tiles that cross a mask edge.
    gemm_nt(rows, cols, dim, q_tile, k_tile, 0.0f, w.scores.data(), kFwdBlockN);
    finish_scores(rule, w.scores.data(), kFwdBlockN, tile.row0, rows, col0, cols,
                  !tile_is_clean(span, col0, cols), nullptr);

    // m_new = max(m, rowmax(t));  P = 2^(t - m_new);  l = 2^(m - m_new) l + rowsum(P);
    // O = 2^(m - m_new) O  (the division by l is deferred to the end).
    for (int r = 0; r < rows; ++r) {
      float* t = w.scores.data() + r * kFwdBlockN;
      float rescale;
      const float base = w.rows[r].update_max(row_max(t, cols), &rescale);
      w.rows[r].sum += exp2_shifted_sum(t, base, cols, t);
      if (rescale != 1.0f) scale_row(w.out.data() + r * dim, rescale, dim);
      if (dropout.enabled) dropout.apply_row(t, tile.row0 + r, col0, cols, false);
    }
    // O += P V
    gemm_nn(rows, dim, cols, Matrix{w.scores.data(), kFwdBlockN}, v_tile, 1.0f, w.out.data(), dim);
  }

  // O = O / l, LSE = m + log l: the one final rescale.
  for (int r = 0; r < rows; ++r) {
    scale_row(w.out.data() + r * dim, w.rows[r].output_scale(), dim);
    p.softmax_lse[lse_offset(p, seq, tile.row0 + r, tile.head)] = w.rows[r].lse();
  }
  store_tile(p.dtype, w.out.data(), rows, dim, p.out,
             rows_of(p.out, p.out_batch_stride, p.out_row_stride, p.out_head_stride, false), seq,
             tile.row0, tile.head);
  if (p.attn_probs != nullptr) write_probs(p, rule, span, dropout, tile, rows, q_tile, k, in.kv_dtype, seq, head_k, w);
}

// Zeroes attn_probs so entries no tile writes (masked, past a sequence's end) read 0.
void clear_probs(const ForwardParams& p) {
  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.num_heads; ++h) {
      for (int r = 0; r < p.seqlen_q; ++r) {
        float* row = p.attn_probs + b * p.probs_batch_stride + h * p.probs_head_stride +
                     r * p.probs_row_stride;
        std::fill(row, row + p.seqlen_k, 0.0f);
      }
    }
  }
}

std::vector<QueryTile> query_tiles(const ForwardParams& p) {
  std::vector<QueryTile> tiles;
  for (int b = 0; b < p.batch; ++b) {
    const int seqlen_q = sequence_view(p, b).seqlen_q;
    // Last tiles first: under a causal mask they see the most keys, and starting the longest
    // tasks early evens out the threads' finishing times.
    for (int tile = ceil_div(seqlen_q, kFwdBlockM) - 1; tile >= 0; --tile) {
      for (int h = 0; h < p.num_heads; ++h) tiles.push_back({b, h, tile * kFwdBlockM});
    }
  }
  return tiles;
}

void run_tiles(const ForwardParams& p, const Inputs& in) {
  const std::vector<QueryTile> tiles = query_tiles(p);
  parallel_tasks<ForwardScratch>(
      static_cast<int64_t>(tiles.size()), p.num_threads,
      [&] { return ForwardScratch(p.head_dim); },
      [&](int64_t task, ForwardScratch& w) { forward_tile(p, in, tiles[task], w); });
}

}  // namespace

void forward_with_kv_tiles(const ForwardParams& p, tileattn_dtype kv_dtype, const PageMap* pages) {
  if (p.attn_probs != nullptr) clear_probs(p);
  Inputs in{float32_operand(p, p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride, false),
            {{}, StridedRows{p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride, true, pages}},
            {{}, StridedRows{p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride, true, pages}}};
  in.kv_dtype = kv_dtype;
  run_tiles(p, in);
}

}  // namespace cpu

void cpu_forward(const ForwardParams& p) {
  using namespace cpu;
  if (p.attn_probs != nullptr) clear_probs(p);
  const Inputs in{
      float32_operand(p, p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride, false),
      float32_operand(p, p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride, true),
      float32_operand(p, p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride, true)};
  run_tiles(p, in);
}

}  // namespace tileattn
