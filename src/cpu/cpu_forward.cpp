// The CPU forward: FlashAttention-2's Algorithm 1 on float32 tiles.  One task owns one query tile
// of one (batch, head) and sweeps the key tiles it can see, keeping only kFwdBlockM x kFwdBlockN scores
// alive at a time; no seqlen^2 buffer exists.  The two products run on AVX-512 or AVX2 over float32
// tiles (sgemm where the CPU has neither), or for bfloat16 on a CPU with AMX or AVX512-BF16 on bf16
// operands (P rounded to bf16 for P V, as the GPU kernels do).
#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "api/backends.h"
#include "cpu/amx_bf16.h"
#include "cpu/amx_cache_tiles.h"
#include "cpu/dropout.h"
#include "cpu/forward_kv_tiles.h"
#include "cpu/float32_copy.h"
#include "cpu/float32_key_tiles.h"
#include "cpu/gemm.h"
#include "cpu/kv_group_rows.h"
#include "cpu/online_softmax.h"
#include "cpu/packed_key_tiles.h"
#include "cpu/parallel.h"
#include "cpu/scratch_array.h"
#include "cpu/simd_product.h"
#include "cpu/score_tile.h"
#include "cpu/tile_io.h"
#include "cpu/vector_math.h"

namespace tileattn {
namespace cpu {
namespace {

// Per-thread buffers of one call, none read before it is written (ScratchArray does not zero them:
// zeroing was 10% of a bf16 S=128 call).
struct ForwardScratch {
  ScratchArray<float> q, k, v, scores, out;  // q, k, v hold converted tiles (not float32)
  std::vector<RowSoftmax> rows;
  int out_ld;                                  // out's row length: D rounded up to AMX's 16 columns
  ScratchArray<uint16_t> q_packed, p_packed;  // the AMX path's A operands (bf16)
  std::unique_ptr<amx::CacheTileScratch> cache;  // the AMX path on a bf16 cache in place
  // The few-row kernels' K or V row addresses: a tile's and the next tile's first rows.
  std::array<const void*, kFwdBlockN + simd::kFewRowsAhead> row_at;

  // key_tiles: K and V are read from blocks made once a call (packed or float32_tiles), not tiles.
  ForwardScratch(int dim, const PackedKeyTiles* packed, bool cache_tiles, bool key_tiles)
      : q(kFwdBlockM * dim), k(key_tiles || cache_tiles ? 0 : kFwdBlockN * dim),
        v(key_tiles || cache_tiles ? 0 : kFwdBlockN * dim),
        scores(kFwdBlockM * kFwdBlockN), rows(kFwdBlockM), out_ld(amx::round_up(dim, amx::kColsPerTile)),
        q_packed(packed ? kFwdBlockM * packed->depth() : 0),
        p_packed(packed || cache_tiles ? kFwdBlockM * kFwdBlockN : 0),
        cache(cache_tiles ? std::make_unique<amx::CacheTileScratch>(dim) : nullptr) {
    out = ScratchArray<float>(kFwdBlockM * out_ld);
  }
};

// One task: a query tile of one head, over all of its keys or, split, over the key columns
// [col_lo, col_hi) of them (see plan_tiles), its partial result then at `partial` in the call's
// partials buffer.
struct QueryTile {
  int batch_index, head, row0;
  int col_lo = 0, col_hi = INT_MAX;
  int64_t partial = -1;  // float offset of the partial result, -1 for a tile that is not split
};

// q in the call's dtype, converted tile by tile (each query tile is read once, by one task); k and
// v as float32 rows (copies of bfloat16/float16 inputs, made once: every query tile reads them), or
// in their own dtype (kv_dtype), converted tile by tile as they are read; or laid out once as the
// SIMD products' float32 blocks (float32_tiles, multiplied by simd); or, on the AMX path, packed once as bf16 tiles,
// or read as bf16 where they lie (cache_tiles: a decode step on a bf16 cache, amx_cache_tiles.h).
// k and v are unused but for the tile-by-tile paths.
struct Inputs {
  StridedRows q;
  Float32Rows k, v;
  tileattn_dtype kv_dtype = TILEATTN_FLOAT32;
  const Float32KeyTiles* float32_tiles = nullptr;
  const simd::Kernels* simd = nullptr;  // the SIMD products, with float32_tiles or few_rows()
  const PackedKeyTiles* packed = nullptr;
  amx::Engine bf16 = amx::Engine::kNone;  // what multiplies the bf16 operands (packed, cache_tiles)
  bool cache_tiles = false;
  int rows_per_position = 1;  // ScoreRule::rows_per_position (a KV group's heads as rows)

  // Whether simd's few-row kernels read K and V in place, contiguous or paged (a KV-cache decode
  // step).
  bool few_rows() const { return simd != nullptr && float32_tiles == nullptr; }

  // Whether K and V come in blocks of kFwdBlockN keys made once a call, so a sweep starts at a
  // block's first key.
  bool key_blocks() const { return packed != nullptr || float32_tiles != nullptr; }
};

StridedRows rows_of(const void* data, int64_t b, int64_t r, int64_t h, bool key_side) {
  return StridedRows{data, b, r, h, key_side};
}

// S = Q K^T for the tile's rows [row_lo, row_lo + rows) and key columns col0 .. col0 + cols - 1
// into those rows of w.scores (ld kFwdBlockN): on AMX from the packed Q tile and the packed key tile
// (col0 a multiple of kFwdBlockN there) or from the cache's rows in place (col0 a multiple of 16,
// row_lo 0); on AVX-512 or AVX2 from Q in place and the K^T block (col0 a multiple of kFwdBlockN); else by
// sgemm.  On AMX row_lo is a multiple of its 16-row tiles.
void score_products(const Inputs& in, const SequenceView& seq, const QueryTile& tile, int head_k, int row_lo,
                    int rows, int col0, int cols, int listed, int dim, const Matrix& q_tile, ForwardScratch& w) {
  float* scores = w.scores.data() + static_cast<int64_t>(row_lo) * kFwdBlockN;
  if (in.packed != nullptr) {
    const int depth = in.packed->depth();
    amx::product(in.bf16, amx::round_up(rows, amx::kRowsPerTile), amx::round_up(cols, amx::kColsPerTile), depth,
                 {w.q_packed.data() + static_cast<int64_t>(row_lo) * depth, depth},
                 {in.packed->k_block(tile.batch_index, head_k, col0 / kFwdBlockN), 2 * kFwdBlockN}, scores, kFwdBlockN,
                 false);
    return;
  }
  if (in.cache_tiles) {
    amx::cache_scores(in.bf16, in.k.rows, seq, head_k, col0, cols, rows, dim, *w.cache, scores, kFwdBlockN);
    return;
  }
  if (in.float32_tiles != nullptr) {
    const Float32KeyTiles& keys = *in.float32_tiles;
    in.simd->product(rows, cols, dim, {q_tile.data + static_cast<int64_t>(row_lo) * q_tile.ld, q_tile.ld, 1},
                     keys.kt_block(tile.batch_index, head_k, col0 / kFwdBlockN), keys.kt_ld(), scores, kFwdBlockN,
                     false);
    return;
  }
  if (in.few_rows()) {
    row_addresses(in.kv_dtype, in.k.rows, seq, col0, listed, head_k, w.row_at.data());
    in.simd->few_rows_scores(rows, cols, listed, dim, q_tile.data + static_cast<int64_t>(row_lo) * q_tile.ld,
                             q_tile.ld, w.row_at.data(), in.kv_dtype, scores, kFwdBlockN);
    return;
  }
  const Matrix k_tile = tile_operand(in.kv_dtype, in.k.rows, seq, col0, cols, head_k, dim, w.k.data());
  gemm_nt(rows, cols, dim, Matrix{q_tile.data + static_cast<int64_t>(row_lo) * q_tile.ld, q_tile.ld}, k_tile, 0.0f,
          scores, kFwdBlockN);
}

// The first key column a query tile's sweep starts at.  Key blocks made once a call start at
// multiples of kFwdBlockN, so those paths start at the block holding the first visible key (the
// keys before it are masked like any invisible key); on a cache in place at a multiple of 16, where
// a paged cache's 16-key groups lie within a page.
int first_column(const Inputs& in, const KeySpan& span) {
  if (in.cache_tiles) return span.first - span.first % amx::kRowsPerTile;
  return in.key_blocks() ? span.first - span.first % kFwdBlockN : span.first;
}

// attn_probs for one finished query tile: P = 2^(t - lse * log2 e), dropped entries negated.
void write_probs(const ForwardParams& p, const Inputs& in, const ScoreRule& rule, const KeySpan& span,
                 const DropoutRule& dropout, const QueryTile& tile, int rows, const Matrix& q_tile,
                 const SequenceView& seq, int head_k, ForwardScratch& w) {
  for (int col0 = first_column(in, span); span.first <= span.last && col0 <= span.last; col0 += kFwdBlockN) {
    const int cols = std::min(kFwdBlockN, span.last + 1 - col0);
    score_products(in, seq, tile, head_k, 0, rows, col0, cols, cols, p.head_dim, q_tile, w);
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

// A split task's partial result, for `rows` rows: O unnormalized (rows x D), then each row's m and l.
struct Partial {
  float* data;
  int rows, dim;
  float* out() const { return data; }
  float* max() const { return data + static_cast<int64_t>(rows) * dim; }
  float* sum() const { return max() + rows; }
  static int64_t floats(int rows, int dim) { return static_cast<int64_t>(rows) * (dim + 2); }
};

void forward_tile(const ForwardParams& p, const Inputs& in, const QueryTile& tile, ForwardScratch& w,
                  float* partials) {
  const SequenceView seq = sequence_view(p, tile.batch_index);
  const int dim = p.head_dim;
  const int rows = std::min(kFwdBlockM, seq.seqlen_q - tile.row0);
  const int head_k = tile.head / (p.num_heads / p.num_heads_k);
  const ScoreRule rule = make_score_rule(p, seq, tile.batch_index, tile.head, in.rows_per_position);
  const DropoutRule dropout = DropoutRule::make(p, tile.batch_index, tile.head);
  const PackedKeyTiles* packed = in.packed;

  const Matrix q_tile = tile_operand(p.dtype, in.q, seq, tile.row0, rows, tile.head, dim, w.q.data());
  // AMX tiles are 16 rows: the padding rows of Q are zeros, so those of S and O stay finite.
  const int rows_padded = amx::round_up(rows, amx::kRowsPerTile);
  // P is packed straight from the exp2 pass, into rows kFwdBlockN apart, unless dropout must
  // change it in float32 first; its padding rows are zeroed here, once.
  const bool amx_products = packed != nullptr || in.cache_tiles;
  const bool fused_exp2 = amx_products && !dropout.enabled;
  if (packed != nullptr) {
    amx::pack_rows(q_tile.data, q_tile.ld, rows, dim, rows_padded, packed->depth(), w.q_packed.data(), packed->depth());
  } else if (in.cache_tiles) {
    amx::pack_cache_query(q_tile.data, q_tile.ld, rows, dim, *w.cache);
  }
  if (amx_products) {
    std::fill(w.p_packed.data() + rows * kFwdBlockN, w.p_packed.data() + rows_padded * kFwdBlockN, uint16_t{0});
  }
  std::fill(w.out.data(), w.out.data() + w.out.size(), 0.0f);
  std::fill(w.rows.begin(), w.rows.end(), RowSoftmax{});

  const KeySpan span = key_span(rule, tile.row0, rows);
  const int col_end = std::min(span.last + 1, tile.col_hi);  // past this task's last key column
  for (int col0 = std::max(first_column(in, span), tile.col_lo); span.first <= span.last && col0 < col_end;
       col0 += kFwdBlockN) {
    const int cols = std::min(kFwdBlockN, span.last + 1 - col0);
    // Only the rows that see a key of this tile take part, in whole 16-row slices [lo, hi) (AMX's
    // tiles; rows of a slice that see none are masked as before): on a causal diagonal the upper
    // rows of a 256-row tile see none of the second 128 keys, and computing them only to mask them
    // made a causal S = 1024 call 1.25x the work of the visible part.  The rows outside the range
    // keep their state: a key they do not see would add exp2(-inf) = 0.  A decode step on a cache
    // in place (a few rows) runs all rows.
    const RowRange seeing = in.cache_tiles ? RowRange{0, rows} : rows_seeing(rule, tile.row0, rows, col0, cols);
    if (seeing.lo >= seeing.hi) continue;
    const int lo = seeing.lo - seeing.lo % amx::kRowsPerTile;
    const int hi = std::min(rows, amx::round_up(seeing.hi, amx::kRowsPerTile));
    const int64_t lo_scores = static_cast<int64_t>(lo) * kFwdBlockN;

    // S = Q K^T, then t = log2(e) * score, masked only on tiles that cross a mask edge.  The
    // few-row kernels also request the next tile's first visible rows: a tile's first 8 rows had
    // arrived unrequested, a memory latency each, ~6% of a 128-key tile's rows.
    const int listed = std::min(cols + simd::kFewRowsAhead, span.last + 1 - col0);
    score_products(in, seq, tile, head_k, lo, hi - lo, col0, cols, listed, dim, q_tile, w);
    const bool clean = tile_is_clean(span, col0, cols);
    // Where t is just the product times a positive scale (no mask, softcap or ALiBi), the scale
    // is folded into the row max and the exp2 pass instead of a pass of its own over the tile:
    // about 5% of a bf16 forward on AMX (perf, D128 S2048), 1.6% of an fp32 one.
    const bool scale_folded = clean && rule.softcap_log2 == 0.0f && rule.alibi_slope_log2 == 0.0f &&
                              rule.product_scale > 0.0f;
    if (!scale_folded) {
      finish_scores(rule, w.scores.data() + lo_scores, kFwdBlockN, tile.row0 + lo, hi - lo, col0, cols, !clean, nullptr);
    }
    const float scale = scale_folded ? rule.product_scale : 1.0f;

    // m_new = max(m, rowmax(t));  P = 2^(t - m_new);  l = 2^(m - m_new) l + rowsum(P);
    // O = 2^(m - m_new) O  (the division by l is deferred to the end).
    // On AMX, P's columns past `cols` are packed as zeros: the V rows they meet may be real keys.
    const int depth = amx::round_up(cols, amx::kDepthPerStep);
    for (int r = lo; r < hi; ++r) {
      float* t = w.scores.data() + r * kFwdBlockN;
      float rescale;
      const float base = w.rows[r].update_max(row_max(t, cols) * scale, &rescale);
      if (fused_exp2) {
        w.rows[r].sum += amx::exp2_row_to_bf16(t, scale, base, cols, depth, w.p_packed.data() + r * kFwdBlockN);
      } else {
        w.rows[r].sum += exp2_shifted_sum(t, scale, base, cols, t);
      }
      if (rescale != 1.0f) scale_row(w.out.data() + r * w.out_ld, rescale, dim);
      if (dropout.enabled) dropout.apply_row(t, tile.row0 + r, col0, cols, false);
    }
    // O += P V over the same rows.  On AMX their slices end at a multiple of 16 or at the tile's
    // last row, whose padding rows of P are zero.
    const int amx_rows = amx::round_up(hi, amx::kRowsPerTile) - lo;
    float* out_rows = w.out.data() + static_cast<int64_t>(lo) * w.out_ld;
    if (amx_products && !fused_exp2) {
      amx::pack_rows(w.scores.data() + lo_scores, kFwdBlockN, hi - lo, cols, amx_rows, depth,
                     w.p_packed.data() + lo_scores, kFwdBlockN);
    }
    if (in.cache_tiles) {
      amx::cache_accumulate_pv(in.bf16, in.v.rows, seq, head_k, col0, cols, rows_padded, dim, w.p_packed.data(),
                               kFwdBlockN, *w.cache, w.out.data(), w.out_ld);
    } else if (packed != nullptr) {
      amx::product(in.bf16, amx_rows, packed->columns(), depth, {w.p_packed.data() + lo_scores, kFwdBlockN},
                   {packed->v_block(tile.batch_index, head_k, col0 / kFwdBlockN), 2 * packed->columns()},
                   out_rows, w.out_ld, true);
    } else if (in.float32_tiles != nullptr) {
      const Float32KeyTiles& keys = *in.float32_tiles;
      in.simd->product(hi - lo, dim, cols, {w.scores.data() + lo_scores, kFwdBlockN, 1},
                       keys.v_block(tile.batch_index, head_k, col0 / kFwdBlockN), keys.v_ld(), out_rows, w.out_ld, true);
    } else if (in.few_rows()) {
      row_addresses(in.kv_dtype, in.v.rows, seq, col0, listed, head_k, w.row_at.data());
      in.simd->few_rows_accumulate(hi - lo, cols, listed, dim, w.scores.data() + lo_scores, kFwdBlockN,
                                   w.row_at.data(), in.kv_dtype, out_rows, w.out_ld);
    } else {
      const Matrix v_tile = tile_operand(in.kv_dtype, in.v.rows, seq, col0, cols, head_k, dim, w.v.data());
      gemm_nn(hi - lo, dim, cols, Matrix{w.scores.data() + lo_scores, kFwdBlockN}, v_tile, 1.0f, out_rows, w.out_ld);
    }
  }

  if (tile.partial >= 0) {  // a split: m, l and O as they stand, for combine_splits
    const Partial part{partials + tile.partial, rows, dim};
    for (int r = 0; r < rows; ++r) {
      std::memcpy(part.out() + static_cast<int64_t>(r) * dim, w.out.data() + r * w.out_ld, sizeof(float) * dim);
      part.max()[r] = w.rows[r].max;
      part.sum()[r] = w.rows[r].sum;
    }
    return;
  }
  // O = O / l, LSE = m + log l: the one final rescale.
  for (int r = 0; r < rows; ++r) {
    scale_row(w.out.data() + r * w.out_ld, w.rows[r].output_scale(), dim);
    p.softmax_lse[lse_offset(p, seq, tile.row0 + r, tile.head)] = w.rows[r].lse();
  }
  store_tile(p.dtype, w.out.data(), w.out_ld, rows, dim, p.out,
             rows_of(p.out, p.out_batch_stride, p.out_row_stride, p.out_head_stride, false), seq,
             tile.row0, tile.head);
  if (p.attn_probs != nullptr) write_probs(p, in, rule, span, dropout, tile, rows, q_tile, seq, head_k, w);
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

// The key split.  A tile of few query rows (a decode step: a KV group's heads, a few tokens) is
// one task that streams all of its keys, so a call of few sequences and KV heads ran on as many
// threads as it had tiles: 1 x 8k with one KV head on one core of two, and on a 32-core host a
// step of 8 KV heads on 8.  Such a tile's visible keys are split into runs of kSplitKeys, one
// task each, whose partial results combine_splits merges through their m and l.  The split
// depends only on the tile's own rows and keys, never on the thread count or the batch, so a
// sequence's result is the same bits in any call.  kSplitKeys: 16 key tiles, enough that a task's
// stream dwarfs its fixed work (loading its q, writing (D + 2) floats a row of partials).
constexpr int kSplitKeys = 16 * kFwdBlockN;
constexpr int kSplitMaxRows = 64;  // tiles with more rows (prefill) have work enough in their rows

struct TilePlan {
  std::vector<QueryTile> tiles;
  // Split tiles: tiles[first] .. tiles[first + splits - 1] hold one tile's runs of keys.
  struct Split {
    int64_t first;
    int splits;
  };
  std::vector<Split> splits;
  int64_t partial_floats = 0;
};

TilePlan plan_tiles(const ForwardParams& p, const Inputs& in) {
  TilePlan plan;
  for (int b = 0; b < p.batch; ++b) {
    const SequenceView seq = sequence_view(p, b);
    // Last tiles first: under a causal mask they see the most keys, and starting the longest
    // tasks early evens out the threads' finishing times.
    for (int tile = ceil_div(seq.seqlen_q, kFwdBlockM) - 1; tile >= 0; --tile) {
      const int row0 = tile * kFwdBlockM, rows = std::min(kFwdBlockM, seq.seqlen_q - row0);
      for (int h = 0; h < p.num_heads; ++h) {
        int splits = 1, first_col = 0;
        if (rows <= kSplitMaxRows && p.attn_probs == nullptr) {
          const KeySpan span = key_span(make_score_rule(p, seq, b, h, in.rows_per_position), row0, rows);
          first_col = first_column(in, span);
          if (span.first <= span.last) splits = ceil_div(span.last + 1 - first_col, kSplitKeys);
        }
        if (splits == 1) {
          plan.tiles.push_back({b, h, row0});
          continue;
        }
        plan.splits.push_back({static_cast<int64_t>(plan.tiles.size()), splits});
        for (int s = 0; s < splits; ++s) {
          const int col_lo = first_col + s * kSplitKeys;
          plan.tiles.push_back({b, h, row0, col_lo, col_lo + kSplitKeys, plan.partial_floats});
          plan.partial_floats += Partial::floats(rows, p.head_dim);
        }
      }
    }
  }
  return plan;
}

// Merges a split tile's partial results with the online softmax the tiles use, one run as one key
// tile (FA2's rescale across splits): m = max(m, m_s), then l and O rescaled by 2^(m_old - m) take
// l_s and O_s weighted by 2^(m_s - m); O / l and LSE = (m + log2 l) ln 2 at the end.
void combine_splits(const ForwardParams& p, const TilePlan& plan, const TilePlan::Split& split, float* partials,
                    std::vector<float>& out) {
  const QueryTile& tile = plan.tiles[split.first];
  const SequenceView seq = sequence_view(p, tile.batch_index);
  const int dim = p.head_dim, rows = std::min(kFwdBlockM, seq.seqlen_q - tile.row0);
  out.assign(static_cast<size_t>(rows) * dim, 0.0f);
  for (int r = 0; r < rows; ++r) {
    RowSoftmax row;
    float* o = out.data() + static_cast<int64_t>(r) * dim;
    for (int s = 0; s < split.splits; ++s) {
      const Partial part{partials + plan.tiles[split.first + s].partial, rows, dim};
      float rescale;
      const float base = row.update_max(part.max()[r], &rescale);
      if (rescale != 1.0f) scale_row(o, rescale, dim);
      const float weight = std::exp2(part.max()[r] - base);  // 0 for a run this row saw no key of
      row.sum += weight * part.sum()[r];
      const float* o_s = part.out() + static_cast<int64_t>(r) * dim;
      for (int d = 0; d < dim; ++d) o[d] += weight * o_s[d];
    }
    scale_row(o, row.output_scale(), dim);
    p.softmax_lse[lse_offset(p, seq, tile.row0 + r, tile.head)] = row.lse();
  }
  store_tile(p.dtype, out.data(), dim, rows, dim, p.out,
             rows_of(p.out, p.out_batch_stride, p.out_row_stride, p.out_head_stride, false), seq, tile.row0,
             tile.head);
}

void run_tiles(const ForwardParams& p, const Inputs& in) {
  const TilePlan plan = plan_tiles(p, in);
  ScratchArray<float> partials(plan.partial_floats);
  parallel_tasks<ForwardScratch>(
      static_cast<int64_t>(plan.tiles.size()), p.num_threads,
      [&] { return ForwardScratch(p.head_dim, in.packed, in.cache_tiles, in.key_blocks()); },
      [&](int64_t task, ForwardScratch& w) { forward_tile(p, in, plan.tiles[task], w, partials.data()); });
  parallel_tasks<std::vector<float>>(
      static_cast<int64_t>(plan.splits.size()), p.num_threads, [] { return std::vector<float>(); },
      [&](int64_t g, std::vector<float>& out) { combine_splits(p, plan, plan.splits[g], partials.data(), out); });
}

}  // namespace

void forward_with_kv_tiles(const ForwardParams& p, tileattn_dtype kv_dtype, const PageMap* pages, KvProducts products,
                           int rows_per_position) {
  if (p.attn_probs != nullptr) clear_probs(p);
  Inputs in{rows_of(p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride, false),
            {{}, StridedRows{p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride, true, pages}},
            {{}, StridedRows{p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride, true, pages}}};
  in.kv_dtype = kv_dtype;
  in.rows_per_position = rows_per_position;
  in.cache_tiles = products.kind == KvProducts::kBf16InPlace;
  in.bf16 = products.bf16;
  if (products.kind == KvProducts::kSimdFewRows) in.simd = simd::kernels();
  if (products.kind == KvProducts::kBf16Packed) {
    const PackedKeyTiles packed(p, kv_dtype, in.k.rows, in.v.rows);
    in.packed = &packed;
    run_tiles(p, in);
    return;
  }
  if (products.kind == KvProducts::kSimdTiles) {
    in.simd = simd::kernels();
    const Float32KeyTiles key_tiles(p, kv_dtype, in.k.rows, in.v.rows, *in.simd);
    in.float32_tiles = &key_tiles;
    run_tiles(p, in);
    return;
  }
  run_tiles(p, in);
}

// Query rows a sequence needs before K and V are laid out once (AMX's packed tiles or the SIMD
// products' float32 blocks, a pass over all of them) instead of read tile by tile where they lie:
// from a tile's worth of rows (a chunk of prefill) the products are compute-bound enough to repay it.
constexpr int kPackedMinQueryRows = 64;

// A decode step's query rows a sequence up to which the SIMD few-row kernels beat AMX's tiles on a
// bf16 cache in place: AMX pads a KV group's rows to a 16-row tile, and its per-tile work did not
// pay below 5 rows.  flash_attn_func, d128, one query row, against AMX (Emerald Rapids, 2 threads):
// groups of 1 1.5-2.0x, 2 1.15x, 4 1.07x, 8 0.70x, 16 0.45x.
constexpr int kFewRowsMaxOverAmx = 4;
// The same for AVX512-BF16's dot products on the cache in place (CPUs without AMX), whose rows
// cost more than AMX's against the same padding.  bf16, d128, Zen 5 VM, 2 threads, in place against
// the few-row kernels: 8 rows a group (1 x 32k, 64/8 heads) 0.68-0.78x, 16 (4 tokens x 32/8) level,
// 32 (8 x 8k, 32/1) 1.4-1.6x.
constexpr int kFewRowsMaxOverDot = 16;

// bf16 products on AMX: with K/V packed once for a chunk of prefill; a decode step's rows read a bf16
// cache in place (packing would add a pass over the whole cache), where its head dim allows, unless
// they are few enough for the few-row kernels below; the same on AVX512-BF16's dot products where a
// CPU has no AMX, with their own limit on the few rows.  Other calls take the SIMD float32 kernels: with
// as many rows on K^T and V laid out once; with fewer (a decode step) the few-row kernels, which read
// a head's rows in place (bf16/fp16 widened as loaded), requested rows ahead across the gaps between
// them, across pages and into the next tile (1 x 32k, 32/8 heads, d128, fp32: 10.9 -> 21.3 GB/s
// contiguous).  The choice depends on the shapes alone, never on strides, so a call's bits do not
// change with its tensors' layout.  Where a contiguous cache's rows of one head are one stream (one
// or two KV heads) sgemm had been 1.02-1.18x faster; since the kernels request rows across tiles
// they take 0.99-1.03x its time at 8 x 8k 4/1 d64 and 0.77-0.84x at 1 x 64k 8/1 d128.
KvProducts choose_kv_products(tileattn_dtype call_dtype, tileattn_dtype kv_dtype, int rows_per_seq, int dim) {
  const bool few_rows = simd::kernels() != nullptr && rows_per_seq < kPackedMinQueryRows;
  const amx::Engine bf16 = call_dtype == TILEATTN_BFLOAT16 ? amx::engine() : amx::Engine::kNone;
  if (bf16 != amx::Engine::kNone) {
    if (rows_per_seq >= kPackedMinQueryRows) return {KvProducts::kBf16Packed, bf16};
    const int few_rows_max = bf16 == amx::Engine::kTiles ? kFewRowsMaxOverAmx : kFewRowsMaxOverDot;
    if (few_rows && rows_per_seq <= few_rows_max) return {KvProducts::kSimdFewRows};
    if (kv_dtype == TILEATTN_BFLOAT16 && dim % amx::kDepthPerStep == 0 && rows_per_seq <= amx::kCacheTileMaxRows) {
      return {KvProducts::kBf16InPlace, bf16};
    }
    return {few_rows ? KvProducts::kSimdFewRows : KvProducts::kSgemm};
  }
  if (few_rows) return {KvProducts::kSimdFewRows};
  return {simd::kernels() != nullptr && rows_per_seq >= kPackedMinQueryRows ? KvProducts::kSimdTiles
                                                                              : KvProducts::kSgemm};
}

}  // namespace cpu

void cpu_forward(const ForwardParams& p) {
  using namespace cpu;
  if (kv_group_rows_apply(p)) {
    forward_kv_group_rows(p);
    return;
  }
  if (p.attn_probs != nullptr) clear_probs(p);
  // bf16 products on AMX or AVX512-BF16 where the CPU has either.
  const amx::Engine bf16 = p.dtype == TILEATTN_BFLOAT16 ? amx::engine() : amx::Engine::kNone;
  if (bf16 != amx::Engine::kNone) {
    const PackedKeyTiles packed(p, p.dtype, StridedRows{p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride, true},
                                StridedRows{p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride, true});
    Inputs in{rows_of(p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride, false), {}, {}};
    in.packed = &packed;
    in.bf16 = bf16;
    run_tiles(p, in);
    return;
  }
  // float32 products on AVX-512 or AVX2 from K^T and V blocks laid out once (float32_key_tiles.h).
  if (const simd::Kernels* kernels = simd::kernels()) {
    const Float32KeyTiles key_tiles(p, p.dtype,
                                    StridedRows{p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride, true},
                                    StridedRows{p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride, true},
                                    *kernels);
    Inputs in{rows_of(p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride, false), {}, {}};
    in.float32_tiles = &key_tiles;
    in.simd = kernels;
    run_tiles(p, in);
    return;
  }
  const Inputs in{
      rows_of(p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride, false),
      float32_operand(p, p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride, true),
      float32_operand(p, p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride, true)};
  run_tiles(p, in);
}

}  // namespace tileattn
