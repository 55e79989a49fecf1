// tileattn::cuda_backward: device checks, the float32 workspace, and the kernel sequence
// delta -> main (-> deterministic dQ) -> finish, all on the caller's stream.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "api/backends.h"
#include "cuda/backward/bwd_config.h"
#include "cuda/backward/bwd_kernels.cuh"
#include "cuda/backward/bwd_launch.h"
#include "cuda/check.h"
#include "cuda/device_checks.h"

namespace tileattn {
namespace cuda {
namespace {

// Stream-ordered float32 buffers (cudaMallocAsync): no device sync, and capturable in a graph.
class Workspace {
 public:
  explicit Workspace(cudaStream_t stream) : stream_(stream) {}
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace() {
    for (void* ptr : buffers_) cudaFreeAsync(ptr, stream_);
  }
  float* floats(int64_t count, bool zeroed) {
    void* ptr = nullptr;
    const size_t bytes = static_cast<size_t>(count > 0 ? count : 1) * sizeof(float);
    check_cuda(cudaMallocAsync(&ptr, bytes, stream_), "cudaMallocAsync(backward workspace)");
    buffers_[used_++] = ptr;
    if (zeroed) check_cuda(cudaMemsetAsync(ptr, 0, bytes, stream_), "cudaMemsetAsync");
    return static_cast<float*>(ptr);
  }

 private:
  cudaStream_t stream_;
  void* buffers_[4] = {nullptr, nullptr, nullptr, nullptr};
  int used_ = 0;
};

template <typename Element>
void run_backward(const bwd::BwdArgs& args, cudaStream_t stream) {
  bwd::run_bwd_delta<Element>(args, stream);
  switch (bwd::head_dim_bucket(args.p.fwd.head_dim)) {
    case 64: bwd::run_bwd_tiles<64, Element>(args, stream); break;
    case 128: bwd::run_bwd_tiles<128, Element>(args, stream); break;
    default: bwd::run_bwd_tiles<256, Element>(args, stream); break;
  }
  bwd::run_bwd_finish<Element>(args, stream);
}

// 16-byte loads need a 16-byte aligned base, strides of whole 16-byte vectors, whole vectors per row.
bool vectorizable(const void* ptr, int64_t batch_stride, int64_t row_stride, int64_t head_stride,
                  int head_dim, bool varlen) {
  constexpr int64_t kVector = 8;  // 16-bit elements per 16 bytes
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && head_dim % kVector == 0 &&
         row_stride % kVector == 0 && head_stride % kVector == 0 && (varlen || batch_stride % kVector == 0);
}

}  // namespace
}  // namespace cuda

void cuda_backward(const BackwardParams& p) {
  using namespace cuda;
  const ForwardParams& f = p.fwd;
  require_sm80();
  for (const auto& [ptr, name] : {std::pair<const void*, const char*>{f.q, "q"}, {f.k, "k"}, {f.v, "v"},
                                  {f.out, "out"}, {f.softmax_lse, "softmax_lse"}, {p.dout, "dout"},
                                  {p.dq, "dq"}, {p.dk, "dk"}, {p.dv, "dv"},
                                  {f.cu_seqlens_q, "cu_seqlens_q"}, {f.cu_seqlens_k, "cu_seqlens_k"},
                                  {f.seqused_k, "seqused_k"}, {f.alibi_slopes, "alibi_slopes"}}) {
    require_device_pointer(ptr, name);
  }
  require_grid_fits(f);
  if (f.batch == 0) return;
  cudaStream_t stream = static_cast<cudaStream_t>(f.stream);
  const bool varlen = f.cu_seqlens_q != nullptr;
  bwd::BwdArgs args{};
  args.p = p;
  args.q_rows = varlen ? f.total_q : static_cast<int64_t>(f.batch) * f.seqlen_q;
  args.k_rows = varlen ? f.total_k : static_cast<int64_t>(f.batch) * f.seqlen_k;
  args.deterministic = p.deterministic != 0;
  args.vector_q = vectorizable(f.q, f.q_batch_stride, f.q_row_stride, f.q_head_stride, f.head_dim, varlen);
  args.vector_k = vectorizable(f.k, f.k_batch_stride, f.k_row_stride, f.k_head_stride, f.head_dim, varlen);
  args.vector_v = vectorizable(f.v, f.v_batch_stride, f.v_row_stride, f.v_head_stride, f.head_dim, varlen);
  args.vector_dout = vectorizable(p.dout, p.dout_batch_stride, p.dout_row_stride, p.dout_head_stride,
                                  f.head_dim, varlen);
  Workspace workspace(stream);
  args.delta = workspace.floats(f.num_heads * args.q_rows, false);
  if (!args.deterministic) args.dq_accum = workspace.floats(f.num_heads * args.q_rows * f.head_dim, true);
  if (f.num_heads != f.num_heads_k) {
    args.dk_expanded = workspace.floats(f.num_heads * args.k_rows * f.head_dim, false);
    args.dv_expanded = workspace.floats(f.num_heads * args.k_rows * f.head_dim, false);
  }
  if (f.dtype == TILEATTN_FLOAT16) {
    run_backward<__half>(args, stream);
  } else {
    run_backward<__nv_bfloat16>(args, stream);
  }
}

}  // namespace tileattn
