// Host cost of each CUDA call a decode call makes before and during its launches, on this
// machine's host: which of them a cache in the library could take off an eager call's latency
// (docs/cuda-decode.md, "The host side of a call").  Standalone: links only the runtime, as the
// library does, and finds the driver's cuTensorMapEncodeTiled the same way.
//
//   nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a bench/gpu/cuda_host_costs.cu -o cuda_host_costs
//   ./cuda_host_costs          (prints ns a call, best of 5 rounds)
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>

namespace {

__global__ void empty_kernel(int) {}

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}

// Best of 5 rounds of `calls` calls, in ns a call; `sync_every` > 0 drains the GPU's queue that
// often, outside the timed part's budget only in the sense that it is counted too (launches only).
double ns_per_call(const std::function<void()>& fn, int calls, int sync_every = 0) {
  double best = 1e30;
  for (int round = 0; round < 5; ++round) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) {
      fn();
      if (sync_every > 0 && (i + 1) % sync_every == 0) check(cudaDeviceSynchronize(), "sync");
    }
    const auto end = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::nano>(end - start).count() / calls);
  }
  return best;
}

}  // namespace

int main() {
  check(cudaFree(nullptr), "context");
  void* device_block = nullptr;
  check(cudaMalloc(&device_block, 64 << 20), "cudaMalloc");
  char* inside = static_cast<char*>(device_block) + (17 << 20);  // a pooled tensor's pointer
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");

  void* encode_fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  check(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &encode_fn, 12000, cudaEnableDefault, &found),
        "entry point");
  const auto encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(encode_fn);
  // The decode's K map of a 1 x 32k cache, 8 KV heads, d128, bf16.
  const cuuint64_t dims[4] = {128, 8, 32768, 1};
  const cuuint64_t strides[3] = {128 * 2, 8 * 128 * 2, 32768ull * 8 * 128 * 2};
  const cuuint32_t box[4] = {64, 1, 16, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  CUtensorMap map;

  int sink = 0;
  std::printf("ns a call (best of 5 rounds)\n");
  std::printf("%9.0f  getenv\n", ns_per_call([&] { sink += std::getenv("TILEATTN_DECODE_FAMILY") != nullptr; }, 100000));
  std::printf("%9.0f  cudaGetDevice\n", ns_per_call([&] { int d; check(cudaGetDevice(&d), "dev"); sink += d; }, 100000));
  std::printf("%9.0f  cudaDeviceGetAttribute\n", ns_per_call([&] {
                int v;
                check(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, 0), "attr");
                sink += v;
              }, 100000));
  std::printf("%9.0f  cudaPointerGetAttributes, allocation base\n", ns_per_call([&] {
                cudaPointerAttributes a;
                check(cudaPointerGetAttributes(&a, device_block), "ptr");
                sink += a.type;
              }, 100000));
  std::printf("%9.0f  cudaPointerGetAttributes, inside an allocation\n", ns_per_call([&] {
                cudaPointerAttributes a;
                check(cudaPointerGetAttributes(&a, inside), "ptr");
                sink += a.type;
              }, 100000));
  std::printf("%9.0f  cuTensorMapEncodeTiled\n", ns_per_call([&] {
                sink += encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, device_block, dims, strides, box,
                               element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
              }, 100000));
  std::printf("%9.0f  kernel<<<>>> launch (queue drained every 64)\n", ns_per_call([&] {
                empty_kernel<<<64, 128, 0, stream>>>(0);
              }, 4096, 64));
  // The launch as decode_launch.cuh's launch_programmatic makes it (repeated here: the probe links
  // only the runtime).
  std::printf("%9.0f  cudaLaunchKernelEx, programmatic serialization (drained every 64)\n", ns_per_call([&] {
                cudaLaunchConfig_t config{};
                config.gridDim = dim3(64);
                config.blockDim = dim3(128);
                config.stream = stream;
                cudaLaunchAttribute attribute{};
                attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
                attribute.val.programmaticStreamSerializationAllowed = 1;
                config.attrs = &attribute;
                config.numAttrs = 1;
                check(cudaLaunchKernelEx(&config, empty_kernel, 0), "launch ex");
              }, 4096, 64));
  std::printf("%9.0f  cudaDeviceSynchronize after one launch (launch + GPU round trip)\n", ns_per_call([&] {
                empty_kernel<<<64, 128, 0, stream>>>(0);
                check(cudaStreamSynchronize(stream), "sync");
              }, 2000));
  std::printf("(sink %d)\n", sink & 1);
  return 0;
}
