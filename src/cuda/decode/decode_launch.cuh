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

namespace tileattn::cuda::decode {

// Stream-ordered float32 buffers for the partial results (cudaMallocAsync: no device sync, and
// capturable in a CUDA graph), freed on the stream after the combine.
class PartialBuffers {
 public:
  PartialBuffers(cudaStream_t stream, int64_t o_count, int64_t lse_count) : stream_(stream) {
    check_cuda(cudaMallocAsync(&o_, o_count * sizeof(float), stream), "cudaMallocAsync(decode partial O)");
    check_cuda(cudaMallocAsync(&lse_, lse_count * sizeof(float), stream), "cudaMallocAsync(decode partial LSE)");
  }
  PartialBuffers(const PartialBuffers&) = delete;
  PartialBuffers& operator=(const PartialBuffers&) = delete;
  ~PartialBuffers() {
    if (o_) cudaFreeAsync(o_, stream_);
    if (lse_) cudaFreeAsync(lse_, stream_);
  }
  float* o() const { return static_cast<float*>(o_); }
  float* lse() const { return static_cast<float*>(lse_); }

 private:
  cudaStream_t stream_;
  void* o_ = nullptr;
  void* lse_ = nullptr;
};

// Resident CTAs of the split kernel over all SMs, which the split heuristic fills.  Also, once:
// the device's default memory pool, which the partial buffers come from, keeps up to 256 MB
// cached; with its default threshold of 0 every synchronize hands the memory back and the next
// call maps it again, which cost 200-400 us per eager call in the first measurement.
template <typename T, int kD>
int prepare_split_kernel() {
  static const int resident = [] {
    int device = 0, sms = 0, per_sm = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, split_kernel<T, kD>, kThreads, 0),
               "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    cudaMemPool_t pool;
    check_cuda(cudaDeviceGetDefaultMemPool(&pool, device), "cudaDeviceGetDefaultMemPool");
    uint64_t threshold = 0;
    check_cuda(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold), "cudaMemPoolGetAttribute");
    threshold = std::max<uint64_t>(threshold, uint64_t{256} << 20);
    check_cuda(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold), "cudaMemPoolSetAttribute");
    return sms * std::max(per_sm, 1);
  }();
  return resident;
}

template <typename T, int kD>
void run_split(DecodeArgs args, cudaStream_t stream) {
  const tileattn_fwd_params& f = args.p.fwd;
  const int resident = prepare_split_kernel<T, kD>();
  const int64_t ctas = static_cast<int64_t>(f.batch) * args.row_blocks * f.num_heads_k;
  args.num_splits = choose_num_splits(args.num_splits, ctas, resident, f.seqlen_k);
  const dim3 grid(static_cast<unsigned>(f.batch * args.row_blocks), f.num_heads_k, args.num_splits);
  if (args.num_splits == 1) {
    split_kernel<T, kD><<<grid, kThreads, 0, stream>>>(args);
    check_cuda(cudaGetLastError(), "decode split kernel launch");
    return;
  }
  const int64_t rows = static_cast<int64_t>(f.batch) * f.num_heads * f.seqlen_q;
  PartialBuffers partial(stream, args.num_splits * rows * f.head_dim, args.num_splits * rows);
  args.o_partial = partial.o();
  args.lse_partial = partial.lse();
  split_kernel<T, kD><<<grid, kThreads, 0, stream>>>(args);
  check_cuda(cudaGetLastError(), "decode split kernel launch");
  combine_kernel<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(args);
  check_cuda(cudaGetLastError(), "decode combine kernel launch");
}

template <typename T>
void run_decode(DecodeArgs args, cudaStream_t stream) {
  const tileattn_fwd_params& f = args.p.fwd;
  if (args.p.k_new != nullptr) {
    append_kernel<T><<<dim3(args.p.seqlen_new, f.batch), kThreads, 0, stream>>>(args);
    check_cuda(cudaGetLastError(), "decode append kernel launch");
  }
  if (f.head_dim <= 64) {
    run_split<T, 64>(args, stream);
  } else if (f.head_dim <= 128) {
    run_split<T, 128>(args, stream);
  } else {
    run_split<T, 256>(args, stream);
  }
}

#define TILEATTN_INSTANTIATE_DECODE(T) template void run_decode<T>(DecodeArgs, cudaStream_t);

}  // namespace tileattn::cuda::decode
