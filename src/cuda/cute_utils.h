// Small CuTe helpers the forward kernel shares: accumulator views, type conversion, predicated
// tile copies and quad reductions.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>

namespace tileattn::cuda {

// The mma.sync m16n8 accumulator fragment ((2 cols, 2 rows), MMA_M, MMA_N) seen as a
// (rows, cols) matrix ((2, MMA_M), (2, MMA_N)), so softmax code can loop over rows.
template <typename Layout>
__device__ __forceinline__ auto acc_rowcol_layout(Layout acc) {
  static_assert(decltype(cute::size<0>(acc))::value == 4);
  static_assert(decltype(cute::rank(acc))::value == 3);
  auto l = cute::logical_divide(acc, cute::Shape<cute::_2>{});
  return cute::make_layout(cute::make_layout(cute::get<0, 1>(l), cute::get<1>(l)),
                           cute::make_layout(cute::get<0, 0>(l), cute::get<2>(l)));
}

// The same accumulator fragment reused as the A operand of the next m16n8k16 MMA: two
// neighbouring n8 accumulators form one k16 A fragment ((2, 2, 2), MMA_M, MMA_N / 2).  This is
// what lets P stay in registers between S = Q K^T and O += P V.
template <typename Layout>
__device__ __forceinline__ auto acc_as_operand_a_layout(Layout acc) {
  static_assert(decltype(cute::size<0>(acc))::value == 4);
  auto l = cute::logical_divide(acc, cute::Shape<cute::Underscore, cute::Underscore, cute::_2>{});
  return cute::make_layout(cute::make_layout(cute::get<0>(l), cute::get<2, 0>(l)), cute::get<1>(l),
                           cute::get<2, 1>(l));
}

// Register tensor of another element type, converted with the packed (x2) instructions.
template <typename To, typename Engine, typename Layout>
__device__ __forceinline__ auto convert_fragment(cute::Tensor<Engine, Layout> const& src) {
  using From = typename Engine::value_type;
  constexpr int kN = decltype(cute::size(src))::value;
  auto dst = cute::make_tensor<To>(src.layout());
  cutlass::NumericArrayConverter<To, From, kN> converter;
  *reinterpret_cast<cutlass::Array<To, kN>*>(dst.data()) =
      converter(*reinterpret_cast<const cutlass::Array<From, kN>*>(src.data()));
  return dst;
}

// Copies a (CPY, CPY_ROWS, CPY_COLS) partition, skipping rows at or past max_rows (when
// kCheckRows) and column chunks whose predicate is false; what is skipped is zero-filled in dst,
// so padded head-dim columns and rows past the sequence end read as 0 in the MMAs.
template <bool kCheckRows, typename TiledCopy, typename TensorS, typename TensorD, typename TensorC,
          typename TensorP>
__device__ __forceinline__ void copy_tile_predicated(TiledCopy const& tiled_copy, TensorS const& src,
                                                     TensorD&& dst, TensorC const& coords,
                                                     TensorP const& col_ok, int max_rows) {
  CUTE_UNROLL
  for (int m = 0; m < cute::size<1>(src); ++m) {
    if (!kCheckRows || cute::get<0>(coords(0, m, 0)) < max_rows) {
      CUTE_UNROLL
      for (int k = 0; k < cute::size<2>(src); ++k) {
        if (col_ok(k)) {
          cute::copy(tiled_copy, src(cute::_, m, k), dst(cute::_, m, k));
        } else {
          cute::clear(dst(cute::_, m, k));
        }
      }
    } else {
      cute::clear(dst(cute::_, m, cute::_));
    }
  }
}

// Reduction across the 4 threads of a quad, which together hold one accumulator row.
template <typename Op>
__device__ __forceinline__ float quad_allreduce(float x, Op op) {
  x = op(x, __shfl_xor_sync(0xffffffffu, x, 2));
  x = op(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return x;
}

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};

}  // namespace tileattn::cuda
