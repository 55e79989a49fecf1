// The C++ entry points: validate, resolve defaults, then hand the params to the backend that owns
// the tensors' device.

#include <algorithm>
#include <cstdint>
#include <new>
#include <string>

#include "api/backends.h"
#include "api/host_index_copy.h"
#include "api/softmax_scale.h"
#include "api/validate.h"
#include "common/env_choice.h"

namespace tileattn {
namespace {

// Row i sees keys [i + Sk - Sq - window_left, i + Sk - Sq + window_right] (tileattn.h), so a left
// window of at least Sk - 1 and a right window of at least Sq - 1 cut off no key: clamping them to
// Sk and Sq changes no score, keeps them >= 0 (the call still counts as windowed, which decides
// the kvcache's rotary positions), and keeps the kernels' edge arithmetic (row + Sk - Sq + window,
// in 32 bits in places) from overflowing for windows near INT32_MAX.
ForwardParams resolve_defaults(ForwardParams p) {
  p.softmax_scale = resolved_softmax_scale(p);
  if (p.window_left > p.seqlen_k) p.window_left = p.seqlen_k;
  if (p.window_right > p.seqlen_q) p.window_right = p.seqlen_q;
  return p;
}

// A max_seqlen bound lowered to the packed rows it counts (at least 1, so a call without rows keeps
// a bound validation accepts); a bound already below them, or a negative row count, is kept for
// validation to refuse.
int lowered_to_rows(int bound, int64_t rows) {
  return rows < 0 ? bound : static_cast<int>(std::min<int64_t>(bound, std::max<int64_t>(rows, 1)));
}

// With packed query rows max_seqlen_q (fwd.seqlen_q) is only an upper bound, often the model's
// largest, while no sequence has more rows than the call's total_q: the bound is taken as
// min(max_seqlen_q, total_q) before validation (2^31 - 1 is then a valid bound) and before the
// backends size their work by it (CUDA's query slots a sequence; the CPU's packed block, which
// also sizes by the longest sequence it reads).  Validation still refuses a bound below a
// sequence's row count.
KvCacheParams with_packed_rows_bound(KvCacheParams p) {
  if (p.fwd.cu_seqlens_q != nullptr) p.fwd.seqlen_q = lowered_to_rows(p.fwd.seqlen_q, p.fwd.total_q);
  return p;
}

// The varlen form's max_seqlen_q / max_seqlen_k (seqlen_q / seqlen_k) are upper bounds as well: no
// sequence has more rows than q's total_q or more keys than k's total_k, so they are lowered to
// those before validation and before the backends size grids and workspaces by them.  Not when
// attn_probs is written: its (B, H, max_seqlen_q, max_seqlen_k) entries past a sequence's end are
// written as zeros up to the bounds the caller gave.
ForwardParams with_varlen_bounds(ForwardParams p) {
  if (p.cu_seqlens_q == nullptr || p.attn_probs != nullptr) return p;
  p.seqlen_q = lowered_to_rows(p.seqlen_q, p.total_q);
  p.seqlen_k = lowered_to_rows(p.seqlen_k, p.total_k);
  return p;
}

// The CPU backend's float32 copies and scratch grow with the call's sizes (the backward's dQ
// partials are chunks x heads x rows x head_dim floats); a valid call whose scratch the host cannot
// hold raises naming q and those sizes rather than std::bad_alloc's bare "out of host memory"
// (a C API fuzz's backward with 2^30 heads).
template <typename Run>
void on_host(const ForwardParams& f, const char* what, Run run) {
  try {
    run();
  } catch (const std::bad_alloc&) {
    throw Error(ErrorCode::kUnsupported, "q",
                std::string("q: the CPU ") + what + "'s float32 copies and scratch for batch " +
                    std::to_string(f.batch) + " x num_heads " + std::to_string(f.num_heads) + " x seqlen_q " +
                    std::to_string(f.seqlen_q) + " x head_dim " + std::to_string(f.head_dim) +
                    " do not fit in host memory");
  }
}

#ifdef TILEATTN_WITH_CUDA
// TILEATTN_CHECK_CONTENTS=on: a CUDA call copies its index arrays to the host (a stream sync per
// array, and no CUDA-graph capture) and raises for a bad entry as the CPU backend does, naming the
// argument, where otherwise the kernels would turn it into NaN outputs.  Read on every call, like
// the kernel choices, so a test or a debugging session can switch it between calls.
bool contents_checked_on_host() { return env_choice("TILEATTN_CHECK_CONTENTS", {"off", "on"}) == 1; }
#endif

[[noreturn]] void cuda_not_built() {
  throw Error(ErrorCode::kNotBuilt, "device",
              "this tileattn library was built without the CUDA backend (configure with "
              "-DTILEATTN_CUDA=ON on a machine with nvcc)");
}

}  // namespace

ForwardParams default_forward_params() {
  ForwardParams p;
  tileattn_fwd_params_init(&p);
  return p;
}

KvCacheParams default_kvcache_params() {
  KvCacheParams p;
  tileattn_kvcache_params_init(&p);
  return p;
}

BackwardParams default_backward_params() {
  BackwardParams p;
  tileattn_bwd_params_init(&p);
  return p;
}

void forward(const ForwardParams& params) {
  const ForwardParams bounded = with_varlen_bounds(params);
  validate_forward(bounded);
  const ForwardParams p = resolve_defaults(bounded);
  if (p.device == TILEATTN_DEVICE_CPU) {
    validate_sequence_lengths(p);
    on_host(p, "forward", [&] { cpu_forward(p); });
    return;
  }
#ifdef TILEATTN_WITH_CUDA
  if (contents_checked_on_host()) validate_sequence_lengths(HostIndexCopy(p, cuda_copy_to_host).forward_params());
  cuda_forward(p);
#else
  cuda_not_built();
#endif
}

void backward(const BackwardParams& params) {
  BackwardParams p = params;
  p.fwd.attn_probs = nullptr;  // the backward takes none
  p.fwd = with_varlen_bounds(p.fwd);
  validate_backward(p);
  p.fwd = resolve_defaults(p.fwd);
  if (p.fwd.device == TILEATTN_DEVICE_CPU) {
    validate_sequence_lengths(p.fwd);
    on_host(p.fwd, "backward", [&] { cpu_backward(p); });
    return;
  }
#ifdef TILEATTN_WITH_CUDA
  if (contents_checked_on_host()) {
    validate_sequence_lengths(HostIndexCopy(p.fwd, cuda_copy_to_host).forward_params());
  }
  cuda_backward(p);
#else
  cuda_not_built();
#endif
}

void forward_kvcache(const KvCacheParams& params) {
  KvCacheParams p = with_packed_rows_bound(params);
  validate_kvcache(p);
  p.fwd = resolve_defaults(p.fwd);
  if (p.fwd.device == TILEATTN_DEVICE_CPU) {
    // The CPU backend reads cache_seqlens: derived from cu_seqlens_k or the uniform length.
    const std::vector<int32_t> lengths = cache_lengths_array(p);
    if (p.cache_seqlens == nullptr) p = with_cache_lengths(p, lengths);
    validate_kvcache_contents(p);
    on_host(p.fwd, "decode", [&] { cpu_forward_kvcache(p); });
    return;
  }
  // On CUDA the index arrays (cache_seqlens, cache_batch_idx, cache_leftpad, block_table) stay
  // unread on the host: reading them would sync and break CUDA-graph capture.  The kernels check
  // them instead, and a sequence that breaks a rule of validate_kvcache_contents is not appended
  // and gets NaN outputs; an out-of-range page index reads as NaN (never out of bounds).  Unless
  // TILEATTN_CHECK_CONTENTS=on, which also brings the CPU's check that no append writes a slot
  // another sequence of the call uses.
#ifdef TILEATTN_WITH_CUDA
  if (contents_checked_on_host()) validate_kvcache_contents(HostIndexCopy(p, cuda_copy_to_host).kvcache_params());
  cuda_forward_kvcache(p);
#else
  cuda_not_built();
#endif
}

int64_t backward_workspace_size(const BackwardParams& params) {
  BackwardParams p = params;  // sized for the params backward() runs with
  p.fwd.attn_probs = nullptr;
  p.fwd = with_varlen_bounds(p.fwd);
  validate_backward(p);
  if (p.fwd.device == TILEATTN_DEVICE_CPU) return 0;
#ifdef TILEATTN_WITH_CUDA
  p.fwd = resolve_defaults(p.fwd);
  return cuda_backward_workspace_size(p);
#else
  cuda_not_built();
#endif
}

int64_t kvcache_workspace_size(const KvCacheParams& params) {
  KvCacheParams p = with_packed_rows_bound(params);  // sized for the params forward_kvcache() runs with
  validate_kvcache(p);
  if (p.fwd.device == TILEATTN_DEVICE_CPU) return 0;
#ifdef TILEATTN_WITH_CUDA
  p.fwd = resolve_defaults(p.fwd);
  return cuda_kvcache_workspace_size(p);
#else
  cuda_not_built();
#endif
}

}  // namespace tileattn
