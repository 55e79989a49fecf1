#include "api/validate.h"

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <utility>

#include "api/append_slots.h"
#include "api/memory_overlap.h"
#include "api/softmax_scale.h"
#include "common/kvcache.h"

namespace tileattn {
namespace {

template <typename... Parts>
[[noreturn]] void fail(ErrorCode code, const std::string& argument, const Parts&... parts) {
  std::ostringstream message;
  (message << ... << parts);
  throw Error(code, argument, message.str());
}

template <typename... Parts>
[[noreturn]] void invalid(const std::string& argument, const Parts&... parts) {
  fail(ErrorCode::kInvalidArgument, argument, parts...);
}

bool is_varlen(const ForwardParams& p) { return p.cu_seqlens_q != nullptr; }

const char* dtype_name(tileattn_dtype dtype) {
  switch (dtype) {
    case TILEATTN_FLOAT16: return "float16";
    case TILEATTN_BFLOAT16: return "bfloat16";
    case TILEATTN_FLOAT32: return "float32";
  }
  return "unknown";
}

int element_bytes(tileattn_dtype dtype) { return dtype == TILEATTN_FLOAT32 ? 4 : 2; }

// A (batches, rows, heads, head_dim) tensor of the call's dtype; batches < 0: no batch dim (varlen).
MemoryView rows_view(const ForwardParams& p, const char* name, const void* ptr, int64_t batches,
                     int64_t batch_stride, int64_t rows, int64_t row_stride, int heads, int64_t head_stride) {
  const int bytes = element_bytes(p.dtype);
  MemoryView view(name, ptr, p.head_dim * bytes);
  view.dim(rows, row_stride, bytes).dim(heads, head_stride, bytes);
  if (batches >= 0) view.dim(batches, batch_stride, bytes);
  return view;
}

// A q-, k- or v-shaped tensor, in batch or varlen form.
MemoryView qkv_view(const ForwardParams& p, const char* name, const void* ptr, int64_t batch_stride,
                    int64_t row_stride, int64_t head_stride, int64_t rows_per_batch,
                    int64_t total_rows, int heads) {
  return is_varlen(p) ? rows_view(p, name, ptr, -1, 0, total_rows, row_stride, heads, head_stride)
                      : rows_view(p, name, ptr, p.batch, batch_stride, rows_per_batch, row_stride, heads, head_stride);
}

// softmax_lse: float32 (B, H, Sq), or (H, total_q) in varlen form; its rows are contiguous.
MemoryView lse_view(const ForwardParams& p) {
  MemoryView view("softmax_lse", p.softmax_lse, (is_varlen(p) ? p.total_q : p.seqlen_q) * 4);
  view.dim(p.num_heads, p.lse_head_stride, 4);
  if (!is_varlen(p)) view.dim(p.batch, p.lse_batch_stride, 4);
  return view;
}

// alibi_slopes: float32 (H), or (B, H) with a batch stride.
MemoryView alibi_view(const ForwardParams& p) {
  MemoryView slopes("alibi_slopes", p.alibi_slopes, int64_t{p.num_heads} * 4);
  if (p.alibi_batch_stride != 0) slopes.dim(p.batch, p.alibi_batch_stride, 4);
  return slopes;
}

MemoryView probs_view(const ForwardParams& p) {
  return MemoryView("attn_probs", p.attn_probs, int64_t{p.seqlen_k} * 4)
      .dim(p.seqlen_q, p.probs_row_stride, 4)
      .dim(p.num_heads, p.probs_head_stride, 4)
      .dim(p.batch, p.probs_batch_stride, 4);
}

// Element loads and stores through a misaligned pointer are undefined in C++ (UBSan flagged the CPU
// backend's float loads of an lse, alibi_slopes or out moved by 1-2 bytes through the C API).
void require_aligned(const char* name, uintptr_t address, int element) {
  if (address % element != 0) invalid(name, name, "'s address is not a multiple of its ", element, "-byte element size");
}

// A tensor argument's own rules: a pointer, aligned to its elements, when it has elements, no
// negative stride, and, for a tensor the call writes, no two indices on one element (or the result
// depends on the order of the writes): sorted by stride, each dim must step past everything the
// dims inside it span.
// Messages count elements of `element` bytes.
void check_view(const MemoryView& v, int element, bool written) {
  if (!v.addressable()) {
    invalid(v.name, v.name, "'s sizes and strides span more than 2^62 bytes (or a stride's byte count overflows int64)");
  }
  bool has_elements = v.inner_bytes >= element;
  for (int d = 0; d < v.num_dims; ++d) {
    has_elements = has_elements && v.dims[d].size > 0;
    if (v.dims[d].stride < 0) invalid(v.name, v.name, " has a negative stride (", v.dims[d].stride / element, ")");
  }
  if (v.base == 0 && has_elements) invalid(v.name, v.name, " is a null pointer");
  if (has_elements) require_aligned(v.name, v.base, element);
  if (!written || !has_elements) return;  // no element, no two indices on one
  ByteDim sorted[MemoryView::kMaxDims];
  int n = 0;
  for (int d = 0; d < v.num_dims; ++d) {
    if (v.dims[d].size > 1) sorted[n++] = v.dims[d];
  }
  for (int i = 1; i < n; ++i) {  // by stride; std::sort trips GCC 12's -Warray-bounds here
    for (int j = i; j > 0 && sorted[j - 1].stride > sorted[j].stride; --j) std::swap(sorted[j - 1], sorted[j]);
  }
  int64_t span = v.inner_bytes;  // bytes covered by the dims checked so far
  for (int i = 0; i < n; ++i) {
    if (sorted[i].stride < span) {
      invalid(v.name, v.name, " has overlapping elements: a stride of ", sorted[i].stride / element,
              " is smaller than the ", span / element, " elements the inner dims span");
    }
    span += sorted[i].stride * (sorted[i].size - 1);
  }
}

// The arguments a call reads and writes, as memory views.  A written view may share no byte with
// any other: the kernels read and write in no fixed order, so a call whose out lies inside q, or
// whose append writes k_cache over v_cache, would return whatever order the threads ran in.
class ArgumentViews {
 public:
  void read(const MemoryView& v) { add(v, false); }
  void written(const MemoryView& v) { add(v, true); }
  void read_or_written(const MemoryView& v, bool written) { add(v, written); }

  void check_disjoint() const {
    for (int w = 0; w < num_; ++w) {
      if (!written_[w]) continue;
      for (int o = 0; o < num_; ++o) {
        if (o == w || (written_[o] && o < w) || !views_share_bytes(views_[w], views_[o])) continue;
        const char* name = views_[w].name;
        const char* other = views_[o].name;
        if (written_[o]) {
          invalid(name, name, " and ", other, " share memory, and this call writes both: the result "
                  "would depend on the order of the writes");
        }
        invalid(name, name, " shares memory with ", other, ", which this call reads while it writes ",
                name, ": the result would depend on the order of the reads and writes");
      }
    }
  }

 private:
  static constexpr int kMaxViews = 20;

  void add(const MemoryView& v, bool written) {
    if (v.empty()) return;
    views_[num_] = v;
    written_[num_++] = written;
  }

  MemoryView views_[kMaxViews];
  bool written_[kMaxViews];  // views_ and written_ hold num_ entries
  int num_ = 0;
};

MemoryView int32_view(const char* name, const int32_t* ptr, int64_t count) {
  require_aligned(name, reinterpret_cast<uintptr_t>(ptr), 4);
  return MemoryView(name, ptr, count * 4);
}

// The forward's tensor arguments, described once for their own rules and for the overlaps.
struct ForwardViews {
  MemoryView q, k, v, out, lse, probs;
};

// The forward's arguments; out, softmax_lse and attn_probs are outputs of a forward and inputs of
// a backward.
void add_forward_views(const ForwardParams& p, const ForwardViews& t, bool outputs_written,
                       ArgumentViews& views) {
  views.read(t.q);
  views.read(t.k);
  views.read(t.v);
  views.read_or_written(t.out, outputs_written);
  views.read_or_written(t.lse, outputs_written);
  if (outputs_written) views.written(t.probs);
  views.read(alibi_view(p));
  views.read(int32_view("cu_seqlens_q", p.cu_seqlens_q, int64_t{p.batch} + 1));
  views.read(int32_view("cu_seqlens_k", p.cu_seqlens_k, int64_t{p.batch} + 1));
  views.read(int32_view("seqused_k", p.seqused_k, p.batch));
}

// The longest sequence: tile loops step by up to 256 rows in int32 (a length within 256 of 2^31
// would wrap them).
constexpr int kMaxSeqlen = std::numeric_limits<int32_t>::max() - 256;

void check_sizes(const ForwardParams& p) {
  if (p.batch < 0) invalid("batch", "batch is ", p.batch, "; it must be >= 0");
  if (p.seqlen_q < 0 || p.seqlen_q > kMaxSeqlen) {
    invalid("seqlen_q", "seqlen_q is ", p.seqlen_q, "; it must be in [0, 2^31 - 257]");
  }
  if (p.seqlen_k < 0 || p.seqlen_k > kMaxSeqlen) {
    invalid("seqlen_k", "seqlen_k is ", p.seqlen_k, "; it must be in [0, 2^31 - 257]");
  }
  if (p.num_heads < 1) invalid("q", "q has ", p.num_heads, " heads; it needs at least 1");
  if (p.num_heads_k < 1) invalid("k", "k has ", p.num_heads_k, " heads; it needs at least 1");
  if (p.num_heads % p.num_heads_k != 0) {
    invalid("k", "k has ", p.num_heads_k, " heads, which does not divide the ", p.num_heads,
            " heads of q");
  }
  if (p.head_dim < 1 || p.head_dim > 256) {
    invalid("q", "q has head dim ", p.head_dim, "; tileattn supports 1 to 256");
  }
}

// An enum field as the int a caller stored.  A C caller (ctypes included) may store any int there,
// and in C++ loading a value outside the enumerators' range as the enum type is undefined
// (UBSan: "load of value 7, which is not a valid value for type 'tileattn_dtype'"), so the codes
// are read as ints until they have been checked.
template <typename Enum>
int32_t stored_code(const Enum& field) {
  static_assert(sizeof(Enum) == sizeof(int32_t), "the C ABI's enums are int-sized");
  int32_t code;
  std::memcpy(&code, &field, sizeof code);
  return code;
}

void check_dtype_and_device(const ForwardParams& p) {
  const int32_t device = stored_code(p.device), dtype = stored_code(p.dtype);
  if (device != TILEATTN_DEVICE_CPU && device != TILEATTN_DEVICE_CUDA) {
    invalid("device", "device ", device, " is neither CPU (0) nor CUDA (1)");
  }
  if (dtype != TILEATTN_FLOAT16 && dtype != TILEATTN_BFLOAT16 && dtype != TILEATTN_FLOAT32) {
    fail(ErrorCode::kDtype, "q", "q has dtype code ", dtype, ", which is none of float16, bfloat16, float32");
  }
  if (p.device == TILEATTN_DEVICE_CUDA && p.dtype == TILEATTN_FLOAT32) {
    fail(ErrorCode::kDtype, "q", "q has dtype ", dtype_name(p.dtype),
         "; the CUDA backend supports float16 and bfloat16");
  }
  if (p.num_threads < 0) invalid("num_threads", "num_threads is ", p.num_threads, "; it must be >= 0");
}

void check_options(const ForwardParams& p) {
  if (!std::isfinite(p.softmax_scale)) {
    invalid("softmax_scale", "softmax_scale is ", p.softmax_scale, "; it must be finite");
  }
  if (p.window_left < -1) {
    invalid("window_left", "window_left is ", p.window_left, "; it must be >= 0, or -1 for no limit");
  }
  if (p.window_right < -1) {
    invalid("window_right", "window_right is ", p.window_right,
            "; it must be >= 0, or -1 for no limit");
  }
  if (!(p.softcap >= 0.0f) || !std::isfinite(p.softcap)) {
    invalid("softcap", "softcap is ", p.softcap, "; it must be finite and >= 0 (0 = off)");
  }
  // The kernels multiply scores by softmax_scale / softcap and flush subnormal floats to 0, so a
  // positive softcap must be a normal float and leave that quotient finite (softcap 1e-40 would
  // be inf on the CPU and off on the GPU).
  if (p.softcap > 0.0f) {
    constexpr float kLog2e = 1.4426950408889634f;  // the kernels' softcap is held as softcap x log2(e)
    const float scale = resolved_softmax_scale(p);  // head_dim >= 1: check_sizes ran first
    if (p.softcap < std::numeric_limits<float>::min() || !std::isfinite(scale / p.softcap) ||
        !std::isfinite(p.softcap * kLog2e)) {
      invalid("softcap", "softcap is ", p.softcap, "; with softmax_scale ", scale,
              " it must be a normal float that leaves softmax_scale / softcap and softcap x log2(e) finite");
    }
  }
  if (!(p.dropout_p >= 0.0f && p.dropout_p < 1.0f)) {
    invalid("dropout_p", "dropout_p is ", p.dropout_p, "; it must be in [0, 1)");
  }
  if (p.alibi_slopes != nullptr && p.alibi_batch_stride != 0 && p.alibi_batch_stride < p.num_heads) {
    invalid("alibi_slopes", "alibi_slopes has a batch stride of ", p.alibi_batch_stride,
            ", less than its ", p.num_heads, " heads; use shape (H) with stride 0 or (B, H)");
  }
  if (p.alibi_slopes != nullptr) check_view(alibi_view(p), 4, false);  // a span past 2^62 bytes
}

void check_varlen_struct(const ForwardParams& p) {
  if ((p.cu_seqlens_q == nullptr) != (p.cu_seqlens_k == nullptr)) {
    invalid(p.cu_seqlens_q == nullptr ? "cu_seqlens_q" : "cu_seqlens_k",
            "cu_seqlens_q and cu_seqlens_k must be given together (varlen form) or both omitted");
  }
  if (!is_varlen(p)) return;
  if (p.total_q < 0) invalid("q", "q has ", p.total_q, " packed rows; it must be >= 0");
  if (p.total_k < 0) invalid("k", "k has ", p.total_k, " packed rows; it must be >= 0");
}

// Every rule of validate_forward but the memory overlaps, which depend on what the call writes.
// out and softmax_lse are written by a forward and only read by a backward, which may then take
// them with overlapping elements (an expanded view).
ForwardViews check_forward_struct(const ForwardParams& p, bool outputs_written) {
  check_dtype_and_device(p);
  check_sizes(p);
  check_varlen_struct(p);
  check_options(p);
  ForwardViews t;
  t.q = qkv_view(p, "q", p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride, p.seqlen_q, p.total_q,
                 p.num_heads);
  t.k = qkv_view(p, "k", p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride, p.seqlen_k, p.total_k,
                 p.num_heads_k);
  t.v = qkv_view(p, "v", p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride, p.seqlen_k, p.total_k,
                 p.num_heads_k);
  t.out = qkv_view(p, "out", p.out, p.out_batch_stride, p.out_row_stride, p.out_head_stride, p.seqlen_q,
                   p.total_q, p.num_heads);
  t.lse = lse_view(p);
  const int bytes = element_bytes(p.dtype);
  check_view(t.q, bytes, false);
  check_view(t.k, bytes, false);
  check_view(t.v, bytes, false);
  check_view(t.out, bytes, outputs_written);
  check_view(t.lse, 4, outputs_written);
  if (p.attn_probs != nullptr) {
    t.probs = probs_view(p);
    check_view(t.probs, 4, true);
  }
  return t;
}

}  // namespace

void validate_forward(const ForwardParams& p) {
  const ForwardViews tensors = check_forward_struct(p, /*outputs_written=*/true);
  ArgumentViews views;
  add_forward_views(p, tensors, /*outputs_written=*/true, views);
  views.check_disjoint();
}

namespace {

void check_workspace(const void* workspace, int64_t bytes) {
  if (bytes < 0) invalid("workspace", "workspace_bytes is ", bytes, "; it must be >= 0");
  if (workspace != nullptr && reinterpret_cast<uintptr_t>(workspace) % 256 != 0) {
    invalid("workspace", "the workspace must be 256-byte aligned");
  }
}

}  // namespace

void validate_backward(const BackwardParams& p) {
  check_workspace(p.workspace, p.workspace_bytes);
  // The forward's arguments, read again: out and softmax_lse are inputs here.
  ForwardParams f = p.fwd;
  f.attn_probs = nullptr;
  const ForwardViews tensors = check_forward_struct(f, /*outputs_written=*/false);
  const int bytes = element_bytes(f.dtype);
  const MemoryView dout = qkv_view(f, "dout", p.dout, p.dout_batch_stride, p.dout_row_stride,
                                   p.dout_head_stride, f.seqlen_q, f.total_q, f.num_heads);
  const MemoryView dq = qkv_view(f, "dq", p.dq, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride,
                                 f.seqlen_q, f.total_q, f.num_heads);
  const MemoryView dk = qkv_view(f, "dk", p.dk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride,
                                 f.seqlen_k, f.total_k, f.num_heads_k);
  const MemoryView dv = qkv_view(f, "dv", p.dv, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride,
                                 f.seqlen_k, f.total_k, f.num_heads_k);
  check_view(dout, bytes, false);
  check_view(dq, bytes, true);
  check_view(dk, bytes, true);
  check_view(dv, bytes, true);
  ArgumentViews views;
  add_forward_views(f, tensors, /*outputs_written=*/false, views);
  views.read(dout);
  views.written(dq);
  views.written(dk);
  views.written(dv);
  views.written(MemoryView("workspace", p.workspace, p.workspace_bytes));
  views.check_disjoint();
}

namespace {

// The cache-side tensors of a decode call: the caches (entries or pages, rows, Hk, D) and the new
// tokens (empty views without an append).
struct KvCacheViews {
  MemoryView k_cache, v_cache, k_new, v_new;
};

// block_table: int32 (num_cache_entries, max_blocks) with a row stride.
MemoryView block_table_view(const KvCacheParams& p) {
  return MemoryView("block_table", p.block_table, int64_t{p.max_blocks} * 4)
      .dim(p.num_cache_entries, p.block_table_batch_stride, 4);
}

// q_side: the forward's struct with no keys (out, lse, q, ALiBi) and its views.  The caches are
// written only by an append: without one, k_cache may be v_cache.
void check_kvcache_overlaps(const KvCacheParams& p, const ForwardParams& q_side,
                            const ForwardViews& q_tensors, const KvCacheViews& t) {
  const ForwardParams& f = p.fwd;
  const bool appends = p.k_new != nullptr;
  const int bytes = element_bytes(f.dtype);
  ArgumentViews views;
  add_forward_views(q_side, q_tensors, /*outputs_written=*/true, views);
  views.read_or_written(t.k_cache, appends);
  views.read_or_written(t.v_cache, appends);
  views.read(t.k_new);
  views.read(t.v_new);
  views.read(int32_view("cache_seqlens", p.cache_seqlens, f.batch));
  views.read(int32_view("cu_seqlens_k", f.cu_seqlens_k, int64_t{f.batch} + 1));
  views.read(int32_view("seqused_k", f.seqused_k, f.batch));
  views.read(int32_view("cache_batch_idx", p.cache_batch_idx, f.batch));
  views.read(int32_view("cache_leftpad", p.cache_leftpad, f.batch));
  if (p.block_table != nullptr) views.read(block_table_view(p));
  if (p.rotary_cos != nullptr) {
    const int64_t table_bytes = int64_t{p.rotary_seqlen} * (p.rotary_dim / 2) * bytes;
    require_aligned("rotary_cos", reinterpret_cast<uintptr_t>(p.rotary_cos), bytes);
    require_aligned("rotary_sin", reinterpret_cast<uintptr_t>(p.rotary_sin), bytes);
    views.read(MemoryView("rotary_cos", p.rotary_cos, table_bytes));
    views.read(MemoryView("rotary_sin", p.rotary_sin, table_bytes));
  }
  views.written(MemoryView("workspace", p.workspace, p.workspace_bytes));
  views.check_disjoint();
}

// Sequence b's cache length against the cache's capacity with the new tokens and against the
// rotary table: cache_seqlens[b] (validate_kvcache_contents), or the uniform length, checked as
// sequence 0's since every sequence has it (validate_kvcache).  Returns the cache's end after the
// append: the slots the sequence uses are [cache_leftpad[b], end).
int64_t check_cache_length(const KvCacheParams& p, int b, int64_t seqlen) {
  const int64_t end = seqlen + (p.k_new ? p.seqlen_new : 0);
  if (seqlen < 0) invalid("cache_seqlens", "cache_seqlens[", b, "] is ", seqlen, "; it must be >= 0");
  if (end > p.fwd.seqlen_k) {
    invalid("cache_seqlens", "sequence ", b, " needs ", end, " cache slots (cache_seqlens[", b, "] = ",
            seqlen, " plus the new tokens); the cache holds ", p.fwd.seqlen_k);
  }
  const int64_t last_rotary = seqlen + rotary_positions_past_cache(p) - 1;
  if (p.rotary_cos != nullptr && last_rotary >= p.rotary_seqlen) {
    invalid("rotary_cos", "sequence ", b, " needs rotary position ", last_rotary, "; rotary_cos has ",
            p.rotary_seqlen, " positions");
  }
  return end;
}

}  // namespace

void validate_kvcache(const KvCacheParams& p) {
  const ForwardParams& f = p.fwd;
  const bool packed_q = f.cu_seqlens_q != nullptr;
  const bool varlen_keys = f.cu_seqlens_k != nullptr;  // key counts from cu_seqlens_k (tileattn.h)
  if (varlen_keys && p.cache_seqlens) invalid("cu_seqlens_k", "give cache_seqlens or cu_seqlens_k, not both");
  if (p.uniform_cache_seqlen && (p.cache_seqlens || varlen_keys)) {
    invalid("cache_seqlens", "a uniform cache_seqlen is given with ",
            p.cache_seqlens ? "a cache_seqlens array" : "cu_seqlens_k", "; give one of them");
  }
  if (varlen_keys && !packed_q) {
    invalid("cu_seqlens_k", "cache lengths from cu_seqlens_k need packed query rows (cu_seqlens_q)");
  }
  if (f.seqused_k && !varlen_keys) invalid("seqused_k", "seqused_k needs cu_seqlens_k; otherwise use cache_seqlens");
  if (varlen_keys && (p.max_seqlen_k < 0 || p.max_seqlen_k > f.seqlen_k)) {
    invalid("max_seqlen_k", "max_seqlen_k is ", p.max_seqlen_k, "; it must lie in [0, ", f.seqlen_k,
            "], the cache's capacity");
  }
  // Key counts from cu_seqlens_k come with packed query rows (above), so these two cover them too.
  if (packed_q && p.k_new) invalid("k", "new tokens cannot be appended to a call with packed query rows (cu_seqlens_q)");
  if (packed_q && p.rotary_cos) invalid("rotary_cos", "rotary is not applied to packed query rows (cu_seqlens_q)");
  if (f.dropout_p != 0.0f) invalid("dropout_p", "flash_attn_with_kvcache has no dropout");
  if (f.attn_probs) invalid("attn_probs", "flash_attn_with_kvcache returns no attention probabilities");
  if (p.cache_seqlens == nullptr && !varlen_keys && !p.uniform_cache_seqlen && f.batch > 0) {
    invalid("cache_seqlens", "cache_seqlens is required");
  }
  const bool paged = p.block_table != nullptr;
  if (p.num_cache_entries < 1) {
    invalid(paged ? "block_table" : "k_cache", paged ? "block_table has " : "k_cache has ",
            p.num_cache_entries, " rows; it needs at least 1");
  }
  // A sequence's capacity, Smax or max_blocks x page_size (q_side, below, hides it from check_sizes).
  if (f.seqlen_k < 0 || f.seqlen_k > kMaxSeqlen) {
    invalid(paged ? "block_table" : "k_cache", "the cache holds ", f.seqlen_k,
            " positions a sequence (seqlen_k); it must be in [0, 2^31 - 257]");
  }
  int64_t cache_batches = p.num_cache_entries, cache_rows = f.seqlen_k;
  if (paged) {
    if (p.page_size < 16 || p.page_size % 16 != 0) {
      invalid("block_table", "the page size is ", p.page_size, "; it must be a positive multiple of 16");
    }
    if (p.max_blocks < 1 || p.num_blocks < 1) {
      invalid("block_table", "block_table has ", p.max_blocks, " columns over ", p.num_blocks,
              " pages; both must be >= 1");
    }
    if (static_cast<int64_t>(p.max_blocks) * p.page_size != f.seqlen_k) {
      invalid("block_table", "seqlen_k (", f.seqlen_k, ") must be max_blocks x page_size (",
              p.max_blocks, " x ", p.page_size, ")");
    }
    // Rows may share entries (a stride of 0: every sequence reads the same pages, as an expanded
    // tensor gives); the table is only read.
    if (p.block_table_batch_stride < 0) {
      invalid("block_table", "block_table has a negative row stride (", p.block_table_batch_stride, ")");
    }
    check_view(block_table_view(p), 4, false);  // a span past 2^62 bytes
    cache_batches = p.num_blocks;
    cache_rows = p.page_size;
  }
  // q, out, lse and the options are checked as a batch-form forward whose k/v are the caches'
  // first entry; the caches themselves below, as the (entries, rows, Hk, D) tensors they are.
  ForwardParams q_side = f;
  q_side.seqlen_k = 0;
  q_side.cu_seqlens_k = q_side.seqused_k = nullptr;  // key lengths, checked with the cache below
  if (packed_q) {  // q, out and lse as the varlen form's; no key rows
    q_side.cu_seqlens_k = f.cu_seqlens_q;
    q_side.total_k = 0;
  }
  const ForwardViews q_tensors = check_forward_struct(q_side, /*outputs_written=*/true);
  const bool appends = p.k_new != nullptr;
  const int bytes = element_bytes(f.dtype);
  KvCacheViews t;
  t.k_cache = rows_view(f, "k_cache", f.k, cache_batches, f.k_batch_stride, cache_rows, f.k_row_stride,
                        f.num_heads_k, f.k_head_stride);
  t.v_cache = rows_view(f, "v_cache", f.v, cache_batches, f.v_batch_stride, cache_rows, f.v_row_stride,
                        f.num_heads_k, f.v_head_stride);
  check_view(t.k_cache, bytes, appends);
  check_view(t.v_cache, bytes, appends);
  if ((p.k_new == nullptr) != (p.v_new == nullptr)) {
    invalid(p.k_new ? "v" : "k", "k and v (the new tokens) must be given together");
  }
  if (appends) {
    if (p.seqlen_new < 1) invalid("k", "k has ", p.seqlen_new, " new tokens; it needs at least 1");
    t.k_new = rows_view(f, "k", p.k_new, f.batch, p.k_new_batch_stride, p.seqlen_new, p.k_new_row_stride,
                        f.num_heads_k, p.k_new_head_stride);
    t.v_new = rows_view(f, "v", p.v_new, f.batch, p.v_new_batch_stride, p.seqlen_new, p.v_new_row_stride,
                        f.num_heads_k, p.v_new_head_stride);
    check_view(t.k_new, bytes, false);
    check_view(t.v_new, bytes, false);
  }
  if ((p.rotary_cos == nullptr) != (p.rotary_sin == nullptr)) {
    invalid(p.rotary_cos ? "rotary_sin" : "rotary_cos", "rotary_cos and rotary_sin must be given together");
  }
  if (p.rotary_cos != nullptr) {
    if (p.rotary_dim < 2 || p.rotary_dim % 2 != 0 || p.rotary_dim > f.head_dim) {
      invalid("rotary_cos", "rotary_cos covers a rotary dim of ", p.rotary_dim,
              "; it must be even and between 2 and the head dim ", f.head_dim);
    }
    if (p.rotary_seqlen < 1) {
      invalid("rotary_cos", "rotary_cos has ", p.rotary_seqlen, " positions; it needs at least 1");
    }
  }
  if (p.num_splits < 0) invalid("num_splits", "num_splits is ", p.num_splits, "; it must be >= 0");
  // A uniform length is on the host: its range is checked here, on every backend, where an
  // array's entries are checked by the kernels (or validate_kvcache_contents).
  if (p.uniform_cache_seqlen && f.batch > 0) check_cache_length(p, 0, p.cache_seqlen);
  check_workspace(p.workspace, p.workspace_bytes);
  check_kvcache_overlaps(p, q_side, q_tensors, t);
}

namespace {

// The rules of one cu_seqlens array: entries from >= 0, monotone, no sequence longer than
// max_len, the last entry inside the total packed rows.
void check_cu_seqlens(const char* name, const int32_t* cu, int batch, int64_t total, int max_len,
                      const char* max_name) {
  if (cu[0] < 0) invalid(name, name, "[0] is ", cu[0], "; it must be >= 0");
  for (int b = 0; b < batch; ++b) {
    const int64_t len = static_cast<int64_t>(cu[b + 1]) - cu[b];
    if (len < 0) {
      invalid(name, name, " is not monotone: entry ", b + 1, " (", cu[b + 1], ") is below entry ", b, " (",
              cu[b], ")");
    }
    if (len > max_len) {
      invalid(max_name, "sequence ", b, " has length ", len, " (from ", name, "), more than ", max_name, " = ",
              max_len);
    }
  }
  if (cu[batch] > total) invalid(name, name, "[", batch, "] is ", cu[batch], ", past the ", total, " packed rows");
}

}  // namespace

std::vector<int32_t> cache_lengths_array(const KvCacheParams& p) {
  const ForwardParams& f = p.fwd;
  if (p.cache_seqlens != nullptr) return {};
  if (p.uniform_cache_seqlen) return std::vector<int32_t>(static_cast<size_t>(f.batch), p.cache_seqlen);
  std::vector<int32_t> lengths(static_cast<size_t>(f.batch));
  for (int b = 0; b < f.batch; ++b) {
    const int64_t keys = static_cast<int64_t>(f.cu_seqlens_k[b + 1]) - f.cu_seqlens_k[b];
    if (keys < 0 || keys > p.max_seqlen_k) {
      invalid("cu_seqlens_k", "sequence ", b, " has ", keys, " keys (from cu_seqlens_k); it must be in [0, max_seqlen_k = ",
              p.max_seqlen_k, "]");
    }
    const int64_t used = f.seqused_k ? f.seqused_k[b] : keys;
    if (used < 0 || used > keys) {
      invalid("seqused_k", "seqused_k[", b, "] is ", used, "; sequence ", b, " has ", keys, " keys");
    }
    lengths[static_cast<size_t>(b)] = static_cast<int32_t>(used);
  }
  return lengths;
}

KvCacheParams with_cache_lengths(const KvCacheParams& p, const std::vector<int32_t>& lengths) {
  KvCacheParams q = p;
  q.cache_seqlens = lengths.data();
  q.fwd.cu_seqlens_k = q.fwd.seqused_k = nullptr;
  q.uniform_cache_seqlen = 0;
  return q;
}

void validate_kvcache_contents(const KvCacheParams& params) {
  if (params.cache_seqlens == nullptr && (params.fwd.cu_seqlens_k != nullptr || params.uniform_cache_seqlen)) {
    const std::vector<int32_t> lengths = cache_lengths_array(params);
    validate_kvcache_contents(with_cache_lengths(params, lengths));
    return;
  }
  const KvCacheParams& p = params;
  const ForwardParams& f = p.fwd;
  const bool paged = p.block_table != nullptr;
  if (f.cu_seqlens_q) check_cu_seqlens("cu_seqlens_q", f.cu_seqlens_q, f.batch, f.total_q, f.seqlen_q, "max_seqlen_q");
  for (int b = 0; b < f.batch; ++b) {
    const int64_t seqlen = p.cache_seqlens[b];
    const int64_t end = check_cache_length(p, b, seqlen);
    if (p.cache_leftpad && (p.cache_leftpad[b] < 0 || p.cache_leftpad[b] > seqlen)) {
      invalid("cache_leftpad", "cache_leftpad[", b, "] is ", p.cache_leftpad[b],
              "; it must lie in [0, cache_seqlens[", b, "] = ", seqlen, "]");
    }
    const int row = p.cache_batch_idx ? p.cache_batch_idx[b] : b;
    if (row < 0 || row >= p.num_cache_entries) {
      invalid(p.cache_batch_idx ? "cache_batch_idx" : "k_cache", "sequence ", b, " uses cache entry ",
              row, " of ", p.num_cache_entries);
    }
    if (!paged) continue;
    const int64_t first = p.cache_leftpad ? p.cache_leftpad[b] : 0;
    for (int64_t page = first / p.page_size; page * p.page_size < end; ++page) {
      const int block = p.block_table[row * p.block_table_batch_stride + page];
      if (block < 0 || block >= p.num_blocks) {
        invalid("block_table", "block_table[", row, ", ", page, "] is ", block, "; the cache has ",
                p.num_blocks, " pages");
      }
    }
  }
  check_append_slots(p);
}

void validate_sequence_lengths(const ForwardParams& p) {
  if (is_varlen(p)) {
    check_cu_seqlens("cu_seqlens_q", p.cu_seqlens_q, p.batch, p.total_q, p.seqlen_q, "max_seqlen_q");
    check_cu_seqlens("cu_seqlens_k", p.cu_seqlens_k, p.batch, p.total_k, p.seqlen_k, "max_seqlen_k");
  }
  if (p.seqused_k != nullptr) {
    for (int b = 0; b < p.batch; ++b) {
      const int available =
          is_varlen(p) ? p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b] : p.seqlen_k;
      if (p.seqused_k[b] < 0 || p.seqused_k[b] > available) {
        invalid("seqused_k", "seqused_k[", b, "] is ", p.seqused_k[b], "; sequence ", b, " has ",
                available, " keys");
      }
    }
  }
}

}  // namespace tileattn
