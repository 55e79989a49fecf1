// The CPU backward: FlashAttention-2's Algorithm 2 on float32 tiles.
//   D_i = rowsum(dO_i o O_i)                                   (preprocess)
//   P_ij = 2^(t_ij - LSE_i log2 e)                             (recomputed, never stored)
//   dV_j += P_ij^T dO_i,  dP_ij = dO_i V_j^T,  dS_ij = P_ij o (dP_ij - D_i)
//   dK_j += dS_ij^T Q_i,  dQ_i += dS_ij K_j                   (times the softmax scale)
// One task owns a chunk of key tiles of one (batch, query head) and loops over the query tiles
// that see them.  Every task writes float32 partial sums to its own slots, and the final sums run
// in a fixed order, so the gradients are bitwise the same on every run with the same threads.
// The five products run on AVX-512 or AVX2 over float32 tiles (sgemm where the CPU has neither), or for
// bfloat16 on a CPU with AMX on its bf16 tiles (P and dS rounded to bf16, as the GPU kernels do),
// where dK and dV are accumulated transposed
// (dK^T += Q^T dS) so that P and dS enter as B operands, whose layout is an interleave of rows,
// instead of as A operands, which would need a transpose of every tile.
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "api/backends.h"
#include "cpu/amx_bf16.h"
#include "cpu/dropout.h"
#include "cpu/float32_copy.h"
#include "cpu/gemm.h"
#include "cpu/packed_query_tiles.h"
#include "cpu/parallel.h"
#include "cpu/scratch_array.h"
#include "cpu/simd_product.h"
#include "cpu/score_tile.h"
#include "cpu/tile_io.h"
#include "cpu/vector_math.h"

namespace tileattn {
namespace cpu {
namespace {

struct BackwardBuffers {
  int64_t q_rows, k_rows;                // rows per head of the packed q and k row spaces
  int chunks;                            // key-tile chunks per (batch, head)
  std::vector<float> delta;              // D = rowsum(dO o O): (H, q_rows)
  // Uninitialized: a task zeroes its own rows of dq_partial before it adds to them (in its own
  // cache, instead of a whole-call memset), and writes every row of dk_expanded and dv_expanded
  // that a sequence's keys have.
  ScratchArray<float> dq_partial;        // (chunks, H, q_rows, D)
  ScratchArray<float> dk_expanded;       // (H, k_rows, D): dK before summing a GQA group
  ScratchArray<float> dv_expanded;
};

// The SIMD products' operands (none when dim is 0).  Q and dO are copied a tile pair at a time
// (2 x 128 x D floats against five products of 128 x 256 x D): in the caller's tensors their rows
// lie H x D floats apart, 4 KB at 8 x 128, which as B operands fill a few L1 sets (padded_ld).
struct Float32Operands {
  int64_t keys_ld, rows_ld;  // K^T's and V^T's rows; K's, Q's and dO's rows
  ScratchArray<float> k_transposed, v_transposed, k_rows, q_rows, dout_rows;

  explicit Float32Operands(int dim)
      : keys_ld(simd::padded_ld(kBwdBlockN)),
        rows_ld(simd::padded_ld(dim)),
        k_transposed(dim * keys_ld),
        v_transposed(dim * keys_ld),
        k_rows(dim > 0 ? kBwdBlockN * rows_ld : 0),
        q_rows(dim > 0 ? kBwdBlockM * rows_ld : 0),
        dout_rows(dim > 0 ? kBwdBlockM * rows_ld : 0) {}
};

struct BackwardScratch {
  std::vector<float> q, dout, k, v;  // converted tiles (not float32; none on the packed path)
  std::vector<float> dk, dv, probs, dprobs, dtanh, lse_log2, delta;
  // The AMX path's operands (bf16) and float32 sums, none read before written: per key tile K^T
  // and V^T (B of S and dP) and K (B of dQ); per tile pair P and dS as pairs (B of dV^T and dK^T)
  // and dS as rows (A of dQ); dK^T and dV^T (D padded to 16 rows of kBwdBlockN) and one tile's dQ.
  ScratchArray<uint16_t> k_transposed, v_transposed, k_pairs, p_pairs, ds_pairs, ds_rows;
  ScratchArray<float> dk_transposed, dv_transposed, dq_tile;
  // The SIMD path's B operands, rows simd::padded_ld apart: per key tile K^T and V^T (of S and
  // dP) and K (of dQ), per tile pair Q and dO (of dK and dV; also read as A of S and dP).
  Float32Operands float32_operands;

  // float32_dim: the float32 tiles' width, 0 on the packed path, which reads none of them.
  BackwardScratch(int dim, const PackedQueryTiles* packed, bool on_simd)
      : BackwardScratch(dim, packed, on_simd, packed ? 0 : dim) {}

 private:
  BackwardScratch(int dim, const PackedQueryTiles* packed, bool on_simd, int float32_dim)
      : q(kBwdBlockM * float32_dim), dout(kBwdBlockM * float32_dim), k(kBwdBlockN * float32_dim),
        v(kBwdBlockN * float32_dim), dk(kBwdBlockN * float32_dim), dv(kBwdBlockN * float32_dim),
        probs(kBwdBlockM * kBwdBlockN), dprobs(kBwdBlockM * kBwdBlockN), dtanh(kBwdBlockM * kBwdBlockN),
        lse_log2(kBwdBlockM), delta(kBwdBlockM), float32_operands(on_simd ? dim : 0) {
    if (packed == nullptr) return;
    const size_t tile = kBwdBlockM * kBwdBlockN, keys_by_depth = static_cast<size_t>(kBwdBlockN) * packed->depth();
    const size_t keys_by_columns = static_cast<size_t>(kBwdBlockN) * packed->columns();
    k_transposed = ScratchArray<uint16_t>(keys_by_depth);
    v_transposed = ScratchArray<uint16_t>(keys_by_depth);
    k_pairs = ScratchArray<uint16_t>(keys_by_columns);
    p_pairs = ScratchArray<uint16_t>(tile);
    ds_pairs = ScratchArray<uint16_t>(tile);
    ds_rows = ScratchArray<uint16_t>(tile);
    dk_transposed = ScratchArray<float>(keys_by_columns);
    dv_transposed = ScratchArray<float>(keys_by_columns);
    dq_tile = ScratchArray<float>(static_cast<size_t>(kBwdBlockM) * packed->columns());
  }
};

StridedRows q_like(const void* data, int64_t b, int64_t r, int64_t h) { return {data, b, r, h, false}; }
StridedRows k_like(const void* data, int64_t b, int64_t r, int64_t h) { return {data, b, r, h, true}; }

// D_i = sum_d dO_id O_id, in float from the stored dO and O.
void compute_delta(const BackwardParams& p, BackwardBuffers& buf) {
  const ForwardParams& f = p.fwd;
  const int dim = f.head_dim;
  const StridedRows dout = q_like(p.dout, p.dout_batch_stride, p.dout_row_stride, p.dout_head_stride);
  const StridedRows out = q_like(f.out, f.out_batch_stride, f.out_row_stride, f.out_head_stride);
  const int64_t tasks = static_cast<int64_t>(f.batch) * f.num_heads;
  struct Rows {
    std::vector<float> a, b;
  };
  parallel_tasks<Rows>(
      tasks, f.num_threads, [&] { return Rows{std::vector<float>(dim), std::vector<float>(dim)}; },
      [&](int64_t task, Rows& w) {
        const int b = static_cast<int>(task / f.num_heads), h = static_cast<int>(task % f.num_heads);
        const SequenceView seq = sequence_view(f, b);
        for (int r = 0; r < seq.seqlen_q; ++r) {
          load_row(f.dtype, dout.data, dout.offset(seq, r, h), dim, w.a.data());
          load_row(f.dtype, out.data, out.offset(seq, r, h), dim, w.b.data());
          float sum = 0.0f;
          for (int d = 0; d < dim; ++d) sum += w.a[d] * w.b[d];
          buf.delta[h * buf.q_rows + packed_q_row(f, seq, r)] = sum;
        }
      });
}

struct KeyChunk {
  int batch_index, head, chunk;
};

// k and v as the call stores them: a task converts each key tile once into its scratch and reads
// it for every query tile (a float32 copy of the whole of K and V, as the forward makes, cost 3.3 ms
// of a 27 ms bf16 d128 S=1024 backward, mostly first touches of its fresh pages).  q and dout, read
// by every key tile, as float32 rows on the sgemm path (copies only for bfloat16/float16 inputs),
// on the AMX path packed as bf16 tiles instead (q and dout then empty).
struct Inputs {
  Float32Rows q, dout;
  StridedRows k, v;
  const PackedQueryTiles* packed = nullptr;
  amx::Engine bf16 = amx::Engine::kNone;  // what multiplies packed's bf16 operands
  const simd::Kernels* simd = nullptr;  // float32 products on AVX-512 or AVX2 (null: sgemm), where packed is null
};

// The AMX path's per-key-tile operands from K's and V's bf16 rows col0 .. col0 + cols - 1 of KV head
// head_k, where they lie (cols x D): K^T and V^T as pairs for S = Q K^T and dP = dO V^T, K as pairs
// for dQ = dS K; and the transposed sums zeroed.  Converting the tiles to float32 first, as the
// other paths read them, was ~6% of a bf16 d64 S1024 causal backward (Zen 5 VM).
void pack_key_tile(const StridedRows& k, const StridedRows& v, const SequenceView& seq, int col0, int cols,
                   int head_k, int dim, const PackedQueryTiles& packed, BackwardScratch& w) {
  const uint16_t* k_rows = static_cast<const uint16_t*>(k.data) + k.offset(seq, col0, head_k);
  const uint16_t* v_rows = static_cast<const uint16_t*>(v.data) + v.offset(seq, col0, head_k);
  amx::pack_pairs_transposed(k_rows, k.row_stride, cols, dim, kBwdBlockN, packed.depth(), w.k_transposed.data());
  amx::pack_pairs_transposed(v_rows, v.row_stride, cols, dim, kBwdBlockN, packed.depth(), w.v_transposed.data());
  amx::pack_pairs(k_rows, k.row_stride, cols, dim, kBwdBlockN, packed.columns(), w.k_pairs.data());
  std::fill(w.dk_transposed.data(), w.dk_transposed.data() + w.dk_transposed.size(), 0.0f);
  std::fill(w.dv_transposed.data(), w.dv_transposed.data() + w.dv_transposed.size(), 0.0f);
}

// P (dropped) and dS from their float32 tiles into the AMX operands backward_operands makes: the
// path of calls with dropout, whose P and dP change between the exp2 and the products.
void pack_on_amx(int rows, int cols, BackwardScratch& w) {
  const int rows_deep = amx::round_up(rows, amx::kDepthPerStep), cols_wide = amx::round_up(cols, amx::kColsPerTile);
  amx::pack_pairs(w.probs.data(), kBwdBlockN, rows, cols, rows_deep, cols_wide, w.p_pairs.data());
  amx::pack_pairs(w.dprobs.data(), kBwdBlockN, rows, cols, rows_deep, cols_wide, w.ds_pairs.data());
  amx::pack_rows(w.dprobs.data(), kBwdBlockN, rows, cols, amx::round_up(rows, amx::kRowsPerTile),
                 amx::round_up(cols, amx::kDepthPerStep), w.ds_rows.data(), kBwdBlockN);
}

// dV^T += dO^T (Z o P), dK^T += Q^T dS, dQ += dS K on `bf16`'s engine, from the packed P and dS.
void products_on_amx(amx::Engine bf16, const PackedQueryTiles& packed, const KeyChunk& task, int query_tile, int rows,
                     int cols, int dim, float* dq_rows, BackwardScratch& w) {
  const int rows_deep = amx::round_up(rows, amx::kDepthPerStep), cols_wide = amx::round_up(cols, amx::kColsPerTile);
  const int cols_deep = amx::round_up(cols, amx::kDepthPerStep), columns = packed.columns();
  using Block = PackedQueryTiles::Block;
  const uint16_t* dout_t = packed.block(Block::kDoutTransposed, task.batch_index, task.head, query_tile);
  const uint16_t* q_t = packed.block(Block::kQTransposed, task.batch_index, task.head, query_tile);
  amx::product(bf16, columns, cols_wide, rows_deep, {dout_t, kBwdBlockM}, {w.p_pairs.data(), 2 * cols_wide},
               w.dv_transposed.data(), kBwdBlockN, true);
  amx::product(bf16, columns, cols_wide, rows_deep, {q_t, kBwdBlockM}, {w.ds_pairs.data(), 2 * cols_wide},
               w.dk_transposed.data(), kBwdBlockN, true);
  // dQ's rows take the product's sums in place when they are whole C tiles (16 rows, a D of 16s);
  // otherwise the product would write past the tile's rows, so it goes through dq_tile.
  if (rows % amx::kRowsPerTile == 0 && columns == dim) {
    amx::product(bf16, rows, columns, cols_deep, {w.ds_rows.data(), kBwdBlockN}, {w.k_pairs.data(), 2 * columns},
                 dq_rows, dim, true);
    return;
  }
  amx::product(bf16, amx::round_up(rows, amx::kRowsPerTile), columns, cols_deep, {w.ds_rows.data(), kBwdBlockN},
               {w.k_pairs.data(), 2 * columns}, w.dq_tile.data(), columns, false);
  for (int r = 0; r < rows; ++r) {
    float* dst = dq_rows + static_cast<int64_t>(r) * dim;
    const float* src = w.dq_tile.data() + static_cast<int64_t>(r) * columns;
    for (int d = 0; d < dim; ++d) dst[d] += src[d];
  }
}

void backward_chunk(const BackwardParams& p, const Inputs& in, const KeyChunk& task,
                    BackwardBuffers& buf, BackwardScratch& w) {
  const ForwardParams& f = p.fwd;
  const SequenceView seq = sequence_view(f, task.batch_index);
  const int dim = f.head_dim;
  const int head_k = task.head / (f.num_heads / f.num_heads_k);
  const ScoreRule rule = make_score_rule(f, seq, task.batch_index, task.head);
  const DropoutRule dropout = DropoutRule::make(f, task.batch_index, task.head);
  const StridedRows& q = in.q.rows;
  const StridedRows& dout = in.dout.rows;
  const StridedRows& k = in.k;
  const StridedRows& v = in.v;
  const bool softcap = rule.softcap_log2 > 0.0f;
  const PackedQueryTiles* packed = in.packed;

  const int key_tiles = ceil_div(seq.seqlen_k, kBwdBlockN);
  const int tiles_per_chunk = ceil_div(key_tiles, buf.chunks);
  const int tile_end = std::min(key_tiles, (task.chunk + 1) * tiles_per_chunk);
  float* dq_partial = buf.dq_partial.data() +
                      (static_cast<int64_t>(task.chunk) * f.num_heads + task.head) * buf.q_rows * dim;
  float* dq_sequence = dq_partial + packed_q_row(f, seq, 0) * dim;
  std::fill(dq_sequence, dq_sequence + static_cast<int64_t>(seq.seqlen_q) * dim, 0.0f);

  for (int key_tile = task.chunk * tiles_per_chunk; key_tile < tile_end; ++key_tile) {
    const int col0 = key_tile * kBwdBlockN;
    const int cols = std::min(kBwdBlockN, seq.seqlen_k - col0);
    // The packed path packs K and V from their bf16 rows; the others read float32 tiles, the SIMD
    // path K's rows from its padded copy (B of dQ += dS K), sgemm as they come.
    Float32Operands& ops = w.float32_operands;
    Matrix k_tile{}, v_tile{};
    if (packed != nullptr) {
      pack_key_tile(k, v, seq, col0, cols, head_k, dim, *packed, w);
    } else {
      k_tile = in.simd != nullptr
                   ? padded_tile(f.dtype, k, seq, col0, cols, head_k, dim, ops.k_rows.data(), ops.rows_ld)
                   : tile_operand(f.dtype, k, seq, col0, cols, head_k, dim, w.k.data());
      v_tile = tile_operand(f.dtype, v, seq, col0, cols, head_k, dim, w.v.data());
      if (in.simd != nullptr) {
        in.simd->transpose(k_tile.data, k_tile.ld, cols, dim, ops.k_transposed.data(), ops.keys_ld);
        in.simd->transpose(v_tile.data, v_tile.ld, cols, dim, ops.v_transposed.data(), ops.keys_ld);
      }
      std::fill(w.dk.begin(), w.dk.end(), 0.0f);
      std::fill(w.dv.begin(), w.dv.end(), 0.0f);
    }

    for (int row0 = 0; row0 < seq.seqlen_q; row0 += kBwdBlockM) {
      const int rows = std::min(kBwdBlockM, seq.seqlen_q - row0);
      const KeySpan span = key_span(rule, row0, rows);
      if (span.first > span.last || span.last < col0 || span.first >= col0 + cols) continue;
      // The key tile's columns up to the last one a row of the query tile sees: on a causal
      // diagonal the upper query tile of a 256-key tile sees its first 128 keys only, and its
      // products over the others were masked whole (a tenth of a causal S = 1024 backward).
      const int seen = std::min(cols, span.last + 1 - col0);

      const int query_tile = row0 / kBwdBlockM;
      // The float32 Q and dO rows: where they lie for sgemm, padded copies for the SIMD products
      // (which also read them as B of dK and dV); the AMX path reads its packed blocks.
      auto query_side = [&](const StridedRows& src, float* scratch, float* padded) {
        if (packed != nullptr) return Matrix{};
        if (in.simd == nullptr) return tile_operand(TILEATTN_FLOAT32, src, seq, row0, rows, task.head, dim, scratch);
        return padded_tile(TILEATTN_FLOAT32, src, seq, row0, rows, task.head, dim, padded, ops.rows_ld);
      };
      const Matrix q_tile = query_side(q, w.q.data(), ops.q_rows.data());
      const Matrix dout_tile = query_side(dout, w.dout.data(), ops.dout_rows.data());
      // S = Q K^T and dP = dO V^T on AMX: the packed query-side block times K^T or V^T as pairs.
      auto scores_on_amx = [&](PackedQueryTiles::Block rows_block, const uint16_t* keys_transposed, float* c) {
        const uint16_t* query_side_block = packed->block(rows_block, task.batch_index, task.head, query_tile);
        amx::product(in.bf16, amx::round_up(rows, amx::kRowsPerTile), amx::round_up(seen, amx::kColsPerTile),
                     packed->depth(), {query_side_block, packed->depth()}, {keys_transposed, 2 * kBwdBlockN}, c,
                     kBwdBlockN, false);
      };
      for (int r = 0; r < rows; ++r) {
        w.lse_log2[r] = f.softmax_lse[lse_offset(f, seq, row0 + r, task.head)] * kLog2e;
        w.delta[r] = buf.delta[task.head * buf.q_rows + packed_q_row(f, seq, row0 + r)];
      }

      const bool fused = packed != nullptr && !dropout.enabled;
      // P = 2^(t - LSE log2 e), recomputed from Q, K and the saved LSE.
      if (packed != nullptr) {
        scores_on_amx(PackedQueryTiles::kQ, w.k_transposed.data(), w.probs.data());
      } else if (in.simd != nullptr) {
        in.simd->product(rows, seen, dim, {q_tile.data, q_tile.ld, 1}, ops.k_transposed.data(), ops.keys_ld,
                         w.probs.data(), kBwdBlockN, false);
      } else {
        gemm_nt(rows, seen, dim, q_tile, k_tile, 0.0f, w.probs.data(), kBwdBlockN);
      }
      finish_scores(rule, w.probs.data(), kBwdBlockN, row0, rows, col0, seen,
                    !tile_is_clean(span, col0, seen), softcap ? w.dtanh.data() : nullptr);
      for (int r = 0; !fused && r < rows; ++r) {
        float* prob = w.probs.data() + r * kBwdBlockN;
        exp2_shifted(prob, w.lse_log2[r], seen, prob);
      }
      // dP = dO V^T
      if (packed != nullptr) {
        scores_on_amx(PackedQueryTiles::kDout, w.v_transposed.data(), w.dprobs.data());
      } else if (in.simd != nullptr) {
        in.simd->product(rows, seen, dim, {dout_tile.data, dout_tile.ld, 1}, ops.v_transposed.data(), ops.keys_ld,
                         w.dprobs.data(), kBwdBlockN, false);
      } else {
        gemm_nt(rows, seen, dim, dout_tile, v_tile, 0.0f, w.dprobs.data(), kBwdBlockN);
      }

      float* dq_rows = dq_partial + packed_q_row(f, seq, row0) * dim;
      if (fused) {
        // P, dS = P o (dP - D) (times tanh') and their bf16 operands in one pass.
        amx::backward_operands(w.probs.data(), w.dprobs.data(), softcap ? w.dtanh.data() : nullptr, kBwdBlockN,
                               w.lse_log2.data(), w.delta.data(), rows, seen, w.p_pairs.data(), w.ds_pairs.data(),
                               w.ds_rows.data(), kBwdBlockN);
        products_on_amx(in.bf16, *packed, task, query_tile, rows, seen, dim, dq_rows, w);
        continue;
      }
      if (dropout.enabled) {
        // The forward used Z o P / (1 - p): dV sees the dropped P, dS the dropped dP.
        for (int r = 0; r < rows; ++r) {
          dropout.apply_row(w.dprobs.data() + r * kBwdBlockN, row0 + r, col0, seen, false);
        }
      }
      // dS = P o (dP - D), times tanh' under softcap.  Computed before P is overwritten by Z o P.
      for (int r = 0; r < rows; ++r) {
        const float* prob = w.probs.data() + r * kBwdBlockN;
        float* ds = w.dprobs.data() + r * kBwdBlockN;
        for (int c = 0; c < seen; ++c) ds[c] = prob[c] * (ds[c] - w.delta[r]);
        if (softcap) {
          const float* dt = w.dtanh.data() + r * kBwdBlockN;
          for (int c = 0; c < seen; ++c) ds[c] *= dt[c];
        }
      }
      if (dropout.enabled) {
        for (int r = 0; r < rows; ++r) {
          dropout.apply_row(w.probs.data() + r * kBwdBlockN, row0 + r, col0, seen, false);
        }
      }
      // dV += (Z o P)^T dO;  dK += dS^T Q;  dQ += dS K.
      if (packed != nullptr) {
        pack_on_amx(rows, seen, w);
        products_on_amx(in.bf16, *packed, task, query_tile, rows, seen, dim, dq_rows, w);
        continue;
      }
      if (in.simd != nullptr) {
        in.simd->product(seen, dim, rows, {w.probs.data(), 1, kBwdBlockN}, dout_tile.data, dout_tile.ld, w.dv.data(),
                         dim, true);
        in.simd->product(seen, dim, rows, {w.dprobs.data(), 1, kBwdBlockN}, q_tile.data, q_tile.ld, w.dk.data(), dim,
                         true);
        in.simd->product(rows, dim, seen, {w.dprobs.data(), kBwdBlockN, 1}, k_tile.data, k_tile.ld, dq_rows, dim, true);
        continue;
      }
      const Matrix p_tile{w.probs.data(), kBwdBlockN};
      const Matrix ds_tile{w.dprobs.data(), kBwdBlockN};
      gemm_tn(seen, dim, rows, p_tile, dout_tile, 1.0f, w.dv.data(), dim);
      gemm_tn(seen, dim, rows, ds_tile, q_tile, 1.0f, w.dk.data(), dim);
      gemm_nn(rows, dim, seen, ds_tile, k_tile, 1.0f, dq_rows, dim);
    }
    const int64_t k_row = packed_k_row(f, seq, col0);
    float* dk_rows = buf.dk_expanded.data() + (task.head * buf.k_rows + k_row) * dim;
    float* dv_rows = buf.dv_expanded.data() + (task.head * buf.k_rows + k_row) * dim;
    if (packed != nullptr) {
      // dK = (dK^T)^T, dV = (dV^T)^T: once per key tile, into the expanded rows.
      for (int c = 0; c < cols; ++c) {
        for (int d = 0; d < dim; ++d) {
          dk_rows[c * dim + d] = w.dk_transposed[d * kBwdBlockN + c];
          dv_rows[c * dim + d] = w.dv_transposed[d * kBwdBlockN + c];
        }
      }
    } else {
      std::copy(w.dk.begin(), w.dk.begin() + cols * dim, dk_rows);
      std::copy(w.dv.begin(), w.dv.begin() + cols * dim, dv_rows);
    }
  }
}

// dQ = scale * sum over chunks (fixed order); dK, dV = sums over the query heads of each group.
void write_gradients(const BackwardParams& p, const BackwardBuffers& buf) {
  const ForwardParams& f = p.fwd;
  const int dim = f.head_dim;
  const int group = f.num_heads / f.num_heads_k;
  // d score / d(q.k) = scale (times tanh', already folded into dS under softcap).
  const float grad_scale = f.softmax_scale;
  const StridedRows dq = q_like(p.dq, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride);
  const StridedRows dk = k_like(p.dk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride);
  const StridedRows dv = k_like(p.dv, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride);
  const int64_t tasks = static_cast<int64_t>(f.batch) * f.num_heads;
  parallel_tasks<std::vector<float>>(
      tasks, f.num_threads, [&] { return std::vector<float>(dim); },
      [&](int64_t task, std::vector<float>& acc) {
        const int b = static_cast<int>(task / f.num_heads), h = static_cast<int>(task % f.num_heads);
        const SequenceView seq = sequence_view(f, b);
        for (int r = 0; r < seq.seqlen_q; ++r) {
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (int c = 0; c < buf.chunks; ++c) {
            const float* part = buf.dq_partial.data() +
                                ((static_cast<int64_t>(c) * f.num_heads + h) * buf.q_rows +
                                 packed_q_row(f, seq, r)) * dim;
            for (int d = 0; d < dim; ++d) acc[d] += part[d];
          }
          scale_row(acc.data(), grad_scale, dim);
          store_row(f.dtype, acc.data(), dim, p.dq, dq.offset(seq, r, h));
        }
        if (h % group != 0) return;  // the group's first head writes dK, dV for the KV head
        const int head_k = h / group;
        // Keys past seqused_k get no gradient: write them as zeros.
        const int stored_keys = f.cu_seqlens_k ? f.cu_seqlens_k[b + 1] - f.cu_seqlens_k[b] : f.seqlen_k;
        for (int r = 0; r < stored_keys; ++r) {
          const bool used = r < seq.seqlen_k;
          for (int which = 0; which < 2; ++which) {
            const ScratchArray<float>& expanded = which == 0 ? buf.dk_expanded : buf.dv_expanded;
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (int g = 0; used && g < group; ++g) {
              const float* part = expanded.data() +
                                  ((h + g) * buf.k_rows + packed_k_row(f, seq, r)) * dim;
              for (int d = 0; d < dim; ++d) acc[d] += part[d];
            }
            if (which == 0) scale_row(acc.data(), grad_scale, dim);
            store_row(f.dtype, acc.data(), dim, which == 0 ? p.dk : p.dv,
                      (which == 0 ? dk : dv).offset(seq, r, head_k));
          }
        }
      });
}

}  // namespace
}  // namespace cpu

void cpu_backward(const BackwardParams& p) {
  using namespace cpu;
  const ForwardParams& f = p.fwd;
  const bool varlen = f.cu_seqlens_q != nullptr;
  BackwardBuffers buf;
  buf.q_rows = varlen ? f.total_q : static_cast<int64_t>(f.batch) * f.seqlen_q;
  buf.k_rows = varlen ? f.total_k : static_cast<int64_t>(f.batch) * f.seqlen_k;
  // No query row and no key: no gradient has an element. The loops below visit every (batch, head)
  // pair however empty (~3 minutes at 2^30 heads on two cores).
  if (buf.q_rows == 0 && buf.k_rows == 0) return;
  // Split the keys into more chunks only when (batch, head) pairs are too few to feed the
  // threads; each chunk costs one more float32 dQ partial of q_rows x D per head.
  const int threads = resolve_threads(f.num_threads);
  const int64_t pairs = static_cast<int64_t>(f.batch) * f.num_heads;
  const int max_key_tiles = std::max(1, ceil_div(f.seqlen_k, kBwdBlockN));
  buf.chunks = static_cast<int>(
      std::clamp<int64_t>((2 * threads + pairs - 1) / std::max<int64_t>(pairs, 1), 1, max_key_tiles));
  const int64_t dim = f.head_dim;
  buf.delta.assign(f.num_heads * buf.q_rows, 0.0f);
  buf.dq_partial = ScratchArray<float>(buf.chunks * f.num_heads * buf.q_rows * dim);
  buf.dk_expanded = ScratchArray<float>(f.num_heads * buf.k_rows * dim);
  buf.dv_expanded = ScratchArray<float>(f.num_heads * buf.k_rows * dim);
  compute_delta(p, buf);
  // Without query rows or without keys no score exists: the gradients are zeros.
  if (buf.q_rows == 0 || buf.k_rows == 0) {
    for (ScratchArray<float>* zeros : {&buf.dq_partial, &buf.dk_expanded, &buf.dv_expanded}) {
      std::fill(zeros->data(), zeros->data() + zeros->size(), 0.0f);
    }
    write_gradients(p, buf);
    return;
  }
  Inputs in;
  in.k = k_like(f.k, f.k_batch_stride, f.k_row_stride, f.k_head_stride);
  in.v = k_like(f.v, f.v_batch_stride, f.v_row_stride, f.v_head_stride);
  // bf16 products on AMX or AVX512-BF16 where the CPU has either: Q and dO packed from the call's
  // tensors, without the float32 copies the sgemm path reads.
  std::unique_ptr<PackedQueryTiles> packed;
  in.bf16 = f.dtype == TILEATTN_BFLOAT16 ? amx::engine() : amx::Engine::kNone;
  if (in.bf16 != amx::Engine::kNone) {
    packed = std::make_unique<PackedQueryTiles>(f, q_like(f.q, f.q_batch_stride, f.q_row_stride, f.q_head_stride),
                                                q_like(p.dout, p.dout_batch_stride, p.dout_row_stride, p.dout_head_stride));
    in.packed = packed.get();
  } else {
    in.q = float32_operand(f, f.q, f.q_batch_stride, f.q_row_stride, f.q_head_stride, false);
    in.dout = float32_operand(f, p.dout, p.dout_batch_stride, p.dout_row_stride, p.dout_head_stride, false);
    in.simd = simd::kernels();
  }
  // Task t is (batch, chunk, head) in that nesting order, worked out from t rather than listed (a
  // list is 12 bytes a task: 12 GB at 2^30 heads).
  const int64_t heads = f.num_heads, per_batch = heads * buf.chunks;
  parallel_tasks<BackwardScratch>(
      f.batch * per_batch, f.num_threads, [&] { return BackwardScratch(f.head_dim, in.packed, in.simd != nullptr); },
      [&](int64_t t, BackwardScratch& w) {
        const KeyChunk task{static_cast<int>(t / per_batch), static_cast<int>(t % heads),
                            static_cast<int>(t % per_batch / heads)};
        backward_chunk(p, in, task, buf, w);
      });
  write_gradients(p, buf);
}

}  // namespace tileattn
