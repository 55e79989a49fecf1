// Scratch buffers a kernel sequence needs for one call (the backward's float32 dQ accumulator and
// D = rowsum(dO * O), the decode's per-split partial O and LSE), allocated stream-ordered from
// tileattn's own memory pool: no device sync, capturable in a CUDA graph (a capture turns each
// allocation into a graph memory node), and no change to the device's default pool, which belongs
// to the application (PyTorch, cuDNN and others allocate from it too).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tileattn::cuda {

// The pool of the current device, created on first use.  It keeps up to 256 MB cached across
// synchronizations: with a release threshold of 0 every synchronize hands the memory back to the
// driver and the next call maps it again, which cost 200-400 us per eager decode call when first
// measured on the H200.
cudaMemPool_t workspace_pool();

// Buffers freed on the stream, after the work queued before the destructor runs.
class StreamWorkspace {
 public:
  explicit StreamWorkspace(cudaStream_t stream);
  StreamWorkspace(const StreamWorkspace&) = delete;
  StreamWorkspace& operator=(const StreamWorkspace&) = delete;
  ~StreamWorkspace();

  float* floats(int64_t count, bool zeroed);
  int* ints(int64_t count) { return reinterpret_cast<int*>(floats(count, true)); }  // zeroed

 private:
  static constexpr int kMaxBuffers = 6;  // the backward's five plus one spare
  cudaStream_t stream_;
  cudaMemPool_t pool_;
  void* buffers_[kMaxBuffers] = {};
  int used_ = 0;
};

}  // namespace tileattn::cuda
