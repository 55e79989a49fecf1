// tileattn::cuda_backward: device checks, the float32 workspace, and the kernel sequence
// delta -> main -> finish, all on the caller's stream.  The main kernel is the FA2 register-level
// one (bwd_fa2_kernel.cuh) when every input has 16-byte aligned rows and its tiles fit the GPU's
// shared memory; otherwise the WMMA fallback (bwd_kernels.cuh), with its own deterministic dQ kernel.
// On compute capability 9.0 the FA2 kernel's tile products run on wgmma (src/cuda/sm90/
// bwd_products_sm90.cuh) when that bucket was built, unless TILEATTN_BACKWARD_FAMILY=sm80
// (cuda/kernel_family.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <optional>
#include <string>

#include "api/backends.h"
#include <cutlass/numeric_types.h>

#include "common/env_choice.h"
#include "cuda/backward/bwd_args.h"
#include "cuda/backward/bwd_config.h"
#include "cuda/backward/bwd_fa2_traits.h"
#include "cuda/backward/bwd_launch.h"
#include "cuda/check.h"
#include "cuda/device_checks.h"
#include "cuda/index_poison.h"
#include "cuda/kernel_family.h"
#include "cuda/stream_workspace.h"

namespace tileattn {
namespace cuda {
namespace {

struct Sm90BwdInstance {
  int head_dim;
  tileattn_dtype dtype;
  void (*run)(const bwd::BwdArgs&, cudaStream_t);
  int (*dq_pitch)(const bwd::BwdArgs&);  // floats per dQ workspace row the kernel `run` picks needs
};

// The wgmma buckets this build compiled (empty unless 90 is in TILEATTN_CUDA_ARCHS), after a
// sentinel entry that keeps the array non-empty.
constexpr Sm90BwdInstance kSm90Instances[] = {
    {0, TILEATTN_FLOAT16, nullptr, nullptr},
#include "sm90_bwd_instances.inc"
};

const Sm90BwdInstance* find_sm90_instance(int bucket, tileattn_dtype dtype) {
  for (const Sm90BwdInstance& inst : kSm90Instances) {
    if (inst.run != nullptr && inst.dtype == dtype && inst.head_dim == bucket) return &inst;
  }
  return nullptr;
}

// The FA2 instance for a head-dim bucket; Element is the CuTe type (cutlass::half_t / bfloat16_t).
template <typename Element>
void run_fa2_main(const bwd::BwdArgs& args, int bucket, cudaStream_t stream) {
  switch (bucket) {
    case 64: bwd::run_fa2_bwd<64, Element>(args, stream); break;
    case 128: bwd::run_fa2_bwd<128, Element>(args, stream); break;
    default: bwd::run_fa2_bwd<256, Element>(args, stream); break;
  }
}

template <typename Element>
void run_fallback_main(const bwd::BwdArgs& args, int bucket, cudaStream_t stream) {
  switch (bucket) {
    case 64: bwd::run_bwd_tiles<64, Element>(args, stream); break;
    case 128: bwd::run_bwd_tiles<128, Element>(args, stream); break;
    default: bwd::run_bwd_tiles<256, Element>(args, stream); break;
  }
}

// Element: __half / __nv_bfloat16 for the small kernels; CuteElement the same type for CuTe.
// sm90: the wgmma instance to run instead of the FA2 one, or nullptr.
template <typename Element, typename CuteElement>
void run_backward(const bwd::BwdArgs& args, bool fa2, const Sm90BwdInstance* sm90, cudaStream_t stream) {
  const int bucket = bwd::head_dim_bucket(args.p.fwd.head_dim);
  bwd::run_bwd_delta<Element>(args, stream);
  if (sm90 != nullptr) {
    sm90->run(args, stream);
  } else if (fa2) {
    run_fa2_main<CuteElement>(args, bucket, stream);
  } else {
    run_fallback_main<Element>(args, bucket, stream);
  }
  bwd::run_bwd_finish<Element>(args, stream);
}

// How the backward CTAs walk their query blocks (bwd_walk_order.h).  With atomic dQ rotated.
// Deterministic with a mask: up from the diagonal (deadlock-free at any length) when each key block
// starts lower than the one before it, i.e. the first key block alone sees the top query block:
// Sk - Sq + window_right < block_n (causal with Sq >= Sk; for varlen the maxima stand in).  Key
// blocks that share a start would queue there, each a step-late release behind the next, so other
// masks keep the plain order from the top.  Without a mask: rotated, with turns in arrival order,
// when the key blocks of one head need at most half the SMs: a CTA may then wait for a
// later-launched CTA of its head, which is safe only while all of them can be resident together,
// and the half leaves room for kernels running beside this one (e.g. collectives).  Longer
// unmasked sequences keep the plain order too, where a CTA waits only for earlier ones.
bwd::WalkOrder walk_order(const ForwardParams& f, bool deterministic) {
  using bwd::WalkOrder;
  if (!deterministic) return WalkOrder::kRotated;
  const int block_n = bwd::fa2_bwd_tile_config(bwd::head_dim_bucket(f.head_dim)).block_n;
  if (f.window_left >= 0 || f.window_right >= 0) {
    const bool staggered = f.window_right >= 0 && static_cast<int64_t>(f.seqlen_k) - f.seqlen_q + f.window_right < block_n;
    return staggered ? WalkOrder::kUpFromDiagonal : WalkOrder::kFromTop;
  }
  return (f.seqlen_k + block_n - 1) / block_n <= sm_count() / 2 ? WalkOrder::kRotated : WalkOrder::kFromTop;
}

bwd::BwdArgs::WarpSpecialized warp_specialized_choice() {
  using Mode = bwd::BwdArgs::WarpSpecialized;
  constexpr Mode kModes[] = {Mode::kAuto, Mode::kNever, Mode::kAlways};
  return kModes[env_choice("TILEATTN_BACKWARD_WS", {"auto", "0", "1"})];
}

// The scratch the kernel sequence needs, carved in order from one workspace, each part on a
// 256-byte boundary; with base == nullptr only counted.  The size query and the call carve with
// this one function, so they agree.  dq_pitch: floats per dQ accumulator row (dq_pitch_for).
// Returns the bytes used.
int64_t carve_scratch(bwd::BwdArgs& args, bool fa2, int dq_pitch, char* base) {
  const ForwardParams& f = args.p.fwd;
  int64_t used = 0;
  const auto take = [&](int64_t count, size_t element) {
    char* part = base == nullptr ? nullptr : base + used;
    used += (count * static_cast<int64_t>(element) + 255) / 256 * 256;
    return part;
  };
  args.delta = reinterpret_cast<float*>(take(f.num_heads * args.q_rows, sizeof(float)));
  args.dq_accum = nullptr;
  args.dq_turns = nullptr;
  args.dk_expanded = args.dv_expanded = nullptr;
  // dQ accumulates in float32 atomics, except on the fallback's deterministic path.
  if (fa2 || !args.deterministic) {
    args.dq_pitch = dq_pitch;
    args.dq_accum = reinterpret_cast<float*>(take(f.num_heads * args.q_rows * args.dq_pitch, sizeof(float)));
  }
  if (fa2 && args.deterministic) {
    // One counter per query block of whichever kernel runs (chosen later, per bucket): sized for
    // the smaller block, so each kernel indexes within its head's row of counters.
    const int fa2_block_m = bwd::fa2_bwd_tile_config(bwd::head_dim_bucket(f.head_dim)).block_m;
    const int block_m = std::min(fa2_block_m, bwd::kWsBlockM);
    args.dq_turn_blocks = (f.seqlen_q + block_m - 1) / block_m;
    args.dq_turns = reinterpret_cast<int*>(take(static_cast<int64_t>(f.batch) * f.num_heads * args.dq_turn_blocks, sizeof(int)));
  }
  if (f.num_heads != f.num_heads_k) {
    args.dk_expanded = reinterpret_cast<float*>(take(f.num_heads * args.k_rows * f.head_dim, sizeof(float)));
    args.dv_expanded = reinterpret_cast<float*>(take(f.num_heads * args.k_rows * f.head_dim, sizeof(float)));
  }
  return used;
}

// Floats per dQ accumulator row.  The FA2 kernel's rows are padded to the bucket: a compile-time
// pitch makes every atomic's address an immediate offset from one per-thread pointer (no address
// registers to spill).  The warp-specialized kernel's have its staging rows' pitch, so a query
// block's dQ is one bulk reduction; the size query, made before any kernel is chosen, allows for
// the most it pads by.
int dq_pitch_for(const bwd::BwdArgs& args, bool fa2, const Sm90BwdInstance* sm90, bool size_query) {
  if (!fa2) return args.p.fwd.head_dim;
  const int bucket = bwd::head_dim_bucket(args.p.fwd.head_dim);
  if (size_query) return bucket + bwd::kWsDqPadMax;
  return sm90 != nullptr ? sm90->dq_pitch(args) : bucket;
}

// Whether the FA2 kernels fit this GPU's shared memory for the head dim (the pointers decide the rest).
bool fa2_fits(const ForwardParams& f) {
  return bwd::fa2_bwd_smem_bytes(bwd::head_dim_bucket(f.head_dim)) <= smem_optin_bytes();
}

// The arguments the shapes decide.
bwd::BwdArgs shape_args(const BackwardParams& p) {
  const ForwardParams& f = p.fwd;
  const bool varlen = f.cu_seqlens_q != nullptr;
  bwd::BwdArgs args{};
  args.p = p;
  args.q_rows = varlen ? f.total_q : static_cast<int64_t>(f.batch) * f.seqlen_q;
  args.k_rows = varlen ? f.total_k : static_cast<int64_t>(f.batch) * f.seqlen_k;
  args.deterministic = p.deterministic != 0;
  return args;
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

int64_t cuda_backward_workspace_size(const BackwardParams& p) {
  using namespace cuda;
  require_sm80();
  require_grid_fits(p.fwd);
  if (p.fwd.batch == 0) return 0;
  bwd::BwdArgs args = shape_args(p);
  const int64_t fallback = carve_scratch(args, false, dq_pitch_for(args, false, nullptr, true), nullptr);
  if (!fa2_fits(p.fwd)) return fallback;
  return std::max(fallback, carve_scratch(args, true, dq_pitch_for(args, true, nullptr, true), nullptr));
}

void cuda_backward(const BackwardParams& p) {
  using namespace cuda;
  const ForwardParams& f = p.fwd;
  require_sm80();
  const bool sm90_allowed = sm90_family_allowed("TILEATTN_BACKWARD_FAMILY");  // first: a bad value always raises
  const bwd::BwdArgs::WarpSpecialized warp_specialized = warp_specialized_choice();
  for (const auto& [ptr, name] : {std::pair<const void*, const char*>{f.q, "q"}, {f.k, "k"}, {f.v, "v"},
                                  {f.out, "out"}, {f.softmax_lse, "softmax_lse"}, {p.dout, "dout"},
                                  {p.dq, "dq"}, {p.dk, "dk"}, {p.dv, "dv"},
                                  {f.cu_seqlens_q, "cu_seqlens_q"}, {f.cu_seqlens_k, "cu_seqlens_k"},
                                  {f.seqused_k, "seqused_k"}, {f.alibi_slopes, "alibi_slopes"},
                                  {p.workspace, "workspace"}}) {
    require_device_pointer(ptr, name);
  }
  require_grid_fits(f);
  if (f.batch == 0) return;
  cudaStream_t stream = static_cast<cudaStream_t>(f.stream);
  const bool varlen = f.cu_seqlens_q != nullptr;
  bwd::BwdArgs args = shape_args(p);
  args.warp_specialized = warp_specialized;
  args.vector_q = vectorizable(f.q, f.q_batch_stride, f.q_row_stride, f.q_head_stride, f.head_dim, varlen);
  args.vector_k = vectorizable(f.k, f.k_batch_stride, f.k_row_stride, f.k_head_stride, f.head_dim, varlen);
  args.vector_v = vectorizable(f.v, f.v_batch_stride, f.v_row_stride, f.v_head_stride, f.head_dim, varlen);
  args.vector_dout = vectorizable(p.dout, p.dout_batch_stride, p.dout_row_stride, p.dout_head_stride,
                                  f.head_dim, varlen);
  args.vector_out = vectorizable(f.out, f.out_batch_stride, f.out_row_stride, f.out_head_stride, f.head_dim, varlen);
  args.vector_dq = vectorizable(p.dq, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride, f.head_dim, varlen);
  args.vector_dk = vectorizable(p.dk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride, f.head_dim, varlen);
  args.vector_dv = vectorizable(p.dv, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride, f.head_dim, varlen);
  const bool fa2 = args.vector_q && args.vector_k && args.vector_v && args.vector_dout && fa2_fits(f);
  // The wgmma products read the same tiles as the FA2 kernel: same conditions, plus the GPU.
  const Sm90BwdInstance* sm90 =
      fa2 && sm90_allowed && is_sm90_device() ? find_sm90_instance(bwd::head_dim_bucket(f.head_dim), f.dtype)
                                              : nullptr;
  const int dq_pitch = dq_pitch_for(args, fa2, sm90, false);
  const int64_t needed = carve_scratch(args, fa2, dq_pitch, nullptr);
  std::optional<StreamWorkspace> pool;  // when the caller gave no workspace; freed on the stream after the kernels
  char* base = static_cast<char*>(p.workspace);
  if (base == nullptr) {
    base = reinterpret_cast<char*>(pool.emplace(stream).floats(needed / static_cast<int64_t>(sizeof(float)), false));
  } else if (p.workspace_bytes < needed) {
    throw Error(ErrorCode::kInvalidArgument, "workspace",
                "the backward needs " + std::to_string(needed) + " bytes of workspace, got " +
                    std::to_string(p.workspace_bytes) + " (tileattn_backward_workspace_size)");
  }
  carve_scratch(args, fa2, dq_pitch, base);
  if (args.dq_turns != nullptr) {
    const size_t turns = static_cast<size_t>(f.batch) * f.num_heads * args.dq_turn_blocks * sizeof(int);
    check_cuda(cudaMemsetAsync(args.dq_turns, 0, turns, stream), "cudaMemsetAsync(dQ turns)");
  }
  args.walk_order = walk_order(f, args.deterministic);
  if (f.dtype == TILEATTN_FLOAT16) {
    run_backward<__half, cutlass::half_t>(args, fa2, sm90, stream);
  } else {
    run_backward<__nv_bfloat16, cutlass::bfloat16_t>(args, fa2, sm90, stream);
  }
  poison_out_of_bounds_backward(p, stream);
}

}  // namespace tileattn
