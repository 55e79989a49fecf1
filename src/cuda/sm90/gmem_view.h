// The (rows, head_dim, heads, batch) view of a q/k/v/out-shaped tensor in global memory that the
// sm90 kernels build their TMA descriptors from (forward: launch_sm90.h, warp-specialized
// backward: bwd_ws_launch.cuh).  The head dim is the contiguous mode.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>

namespace tileattn::cuda::sm90 {

template <typename Pointer>
auto gmem_view(Pointer ptr, int rows, int head_dim, int heads, int batch, int64_t row_stride, int64_t head_stride,
               int64_t batch_stride) {
  using namespace cute;
  return make_tensor(make_gmem_ptr(ptr), make_layout(make_shape(rows, head_dim, heads, batch),
                                                     make_stride(row_stride, _1{}, head_stride, batch_stride)));
}

}  // namespace tileattn::cuda::sm90
