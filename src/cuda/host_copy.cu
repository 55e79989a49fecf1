// The device-to-host copy behind TILEATTN_CHECK_CONTENTS=on (api/host_index_copy.h).
#include <cuda_runtime.h>

#include "api/backends.h"
#include "cuda/check.h"

namespace tileattn {

void cuda_copy_to_host(void* destination, const void* source, size_t bytes, void* stream) {
  const auto on = static_cast<cudaStream_t>(stream);
  // A synchronize inside a capture would invalidate the application's graph; refuse instead.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cuda::check_cuda(cudaStreamIsCapturing(on, &capture), "cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone) {
    throw Error(ErrorCode::kUnsupported, "TILEATTN_CHECK_CONTENTS",
                "TILEATTN_CHECK_CONTENTS=on reads each call's index arrays on the host, which waits for "
                "the stream; a stream being captured into a CUDA graph cannot wait (unset it to capture)");
  }
  // cudaMemcpyDefault: the pointer's own memory kind (UVA), so a host pointer passed as device
  // memory is copied too and then refused by the backend's pointer checks with its name.
  cuda::check_cuda(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDefault, on), "cudaMemcpyAsync");
  cuda::check_cuda(cudaStreamSynchronize(on), "cudaStreamSynchronize");
}

}  // namespace tileattn
