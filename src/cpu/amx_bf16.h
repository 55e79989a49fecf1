// bfloat16 tile products on Intel AMX (Sapphire Rapids and later), for the CPU backend's bf16 calls.
// OpenBLAS has no bf16 product in Debian's build, so without AMX bf16 tiles are converted to
// float32 for sgemm; torch's CPU SDPA runs its bf16 products on AMX through oneDNN and was 3.5-5x
// faster than that path on a 2-core Sapphire Rapids host (docs/perf-log.md, session 53).  One
// `tdpbf16ps` multiplies a 16 x 32 bf16 tile by a 32 x 16 one into 16 x 16 float32 sums, exactly
// (products of bf16 are exact in float32; the sums round as float32 additions do).
//
// Operands, both bf16 and zero-padded, as the instruction reads them:
//   A (m x depth): rows of `ld` elements, m a multiple of 16, depth of 32;
//   B (depth x n): "pairs" layout, element (k, n) at data[(k / 2) * ld + 2 * n + k % 2], so that one
//   64-byte tile row holds 16 columns of two consecutive depth rows; n a multiple of 16.
// Chosen at run time (engine() below): AMX needs the CPU's AMX-BF16 and the OS's grant of the tile
// state (arch_prctl ARCH_REQ_XCOMP_PERM, Linux >= 5.16); CPUs without it but with AVX512-BF16 run
// the same operands through bf16_dot_product.h's vdpbf16ps kernel.
#pragma once

#include <cstdint>

namespace tileattn::cpu::amx {

constexpr int kRowsPerTile = 16;   // rows of an A or C tile
constexpr int kDepthPerStep = 32;  // bf16 depth of one tdpbf16ps (64 bytes a row)
constexpr int kColsPerTile = 16;   // float32 columns of a C tile

inline int round_up(int x, int multiple) { return (x + multiple - 1) / multiple * multiple; }

// What multiplies a bf16 call's operands in these layouts: AMX's tiles, AVX512-BF16's dot products
// (bf16_dot_product.h), or neither (the float32 products).
enum class Engine { kNone, kTiles, kDot };

// This call's engine, from TILEATTN_CPU_AMX (read on every call): auto takes the tiles where the CPU
// and OS offer them, else the dot products where the CPU has AVX512-BF16 (AMD Zen 4 and later), else
// none; off takes none; on takes the tiles and dot the dot products (so an AMX host tests the path of
// CPUs without tiles), each raising an error naming the variable where the CPU lacks it.
Engine engine();
inline bool enabled() { return engine() != Engine::kNone; }

struct RowsOperand {
  const uint16_t* data;
  int ld;  // elements from one row to the next
};

struct PairsOperand {
  const uint16_t* data;
  int ld;  // elements from one depth pair to the next: at least 2 n
};

// C (m x n float32, rows ldc apart) = A B, or C + A B with `accumulate`, on `engine` (not kNone).
// m and n multiples of 16, depth of 32, and C must have room for them.
void product(Engine engine, int m, int n, int depth, const RowsOperand& a, const PairsOperand& b, float* c, int ldc,
             bool accumulate);

// dst (rows_padded x depth_padded, rows dst_ld apart) <- src (rows x depth float32, ld src_ld)
// rounded to bf16 (nearest even; subnormal floats, below 1.2e-38, become 0: VCVTNEPS2BF16 treats
// them so), zeros elsewhere.
void pack_rows(const float* src, int src_ld, int rows, int depth, int rows_padded, int depth_padded, uint16_t* dst,
               int dst_ld);

// P's row for O += P V: y[i] = bf16(2^(scale x[i] - shift)) for i < count (one rounding: a fused
// multiply-add), zeros up to `padded`; returns the sum of the unrounded powers (the softmax's l).
// The same 2^x as exp2_shifted_sum: 0 below -126, NaN kept (so a NaN score still reaches l).
float exp2_row_to_bf16(const float* x, float scale, float shift, int count, int padded, uint16_t* y);

// The backward's operands of one tile pair in one pass over its rows x cols scores (finished: log2
// units, masked) and dP (both ld floats a row):
//   P = 2^(scores - lse_log2[r]) (exp2_row_to_bf16's 2^x), dS = P o (dP - delta[r]), times
//   dtanh (same layout) when it is not null;
// P and dS as pairs (B of dV^T += dO^T P and dK^T += Q^T dS: depth rows_deep = rows rounded up to
// 32, cols_wide columns, ld 2 cols_wide) and dS as rows (A of dQ += dS K: rows rounded up to 16, cols
// rounded up to 32, ds_rows_ld apart), each bf16 with zeros past rows and cols.  Three packing
// passes and the exp2 and dS loops over float32 tiles took ~40% of the bf16 backward's tile loop.
void backward_operands(const float* scores, const float* dprobs, const float* dtanh, int ld, const float* lse_log2,
                       const float* delta, int rows, int cols, uint16_t* p_pairs, uint16_t* ds_pairs, uint16_t* ds_rows,
                       int ds_rows_ld);

// dst (rows_padded x depth_padded, rows dst_ld apart) <- M^T for M (src_rows x src_cols float32, ld
// src_ld): A rows are M's columns, the depth runs over M's rows; zeros elsewhere.
void pack_rows_transposed(const float* src, int src_ld, int src_rows, int src_cols, int rows_padded,
                          int depth_padded, uint16_t* dst, int dst_ld);

// B = M^T from M (cols x depth float32, ld src_ld; S = Q K^T reads K so), in pairs layout with
// ld = 2 cols_padded: depth_padded / 2 pair rows, zeros past `cols` and `depth`.
void pack_pairs_transposed(const float* src, int src_ld, int cols, int depth, int cols_padded, int depth_padded,
                           uint16_t* dst);

// B = M from M (depth x cols float32, ld src_ld; O += P V reads V so), in pairs layout with
// ld = 2 cols_padded: depth_padded / 2 pair rows, zeros past `cols` and `depth`.
void pack_pairs(const float* src, int src_ld, int depth, int cols, int depth_padded, int cols_padded, uint16_t* dst);

// The same two from M's bf16 values where they lie (no rounding: the same bits as from M widened
// to float32): the backward's K and V key tiles, which it converted to float32 only to pack them.
void pack_pairs_transposed(const uint16_t* src, int64_t src_ld, int cols, int depth, int cols_padded,
                           int depth_padded, uint16_t* dst);
void pack_pairs(const uint16_t* src, int64_t src_ld, int depth, int cols, int depth_padded, int cols_padded,
                uint16_t* dst);

// One pair row of that layout from two bf16 rows: even[j], odd[j] at 2j, 2j + 1 for j < cols_padded
// (a multiple of 16), zeros past each row's count (nothing read there).
void pack_pair_row(const uint16_t* even, int even_count, const uint16_t* odd, int odd_count, int cols_padded,
                   uint16_t* out);

}  // namespace tileattn::cpu::amx
