// The products' code for one instruction set, written once over a traits type `Isa` (simd_avx512.cpp,
// simd_avx2.cpp): each of those files includes this after `#pragma GCC target` for its instruction
// set, so the templates below are compiled for it.  Isa provides:
//   Vec, Mask; kLanes (floats a vector), kRows x kVectors (the register block);
//   mask(count) (the first `count` lanes), load/store (whole vectors), load_masked/store_masked,
//   zero(), broadcast(x), fma(a, b, c) = a b + c, reduce_add(v) (the sum of the lanes),
//   widen_bf16(p), widen_fp16(p) (kLanes 16-bit values as floats),
//   gather_column(base, stride, mask) (lane i from base[i * stride], stride fitting 32-bit offsets).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "cpu/simd_product.h"

// Everything here has internal linkage (an unnamed namespace): each instruction set's file compiles
// its own copy for its target, and no inline function of one may stand in for the other's at link
// time.  Headers with inline code these use (the standard library's) are included before the
// `#pragma GCC target` by the including files, so they keep the library's baseline target.
namespace tileattn::cpu::simd::block_code {
namespace {

// C rows [0, R) x columns [0, kLanes NV) of one block, the last vector's lanes limited to `tail`
// unless kWhole (then whole vectors: with a mask GCC reloaded the AVX-512 mask register from the
// stack at every depth step, and the whole-vector clone ran 1.05-1.1x on one core).
template <class Isa, int R, int NV, bool kWhole>
void block(int k, const float* a, int64_t a_row, int64_t a_depth, const float* b, int64_t ldb, float* c, int64_t ldc,
           typename Isa::Mask tail, bool accumulate) {
  using Vec = typename Isa::Vec;
  auto load = [tail](int v, const float* p) {
    return v == NV - 1 && !kWhole ? Isa::load_masked(p, tail) : Isa::load(p);
  };
  Vec acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = accumulate ? load(v, c + r * ldc + v * Isa::kLanes) : Isa::zero();
  }
#pragma GCC unroll 2
  for (int l = 0; l < k; ++l) {
    Vec bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = load(v, b + l * ldb + v * Isa::kLanes);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const Vec ar = Isa::broadcast(a[r * a_row + l * a_depth]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[r][v] = Isa::fma(ar, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      float* dst = c + r * ldc + v * Isa::kLanes;
      if (v == NV - 1 && !kWhole) {
        Isa::store_masked(dst, tail, acc[r][v]);
      } else {
        Isa::store(dst, acc[r][v]);
      }
    }
  }
}

template <class Isa>
using BlockFn = void (*)(int, const float*, int64_t, int64_t, const float*, int64_t, float*, int64_t,
                         typename Isa::Mask, bool);

template <class Isa, int R, bool kWhole>
BlockFn<Isa> block_of_width(int vectors) {
  static_assert(Isa::kVectors <= 4, "blocks of at most 4 vectors a row");
  switch (vectors) {
    case 1: return block<Isa, R, 1, kWhole>;
    case 2: return block<Isa, R, 2, kWhole>;
    case 3: return block<Isa, R, 3, kWhole>;
    default: return block<Isa, R, 4, kWhole>;
  }
}

template <class Isa, bool kWhole>
BlockFn<Isa> block_fn(int rows, int vectors) {
  static_assert(Isa::kRows <= 6, "blocks of at most 6 rows");
  switch (rows) {
    case 1: return block_of_width<Isa, 1, kWhole>(vectors);
    case 2: return block_of_width<Isa, 2, kWhole>(vectors);
    case 3: return block_of_width<Isa, 3, kWhole>(vectors);
    case 4: return block_of_width<Isa, 4, kWhole>(vectors);
    case 5: return block_of_width<Isa, 5, kWhole>(vectors);
    default: return block_of_width<Isa, 6, kWhole>(vectors);
  }
}

// Column panels of kVectors vectors outside, row blocks inside: a panel of B (k x 64 floats on
// AVX-512, 32 KB at k = 128) stays in L1 while A's rows stream past it.
template <class Isa>
void product(int m, int n, int k, const StridedOperand& a, const float* b, int64_t ldb, float* c, int64_t ldc,
             bool accumulate) {
  constexpr int kPanel = Isa::kVectors * Isa::kLanes;
  for (int n0 = 0; n0 < n; n0 += kPanel) {
    const int width = std::min(kPanel, n - n0);
    const int vectors = (width + Isa::kLanes - 1) / Isa::kLanes;
    const int tail_lanes = width - (vectors - 1) * Isa::kLanes;
    const bool whole = tail_lanes == Isa::kLanes;
    const typename Isa::Mask tail = Isa::mask(tail_lanes);
    for (int m0 = 0; m0 < m; m0 += Isa::kRows) {
      const int rows = std::min(Isa::kRows, m - m0);
      const BlockFn<Isa> fn = whole ? block_fn<Isa, true>(rows, vectors) : block_fn<Isa, false>(rows, vectors);
      fn(k, a.data + m0 * a.row, a.row, a.depth, b + n0, ldb, c + m0 * ldc + n0, ldc, tail, accumulate);
    }
  }
}

template <class Isa>
void transpose(const float* src, int64_t src_ld, int rows, int cols, float* dst, int64_t dst_ld) {
  // The gathers' offsets are 32-bit: rows further apart (a view with a huge key stride) go one by one.
  if (src_ld > std::numeric_limits<int32_t>::max() / Isa::kLanes) {
    for (int c = 0; c < cols; ++c) {
      for (int r = 0; r < rows; ++r) dst[c * dst_ld + r] = src[r * src_ld + c];
    }
    return;
  }
  for (int r0 = 0; r0 < rows; r0 += Isa::kLanes) {
    const int count = std::min(Isa::kLanes, rows - r0);
    const typename Isa::Mask lanes = Isa::mask(count);
    const float* column = src + r0 * src_ld;
    for (int c = 0; c < cols; ++c) {
      Isa::store_masked(dst + c * dst_ld + r0, lanes, Isa::gather_column(column + c, src_ld, lanes));
    }
  }
}

// A K or V row's elements as float vectors: float32 read as is, bf16 and fp16 widened as loaded
// (so a 16-bit cache is read in place, with no float32 copy of its tiles).  A row's last vector,
// where the row ends inside it, is widened from a zero-padded copy of its bits: converted one by
// one (convert.h), fp16 went through libgcc's __extendhfsf2 (the library's baseline target has no
// F16C), and that call inside the loop made GCC keep the kernels' sums on the stack at every head
// dim (fp16 decode 1 x 32k d128 at 0.70x bf16's speed).
//
// The 16-bit element types: their bits, and kLanes of them widened.
struct Bf16 {
  uint16_t bits;
  template <class Isa>
  static typename Isa::Vec widen(const uint16_t* p) { return Isa::widen_bf16(p); }
};
struct Fp16 {
  uint16_t bits;
  template <class Isa>
  static typename Isa::Vec widen(const uint16_t* p) { return Isa::widen_fp16(p); }
};
template <class Isa, class T>
struct RowElements {
  static_assert(sizeof(T) == 2, "float32 has its own specialization; the rest are 16-bit");
  static typename Isa::Vec load(const T* p) { return T::template widen<Isa>(&p->bits); }
  static typename Isa::Vec load_tail(const T* p, int count, typename Isa::Mask) {
    uint16_t bits[Isa::kLanes] = {};  // zero bits are 0.0 in both formats
    for (int i = 0; i < count; ++i) bits[i] = p[i].bits;
    return T::template widen<Isa>(bits);
  }
};
template <class Isa>
struct RowElements<Isa, float> {
  static typename Isa::Vec load(const float* p) { return Isa::load(p); }
  static typename Isa::Vec load_tail(const float* p, int, typename Isa::Mask lanes) { return Isa::load_masked(p, lanes); }
};

template <class T>
void prefetch_row(const T* row, int dim) {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < int64_t{dim} * static_cast<int64_t>(sizeof(T)); b += 64) _mm_prefetch(bytes + b, _MM_HINT_T0);
}

// S rows [0, R) (ld lds) = Q K^T for R query rows: each K row is read once as vectors along D and
// dotted with the R query rows (the tile products' blocks would broadcast K one element at a time
// into vectors with R of their lanes busy).  R is a template argument so that the R sums stay in
// registers (with a run-time count GCC kept them on the stack).
template <class Isa, class T, int R>
void few_rows_scores_block(int cols, int listed, int dim, const float* q, int64_t ldq, const void* const* k, float* s,
                           int64_t lds) {
  using Vec = typename Isa::Vec;
  using Row = RowElements<Isa, T>;
  const int vectors = (dim + Isa::kLanes - 1) / Isa::kLanes;
  const int tail_count = dim - (vectors - 1) * Isa::kLanes;
  const typename Isa::Mask tail = Isa::mask(tail_count);
  for (int c = 0; c < cols; ++c) {
    const T* key = static_cast<const T*>(k[c]);
    if (c + kFewRowsAhead < listed) prefetch_row(static_cast<const T*>(k[c + kFewRowsAhead]), dim);
    Vec acc[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[r] = Isa::zero();
    for (int v = 0; v < vectors; ++v) {
      const bool partial = v == vectors - 1 && tail_count < Isa::kLanes;
      const T* at = key + v * Isa::kLanes;
      const Vec kv = partial ? Row::load_tail(at, tail_count, tail) : Row::load(at);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const float* qv = q + r * ldq + v * Isa::kLanes;
        acc[r] = Isa::fma(partial ? Isa::load_masked(qv, tail) : Isa::load(qv), kv, acc[r]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) s[r * lds + c] = Isa::reduce_add(acc[r]);
  }
}

// S (rows x cols, ld lds) = Q K^T for a few query rows, 4 at a time.
template <class Isa, class T>
void few_rows_scores_of(int rows, int cols, int listed, int dim, const float* q, int64_t ldq, const void* const* k,
                        float* s, int64_t lds) {
  for (int r0 = 0; r0 < rows; r0 += 4) {
    const float* qr = q + r0 * ldq;
    float* sr = s + r0 * lds;
    switch (std::min(4, rows - r0)) {
      case 1: few_rows_scores_block<Isa, T, 1>(cols, listed, dim, qr, ldq, k, sr, lds); break;
      case 2: few_rows_scores_block<Isa, T, 2>(cols, listed, dim, qr, ldq, k, sr, lds); break;
      case 3: few_rows_scores_block<Isa, T, 3>(cols, listed, dim, qr, ldq, k, sr, lds); break;
      default: few_rows_scores_block<Isa, T, 4>(cols, listed, dim, qr, ldq, k, sr, lds); break;
    }
  }
}

// O rows [0, R) x columns [d0, d0 + NV kLanes) (ld ldo) += P V: V's rows read as vectors, the R P
// rows broadcast against each, the R x NV sums in registers (template arguments, as above).
template <class Isa, class T, int R, int NV>
void few_rows_accumulate_block(int cols, int listed, int dim, int d0, int tail_count, const float* p, int64_t ldp,
                               const void* const* v, float* o, int64_t ldo) {
  using Vec = typename Isa::Vec;
  using Row = RowElements<Isa, T>;
  const typename Isa::Mask tail = Isa::mask(tail_count);
  const bool whole = tail_count == Isa::kLanes;
  Vec acc[R][NV];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      const float* at = o + r * ldo + d0 + j * Isa::kLanes;
      acc[r][j] = j == NV - 1 && !whole ? Isa::load_masked(at, tail) : Isa::load(at);
    }
  }
  for (int c = 0; c < cols; ++c) {
    const T* value = static_cast<const T*>(v[c]) + d0;
    if (d0 == 0 && c + kFewRowsAhead < listed) prefetch_row(static_cast<const T*>(v[c + kFewRowsAhead]), dim);
    Vec vv[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      vv[j] = j == NV - 1 && !whole ? Row::load_tail(value + j * Isa::kLanes, tail_count, tail)
                                    : Row::load(value + j * Isa::kLanes);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const Vec weight = Isa::broadcast(p[r * ldp + c]);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[r][j] = Isa::fma(weight, vv[j], acc[r][j]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      float* dst = o + r * ldo + d0 + j * Isa::kLanes;
      if (j == NV - 1 && !whole) {
        Isa::store_masked(dst, tail, acc[r][j]);
      } else {
        Isa::store(dst, acc[r][j]);
      }
    }
  }
}

template <class Isa, class T, int R>
void few_rows_accumulate_rows(int cols, int listed, int dim, const float* p, int64_t ldp, const void* const* v,
                              float* o, int64_t ldo) {
  constexpr int kPanel = Isa::kVectors * Isa::kLanes;
  for (int d0 = 0; d0 < dim; d0 += kPanel) {
    const int width = std::min(kPanel, dim - d0);
    const int vectors = (width + Isa::kLanes - 1) / Isa::kLanes;
    const int tail_count = width - (vectors - 1) * Isa::kLanes;
    switch (vectors) {
      case 1: few_rows_accumulate_block<Isa, T, R, 1>(cols, listed, dim, d0, tail_count, p, ldp, v, o, ldo); break;
      case 2: few_rows_accumulate_block<Isa, T, R, 2>(cols, listed, dim, d0, tail_count, p, ldp, v, o, ldo); break;
      case 3: few_rows_accumulate_block<Isa, T, R, 3>(cols, listed, dim, d0, tail_count, p, ldp, v, o, ldo); break;
      default: few_rows_accumulate_block<Isa, T, R, 4>(cols, listed, dim, d0, tail_count, p, ldp, v, o, ldo); break;
    }
  }
}

// O (rows x dim, ld ldo) += P V for a few rows, 4 at a time, a panel of kVectors vectors at a time.
template <class Isa, class T>
void few_rows_accumulate_of(int rows, int cols, int listed, int dim, const float* p, int64_t ldp, const void* const* v,
                            float* o, int64_t ldo) {
  static_assert(Isa::kVectors <= 4, "panels of at most 4 vectors");
  for (int r0 = 0; r0 < rows; r0 += 4) {
    const float* pr = p + r0 * ldp;
    float* orow = o + r0 * ldo;
    switch (std::min(4, rows - r0)) {
      case 1: few_rows_accumulate_rows<Isa, T, 1>(cols, listed, dim, pr, ldp, v, orow, ldo); break;
      case 2: few_rows_accumulate_rows<Isa, T, 2>(cols, listed, dim, pr, ldp, v, orow, ldo); break;
      case 3: few_rows_accumulate_rows<Isa, T, 3>(cols, listed, dim, pr, ldp, v, orow, ldo); break;
      default: few_rows_accumulate_rows<Isa, T, 4>(cols, listed, dim, pr, ldp, v, orow, ldo); break;
    }
  }
}

// The kernels' entry points: K and V rows of any of the three element types, each at its address.
template <class Isa>
void few_rows_scores(int rows, int cols, int listed, int dim, const float* q, int64_t ldq, const void* const* k,
                     tileattn_dtype dtype, float* s, int64_t lds) {
  switch (dtype) {
    case TILEATTN_BFLOAT16: return few_rows_scores_of<Isa, Bf16>(rows, cols, listed, dim, q, ldq, k, s, lds);
    case TILEATTN_FLOAT16: return few_rows_scores_of<Isa, Fp16>(rows, cols, listed, dim, q, ldq, k, s, lds);
    default: return few_rows_scores_of<Isa, float>(rows, cols, listed, dim, q, ldq, k, s, lds);
  }
}

template <class Isa>
void few_rows_accumulate(int rows, int cols, int listed, int dim, const float* p, int64_t ldp, const void* const* v,
                         tileattn_dtype dtype, float* o, int64_t ldo) {
  switch (dtype) {
    case TILEATTN_BFLOAT16: return few_rows_accumulate_of<Isa, Bf16>(rows, cols, listed, dim, p, ldp, v, o, ldo);
    case TILEATTN_FLOAT16: return few_rows_accumulate_of<Isa, Fp16>(rows, cols, listed, dim, p, ldp, v, o, ldo);
    default: return few_rows_accumulate_of<Isa, float>(rows, cols, listed, dim, p, ldp, v, o, ldo);
  }
}

}  // namespace
}  // namespace tileattn::cpu::simd::block_code
