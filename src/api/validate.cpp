#include "api/validate.h"

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <initializer_list>
#include <stdexcept>
#include <sstream>
#include <string>
#include <utility>

#include "api/append_slots.h"
#include "api/memory_overlap.h"

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

void check_pointer(const void* ptr, const char* name, int64_t elements) {
  if (ptr == nullptr && elements > 0) invalid(name, name, " is a null pointer");
}

// One dim of a tensor view: how many indices and how far apart, in elements.
struct Dim {
  int64_t size;
  int64_t stride;
};

// The outer dims of a tensor view, at most 3, held in place: validation runs on every call, and
// a heap vector per tensor cost ~10% of a decode call's validation.
struct DimList {
  static constexpr int kMax = 3;
  Dim dims[kMax];
  int count = 0;

  DimList(std::initializer_list<Dim> list) {
    for (const Dim& d : list) push_back(d);
  }
  void push_back(const Dim& d) {
    if (count == kMax) throw std::logic_error("DimList holds at most 3 dims");
    dims[count++] = d;
  }
  const Dim* begin() const { return dims; }
  const Dim* end() const { return dims + count; }
};

// A tensor we write must not have two indices on one element, or the result depends on the
// order of the writes.  Sorted by stride, each dim must step past everything the dims inside
// it span.  dims excludes the contiguous innermost dim, whose extent is `inner`.
void check_strides(const char* name, const DimList& dims, int64_t inner, bool written) {
  for (const Dim& d : dims) {
    if (d.stride < 0) invalid(name, name, " has a negative stride (", d.stride, ")");
  }
  if (!written) return;
  Dim sorted[DimList::kMax];
  int n = 0;
  for (const Dim& d : dims) {
    if (d.size > 1) sorted[n++] = d;
  }
  for (int i = 1; i < n; ++i) {  // by stride; std::sort trips GCC 12's -Warray-bounds here
    for (int j = i; j > 0 && sorted[j - 1].stride > sorted[j].stride; --j) std::swap(sorted[j - 1], sorted[j]);
  }
  int64_t span = inner;  // elements covered by the dims checked so far
  for (int i = 0; i < n; ++i) {
    const Dim& d = sorted[i];
    if (d.stride < span) {
      invalid(name, name, " has overlapping elements: a stride of ", d.stride,
              " is smaller than the ", span, " elements the inner dims span");
    }
    span = d.stride * (d.size - 1) + span;
  }
}

// The (rows, heads, head_dim) view of q-, k- or v-shaped tensors, in either batch or varlen form.
void check_qkv_like(const ForwardParams& p, const char* name, const void* ptr, int64_t batch_stride,
                    int64_t row_stride, int64_t head_stride, int64_t rows_per_batch,
                    int64_t total_rows, int heads, bool written) {
  const int64_t batches = is_varlen(p) ? 1 : p.batch;
  const int64_t rows = is_varlen(p) ? total_rows : rows_per_batch;
  check_pointer(ptr, name, batches * rows * heads * p.head_dim);
  DimList dims = {{rows, row_stride}, {heads, head_stride}};
  if (!is_varlen(p)) dims.push_back({batches, batch_stride});
  check_strides(name, dims, p.head_dim, written);
}

const char* dtype_name(tileattn_dtype dtype) {
  switch (dtype) {
    case TILEATTN_FLOAT16: return "float16";
    case TILEATTN_BFLOAT16: return "bfloat16";
    case TILEATTN_FLOAT32: return "float32";
  }
  return "unknown";
}

int element_bytes(tileattn_dtype dtype) { return dtype == TILEATTN_FLOAT32 ? 4 : 2; }

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
        if (o == w || (written_[o] && o < w)) continue;
        // Apart as byte ranges: almost every call stops here, before the stride search.
        if (end_[w] <= views_[o].base || end_[o] <= views_[w].base) continue;
        if (!views_share_bytes(views_[w], views_[o])) continue;
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
    end_[num_] = v.base + v.extent();
    written_[num_++] = written;
  }

  MemoryView views_[kMaxViews];
  uintptr_t end_[kMaxViews];
  bool written_[kMaxViews];  // views_, end_ and written_ hold num_ entries
  int num_ = 0;
};

// A q-, k- or v-shaped tensor, in batch or varlen form.
MemoryView qkv_view(const ForwardParams& p, const char* name, const void* ptr, int64_t batch_stride,
                    int64_t row_stride, int64_t head_stride, int64_t rows_per_batch,
                    int64_t total_rows, int heads) {
  const int bytes = element_bytes(p.dtype);
  MemoryView view(name, ptr, p.head_dim * bytes);
  view.dim(is_varlen(p) ? total_rows : rows_per_batch, row_stride, bytes).dim(heads, head_stride, bytes);
  if (!is_varlen(p)) view.dim(p.batch, batch_stride, bytes);
  return view;
}

MemoryView int32_view(const char* name, const int32_t* ptr, int64_t count) {
  return MemoryView(name, ptr, count * 4);
}

// The forward's arguments; out, softmax_lse and attn_probs are outputs of a forward and inputs of
// a backward.
void add_forward_views(const ForwardParams& p, bool outputs_written, ArgumentViews& views) {
  views.read(qkv_view(p, "q", p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride, p.seqlen_q,
                      p.total_q, p.num_heads));
  views.read(qkv_view(p, "k", p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride, p.seqlen_k,
                      p.total_k, p.num_heads_k));
  views.read(qkv_view(p, "v", p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride, p.seqlen_k,
                      p.total_k, p.num_heads_k));
  views.read_or_written(qkv_view(p, "out", p.out, p.out_batch_stride, p.out_row_stride,
                                 p.out_head_stride, p.seqlen_q, p.total_q, p.num_heads),
                        outputs_written);
  const int64_t lse_rows = is_varlen(p) ? p.total_q : p.seqlen_q;
  MemoryView lse("softmax_lse", p.softmax_lse, lse_rows * 4);
  lse.dim(p.num_heads, p.lse_head_stride, 4);
  if (!is_varlen(p)) lse.dim(p.batch, p.lse_batch_stride, 4);
  views.read_or_written(lse, outputs_written);
  if (outputs_written && p.attn_probs != nullptr) {
    views.written(MemoryView("attn_probs", p.attn_probs, int64_t{p.seqlen_k} * 4)
                      .dim(p.seqlen_q, p.probs_row_stride, 4)
                      .dim(p.num_heads, p.probs_head_stride, 4)
                      .dim(p.batch, p.probs_batch_stride, 4));
  }
  MemoryView slopes("alibi_slopes", p.alibi_slopes, int64_t{p.num_heads} * 4);
  if (p.alibi_batch_stride != 0) slopes.dim(p.batch, p.alibi_batch_stride, 4);
  views.read(slopes);
  views.read(int32_view("cu_seqlens_q", p.cu_seqlens_q, int64_t{p.batch} + 1));
  views.read(int32_view("cu_seqlens_k", p.cu_seqlens_k, int64_t{p.batch} + 1));
  views.read(int32_view("seqused_k", p.seqused_k, p.batch));
}

void check_sizes(const ForwardParams& p) {
  if (p.batch < 0) invalid("batch", "batch is ", p.batch, "; it must be >= 0");
  if (p.seqlen_q < 0) invalid("seqlen_q", "seqlen_q is ", p.seqlen_q, "; it must be >= 0");
  if (p.seqlen_k < 0) invalid("seqlen_k", "seqlen_k is ", p.seqlen_k, "; it must be >= 0");
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

void check_dtype_and_device(const ForwardParams& p) {
  if (p.device != TILEATTN_DEVICE_CPU && p.device != TILEATTN_DEVICE_CUDA) {
    invalid("device", "device ", static_cast<int>(p.device), " is neither CPU (0) nor CUDA (1)");
  }
  if (p.dtype != TILEATTN_FLOAT16 && p.dtype != TILEATTN_BFLOAT16 && p.dtype != TILEATTN_FLOAT32) {
    fail(ErrorCode::kDtype, "q", "q has dtype code ", static_cast<int>(p.dtype),
         ", which is none of float16, bfloat16, float32");
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
  if (!(p.dropout_p >= 0.0f && p.dropout_p < 1.0f)) {
    invalid("dropout_p", "dropout_p is ", p.dropout_p, "; it must be in [0, 1)");
  }
  if (p.alibi_slopes != nullptr && p.alibi_batch_stride != 0 && p.alibi_batch_stride < p.num_heads) {
    invalid("alibi_slopes", "alibi_slopes has a batch stride of ", p.alibi_batch_stride,
            ", less than its ", p.num_heads, " heads; use shape (H) with stride 0 or (B, H)");
  }
  if (p.alibi_batch_stride < 0) {
    invalid("alibi_slopes", "alibi_slopes has a negative batch stride (", p.alibi_batch_stride, ")");
  }
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

void check_lse(const ForwardParams& p) {
  const int64_t rows = is_varlen(p) ? p.total_q : p.seqlen_q;
  const int64_t batches = is_varlen(p) ? 1 : p.batch;
  check_pointer(p.softmax_lse, "softmax_lse", batches * p.num_heads * rows);
  DimList dims = {{p.num_heads, p.lse_head_stride}};
  if (!is_varlen(p)) dims.push_back({batches, p.lse_batch_stride});
  check_strides("softmax_lse", dims, rows, /*written=*/true);
}

void check_probs(const ForwardParams& p) {
  if (p.attn_probs == nullptr) return;
  check_strides("attn_probs",
                {{p.batch, p.probs_batch_stride}, {p.num_heads, p.probs_head_stride},
                 {p.seqlen_q, p.probs_row_stride}},
                p.seqlen_k, /*written=*/true);
}

// Every rule of validate_forward but the memory overlaps, which depend on what the call writes.
void check_forward_struct(const ForwardParams& p) {
  check_dtype_and_device(p);
  check_sizes(p);
  check_varlen_struct(p);
  check_options(p);
  check_qkv_like(p, "q", p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride, p.seqlen_q,
                 p.total_q, p.num_heads, false);
  check_qkv_like(p, "k", p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride, p.seqlen_k,
                 p.total_k, p.num_heads_k, false);
  check_qkv_like(p, "v", p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride, p.seqlen_k,
                 p.total_k, p.num_heads_k, false);
  check_qkv_like(p, "out", p.out, p.out_batch_stride, p.out_row_stride, p.out_head_stride,
                 p.seqlen_q, p.total_q, p.num_heads, true);
  check_lse(p);
  check_probs(p);
}

}  // namespace

void validate_forward(const ForwardParams& p) {
  check_forward_struct(p);
  ArgumentViews views;
  add_forward_views(p, /*outputs_written=*/true, views);
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
  check_forward_struct(f);
  check_qkv_like(f, "dout", p.dout, p.dout_batch_stride, p.dout_row_stride, p.dout_head_stride,
                 f.seqlen_q, f.total_q, f.num_heads, false);
  check_qkv_like(f, "dq", p.dq, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride, f.seqlen_q,
                 f.total_q, f.num_heads, true);
  check_qkv_like(f, "dk", p.dk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride, f.seqlen_k,
                 f.total_k, f.num_heads_k, true);
  check_qkv_like(f, "dv", p.dv, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride, f.seqlen_k,
                 f.total_k, f.num_heads_k, true);
  ArgumentViews views;
  add_forward_views(f, /*outputs_written=*/false, views);
  views.read(qkv_view(f, "dout", p.dout, p.dout_batch_stride, p.dout_row_stride, p.dout_head_stride,
                      f.seqlen_q, f.total_q, f.num_heads));
  views.written(qkv_view(f, "dq", p.dq, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride,
                         f.seqlen_q, f.total_q, f.num_heads));
  views.written(qkv_view(f, "dk", p.dk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride,
                         f.seqlen_k, f.total_k, f.num_heads_k));
  views.written(qkv_view(f, "dv", p.dv, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride,
                         f.seqlen_k, f.total_k, f.num_heads_k));
  views.written(MemoryView("workspace", p.workspace, p.workspace_bytes));
  views.check_disjoint();
}

namespace {

// q_side: the forward's struct with no keys (out, lse, q, ALiBi); the caches are (cache_batches,
// cache_rows, Hk, D), entries or pages.  The caches are written only by an append: without one,
// k_cache may be v_cache.
void check_kvcache_overlaps(const KvCacheParams& p, const ForwardParams& q_side,
                            int64_t cache_batches, int64_t cache_rows) {
  const ForwardParams& f = p.fwd;
  const int bytes = element_bytes(f.dtype);
  const bool appends = p.k_new != nullptr;
  ArgumentViews views;
  add_forward_views(q_side, /*outputs_written=*/true, views);
  views.read_or_written(MemoryView("k_cache", f.k, f.head_dim * bytes)
                            .dim(cache_batches, f.k_batch_stride, bytes)
                            .dim(cache_rows, f.k_row_stride, bytes)
                            .dim(f.num_heads_k, f.k_head_stride, bytes),
                        appends);
  views.read_or_written(MemoryView("v_cache", f.v, f.head_dim * bytes)
                            .dim(cache_batches, f.v_batch_stride, bytes)
                            .dim(cache_rows, f.v_row_stride, bytes)
                            .dim(f.num_heads_k, f.v_head_stride, bytes),
                        appends);
  if (appends) {
    views.read(MemoryView("k", p.k_new, f.head_dim * bytes)
                   .dim(f.batch, p.k_new_batch_stride, bytes)
                   .dim(p.seqlen_new, p.k_new_row_stride, bytes)
                   .dim(f.num_heads_k, p.k_new_head_stride, bytes));
    views.read(MemoryView("v", p.v_new, f.head_dim * bytes)
                   .dim(f.batch, p.v_new_batch_stride, bytes)
                   .dim(p.seqlen_new, p.v_new_row_stride, bytes)
                   .dim(f.num_heads_k, p.v_new_head_stride, bytes));
  }
  views.read(int32_view("cache_seqlens", p.cache_seqlens, f.batch));
  views.read(int32_view("cache_batch_idx", p.cache_batch_idx, f.batch));
  views.read(int32_view("cache_leftpad", p.cache_leftpad, f.batch));
  if (p.block_table != nullptr) {
    views.read(MemoryView("block_table", p.block_table, int64_t{p.max_blocks} * 4)
                   .dim(p.num_cache_entries, p.block_table_batch_stride, 4));
  }
  if (p.rotary_cos != nullptr) {
    const int64_t table_bytes = int64_t{p.rotary_seqlen} * (p.rotary_dim / 2) * bytes;
    views.read(MemoryView("rotary_cos", p.rotary_cos, table_bytes));
    views.read(MemoryView("rotary_sin", p.rotary_sin, table_bytes));
  }
  views.written(MemoryView("workspace", p.workspace, p.workspace_bytes));
  views.check_disjoint();
}

}  // namespace

void validate_kvcache(const KvCacheParams& p) {
  const ForwardParams& f = p.fwd;
  if (f.cu_seqlens_q || f.cu_seqlens_k) {
    invalid("cu_seqlens_q", "flash_attn_with_kvcache takes no cu_seqlens; use cache_seqlens");
  }
  if (f.seqused_k) invalid("seqused_k", "flash_attn_with_kvcache takes no seqused_k; use cache_seqlens");
  if (f.dropout_p != 0.0f) invalid("dropout_p", "flash_attn_with_kvcache has no dropout");
  if (f.attn_probs) invalid("attn_probs", "flash_attn_with_kvcache returns no attention probabilities");
  if (p.cache_seqlens == nullptr && f.batch > 0) invalid("cache_seqlens", "cache_seqlens is required");
  const bool paged = p.block_table != nullptr;
  if (p.num_cache_entries < 1) {
    invalid(paged ? "block_table" : "k_cache", paged ? "block_table has " : "k_cache has ",
            p.num_cache_entries, " rows; it needs at least 1");
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
    if (p.block_table_batch_stride < p.max_blocks) {
      invalid("block_table", "block_table has a row stride of ", p.block_table_batch_stride,
              ", less than its ", p.max_blocks, " columns");
    }
    cache_batches = p.num_blocks;
    cache_rows = p.page_size;
  }
  // q, out, lse and the options are checked as a batch-form forward whose k/v are the caches'
  // first entry; the caches themselves below, as the (entries, rows, Hk, D) tensors they are.
  ForwardParams q_side = f;
  q_side.seqlen_k = 0;
  check_forward_struct(q_side);
  check_pointer(f.k, "k_cache", cache_batches * cache_rows);
  check_pointer(f.v, "v_cache", cache_batches * cache_rows);
  const bool appends = p.k_new != nullptr;
  check_strides("k_cache", {{cache_batches, f.k_batch_stride}, {cache_rows, f.k_row_stride}, {f.num_heads_k, f.k_head_stride}},
                f.head_dim, appends);
  check_strides("v_cache", {{cache_batches, f.v_batch_stride}, {cache_rows, f.v_row_stride}, {f.num_heads_k, f.v_head_stride}},
                f.head_dim, appends);
  if ((p.k_new == nullptr) != (p.v_new == nullptr)) {
    invalid(p.k_new ? "v" : "k", "k and v (the new tokens) must be given together");
  }
  if (appends) {
    if (p.seqlen_new < 1) invalid("k", "k has ", p.seqlen_new, " new tokens; it needs at least 1");
    check_strides("k", {{f.batch, p.k_new_batch_stride}, {p.seqlen_new, p.k_new_row_stride}, {f.num_heads_k, p.k_new_head_stride}},
                  f.head_dim, false);
    check_strides("v", {{f.batch, p.v_new_batch_stride}, {p.seqlen_new, p.v_new_row_stride}, {f.num_heads_k, p.v_new_head_stride}},
                  f.head_dim, false);
  }
  if ((p.rotary_cos == nullptr) != (p.rotary_sin == nullptr)) {
    invalid(p.rotary_cos ? "rotary_sin" : "rotary_cos", "rotary_cos and rotary_sin must be given together");
  }
  if (p.rotary_cos != nullptr) {
    if (p.rotary_dim < 2 || p.rotary_dim % 2 != 0 || p.rotary_dim > f.head_dim) {
      invalid("rotary_cos", "rotary_cos covers a rotary dim of ", p.rotary_dim,
              "; it must be even and between 2 and the head dim ", f.head_dim);
    }
    if (p.rotary_seqlen < 1) invalid("rotary_cos", "rotary_cos has ", p.rotary_seqlen, " positions");
  }
  if (p.num_splits < 0) invalid("num_splits", "num_splits is ", p.num_splits, "; it must be >= 0");
  check_workspace(p.workspace, p.workspace_bytes);
  check_kvcache_overlaps(p, q_side, cache_batches, cache_rows);
}

void validate_kvcache_contents(const KvCacheParams& p) {
  const ForwardParams& f = p.fwd;
  const bool paged = p.block_table != nullptr;
  for (int b = 0; b < f.batch; ++b) {
    const int64_t seqlen = p.cache_seqlens[b];
    const int64_t end = seqlen + (p.k_new ? p.seqlen_new : 0);
    if (seqlen < 0) invalid("cache_seqlens", "cache_seqlens[", b, "] is ", seqlen, "; it must be >= 0");
    if (end > f.seqlen_k) {
      invalid("cache_seqlens", "sequence ", b, " needs ", end, " cache slots (cache_seqlens[", b, "] = ",
              seqlen, " plus the new tokens); the cache holds ", f.seqlen_k);
    }
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
  if (p.rotary_cos != nullptr) {
    for (int b = 0; b < f.batch; ++b) {
      const int64_t last = static_cast<int64_t>(p.cache_seqlens[b]) + std::max(p.seqlen_new, f.seqlen_q) - 1;
      if (last >= p.rotary_seqlen) {
        invalid("rotary_cos", "sequence ", b, " needs rotary position ", last, "; rotary_cos has ",
                p.rotary_seqlen, " positions");
      }
    }
  }
  check_append_slots(p);
}

void validate_sequence_lengths(const ForwardParams& p) {
  if (is_varlen(p)) {
    struct Side {
      const char* name;
      const int32_t* cu;
      int64_t total;
      int max_len;
      const char* max_name;
    };
    const Side sides[] = {{"cu_seqlens_q", p.cu_seqlens_q, p.total_q, p.seqlen_q, "max_seqlen_q"},
                          {"cu_seqlens_k", p.cu_seqlens_k, p.total_k, p.seqlen_k, "max_seqlen_k"}};
    for (const Side& s : sides) {
      if (s.cu[0] < 0) invalid(s.name, s.name, "[0] is ", s.cu[0], "; it must be >= 0");
      for (int b = 0; b < p.batch; ++b) {
        const int64_t len = static_cast<int64_t>(s.cu[b + 1]) - s.cu[b];
        if (len < 0) {
          invalid(s.name, s.name, " is not monotone: entry ", b + 1, " (", s.cu[b + 1],
                  ") is below entry ", b, " (", s.cu[b], ")");
        }
        if (len > s.max_len) {
          invalid(s.max_name, "sequence ", b, " has length ", len, " (from ", s.name,
                  "), more than ", s.max_name, " = ", s.max_len);
        }
      }
      if (s.cu[p.batch] > s.total) {
        invalid(s.name, s.name, "[", p.batch, "] is ", s.cu[p.batch], ", past the ", s.total,
                " packed rows");
      }
    }
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
