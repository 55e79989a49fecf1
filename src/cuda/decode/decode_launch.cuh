// run_decode<T>: the launch sequence append -> split -> combine for one dtype, with the head dim
// rounded up to a bucket of 64, 128 or 256 (the split kernel's V vectors cover 64 dims per 8
// lanes; a smaller head dim is zero-padded in registers, never read past).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/check.h"
#include "cuda/decode/append_kernel.cuh"
#include "cuda/decode/combine_kernel.cuh"
#include "cuda/decode/decode_launch.h"
#include "cuda/decode/split_heuristic.h"
#include "cuda/decode/split_kernel.cuh"
#include "cuda/device_checks.h"  // sm_count
#include "cuda/stream_workspace.h"

namespace tileattn::cuda::decode {

// Dynamic shared memory of the split kernel: the TMA ring, or none.
template <typename T, int kD, bool kTma>
constexpr int split_dynamic_smem() {
  return kTma ? static_cast<int>(sizeof(TmaRing<T, kD>)) + 1024 : 0;  // + 1024: the kernel aligns the base
}

// Resident CTAs of the split kernel over all SMs, which the split heuristic fills.
template <typename T, int kD, int kHalves, bool kTma>
int prepare_split_kernel() {
  static const int resident = [] {
    int per_sm = 0;
    constexpr int dynamic_smem = split_dynamic_smem<T, kD, kTma>();
    if (dynamic_smem > 0) {
      check_cuda(cudaFuncSetAttribute(split_kernel<T, kD, kHalves, kTma>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      dynamic_smem),
                 "cudaFuncSetAttribute(decode split kernel)");
    }
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, split_kernel<T, kD, kHalves, kTma>, kThreads,
                                                             dynamic_smem),
               "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    return sm_count() * std::max(per_sm, 1);
  }();
  return resident;
}

// Programmatic dependent launch (compute capability 9.0 and later): the split and combine kernels
// are launched while the kernel before them in the stream still runs, and wait in-kernel
// (griddepcontrol.wait, which returns once that kernel has finished and its writes are visible)
// before they read or write anything in global memory.  The combine's launch latency (~2-3 us of
// the ~17 us fixed cost of a 1 x 2k decode call, session 12) then overlaps the split kernel, and
// the split kernel's launch overlaps whatever ran before it (in a decode step, the previous
// layer's last kernel; in bench/gpu/decode.py, the previous call's combine).
inline bool programmatic_launch_supported() {
  static const bool supported = [] {
    int device = 0, major = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
    return major >= 9;
  }();
  return supported;
}

template <typename Kernel>
void launch_programmatic(Kernel kernel, dim3 grid, int dynamic_smem, cudaStream_t stream, const DecodeArgs& args,
                         const char* what) {
  if (!programmatic_launch_supported()) {
    kernel<<<grid, kThreads, dynamic_smem, stream>>>(args);
    check_cuda(cudaGetLastError(), what);
    return;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = static_cast<size_t>(dynamic_smem);
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  check_cuda(cudaLaunchKernelEx(&config, kernel, args), what);
}

template <typename T, int kD, int kHalves, bool kTma>
void launch_split(DecodeArgs args, cudaStream_t stream) {
  const tileattn_fwd_params& f = args.p.fwd;
  const int resident = prepare_split_kernel<T, kD, kHalves, kTma>();
  constexpr int dynamic_smem = split_dynamic_smem<T, kD, kTma>();
  const int64_t ctas = static_cast<int64_t>(f.batch) * args.row_blocks * f.num_heads_k;
  constexpr int step = kTma ? TmaRing<T, kD>::kKeys : kChunk;  // keys a warp takes at a time
  args.num_splits = choose_num_splits(args.num_splits, ctas, resident, f.seqlen_k, step);
  const dim3 grid(static_cast<unsigned>(ctas), args.num_splits);
  if (args.num_splits == 1) {
    launch_programmatic(split_kernel<T, kD, kHalves, kTma>, grid, dynamic_smem, stream, args,
                        "decode split kernel launch");
    return;
  }
  const int64_t rows = static_cast<int64_t>(f.batch) * f.num_heads * f.seqlen_q;
  StreamWorkspace partial(stream);  // freed on the stream after the combine
  args.o_partial = partial.floats(args.num_splits * rows * f.head_dim, false);
  args.lse_partial = partial.floats(args.num_splits * rows, false);
  launch_programmatic(split_kernel<T, kD, kHalves, kTma>, grid, dynamic_smem, stream, args,
                      "decode split kernel launch");
  launch_programmatic(combine_kernel<T>, dim3(static_cast<unsigned>(rows)), 0, stream, args,
                      "decode combine kernel launch");
}

// The TMA kernel when the caller set it up (cuda_decode.cu) for exactly this head dim (the tensor
// map's box is kD wide), else the register kernel.
template <typename T, int kD, int kHalves>
void run_split(DecodeArgs args, cudaStream_t stream) {
  if (args.tma && args.p.fwd.head_dim == kD) {
    launch_split<T, kD, kHalves, true>(args, stream);
  } else {
    launch_split<T, kD, kHalves, false>(args, stream);
  }
}

template <typename T>
void run_decode(DecodeArgs args, cudaStream_t stream) {
  const tileattn_fwd_params& f = args.p.fwd;
  if (args.p.k_new != nullptr) {
    append_kernel<T><<<dim3(args.p.seqlen_new, f.batch), kThreads, 0, stream>>>(args);
    check_cuda(cudaGetLastError(), "decode append kernel launch");
  }
  // At most 8 rows a CTA (one KV group's heads x seqlen_q): the kernel without the padded rows.
  const bool half_rows = args.rows <= kRows / 2;
  if (f.head_dim <= 64) {
    half_rows ? run_split<T, 64, 1>(args, stream) : run_split<T, 64, 2>(args, stream);
  } else if (f.head_dim <= 128) {
    half_rows ? run_split<T, 128, 1>(args, stream) : run_split<T, 128, 2>(args, stream);
  } else {
    half_rows ? run_split<T, 256, 1>(args, stream) : run_split<T, 256, 2>(args, stream);
  }
}

#define TILEATTN_INSTANTIATE_DECODE(T) template void run_decode<T>(DecodeArgs, cudaStream_t);

}  // namespace tileattn::cuda::decode
