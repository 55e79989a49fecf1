#include "cuda/stream_workspace.h"

#include <mutex>
#include <vector>

#include "cuda/check.h"

namespace tileattn::cuda {

cudaMemPool_t workspace_pool() {
  static std::mutex mutex;
  static std::vector<cudaMemPool_t> pools;  // per device ordinal, created lazily, never destroyed
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  const std::lock_guard<std::mutex> lock(mutex);
  if (static_cast<int>(pools.size()) <= device) pools.resize(device + 1, nullptr);
  if (pools[device] == nullptr) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t pool = nullptr;
    check_cuda(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate(tileattn workspace)");
    uint64_t threshold = uint64_t{256} << 20;
    check_cuda(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold),
               "cudaMemPoolSetAttribute(tileattn workspace)");
    pools[device] = pool;
  }
  return pools[device];
}

StreamWorkspace::StreamWorkspace(cudaStream_t stream) : stream_(stream), pool_(workspace_pool()) {}

StreamWorkspace::~StreamWorkspace() {
  for (int i = 0; i < used_; ++i) cudaFreeAsync(buffers_[i], stream_);
}

float* StreamWorkspace::floats(int64_t count, bool zeroed) {
  if (used_ == kMaxBuffers) {
    throw Error(ErrorCode::kInternal, "", "StreamWorkspace: more buffers than kMaxBuffers");
  }
  void* ptr = nullptr;
  const size_t bytes = static_cast<size_t>(count > 0 ? count : 1) * sizeof(float);
  check_cuda(cudaMallocFromPoolAsync(&ptr, bytes, pool_, stream_), "cudaMallocFromPoolAsync(tileattn workspace)");
  buffers_[used_++] = ptr;
  if (zeroed) check_cuda(cudaMemsetAsync(ptr, 0, bytes, stream_), "cudaMemsetAsync(tileattn workspace)");
  return static_cast<float*>(ptr);
}

}  // namespace tileattn::cuda
