// The KV-cache route's copies (kvcache_forward_route.h): q's rows into the workspace, rotated where
// the call has rotary tables and laid out dense or with a KV group's heads packed token by token
// (RouteQLayout); with packed heads the forward's out and LSE back.  A CTA a query slot, through
// 16-byte vectors where the call allows.
#include <cstdint>

#include "cuda/check.h"
#include "cuda/decode/append_kernel.cuh"
#include "cuda/decode/decode_args.h"
#include "cuda/decode/kvcache_forward_route.h"
#include "cuda/vector_aligned.h"

namespace tileattn::cuda::decode {
namespace {

constexpr int kRotateThreads = 256;
// Work items a thread a pass, every load of a pass issued before its first store (append_token's
// reason): one memory round trip a pass, one pass for a row of 32 heads x d128 (2048 rotary pairs).
// An item is one rotary pair, read and written as x[a] and x[b] with one cos and one sin, or one
// dimension past rotary_dim copied.  H100, 4 sequences x 32 heads x d128 (session 65): the first
// version, 4 slots a CTA walked an element at a time with each store after its loads, took ~60 us
// at 16 rows, twice the decode kernels' whole call; an element a thread with 8 in flight left
// ~40 us over the bare route at 512 rows, a cos, a sin and both halves of the pair loaded per
// element; the vector kernel below takes the calls whose strides and tables allow 16-byte access.
constexpr int kRotateBatch = 8;

// Element 0 of head h in a query slot's row of the copy (RouteQLayout).
__device__ __forceinline__ int64_t head_offset(const RouteQLayout& layout, int h, int head_dim) {
  return h / layout.group * layout.group_stride + int64_t{h % layout.group} * head_dim;
}

// The query slot CTA (slot, b) of a q copy writes: where its row lies in q and in the copy, and its
// rotary position, cache_seqlens[b] + slot when causal or windowed, else cache_seqlens[b]
// (common/kvcache.h's rotary_positions_past_cache).  Not live for a sequence the lengths kernel
// refused (-1: its rotary positions may lie past the tables), which the forward skips too, nor for
// a slot past the sequence's rows.
struct CopySlot {
  bool live;
  int64_t position, q_offset, copy_offset;
};

__device__ __forceinline__ CopySlot copy_slot(const tileattn_kvcache_params& p, const int32_t* lengths,
                                              const RouteQLayout& layout) {
  const int slot = blockIdx.x, b = blockIdx.y;
  CopySlot at{false, 0, 0, 0};
  if (lengths[b] < 0) return at;
  const tileattn_fwd_params& f = p.fwd;
  const QuerySlots slots = query_slots(f, b);
  if (!slots.live(slot)) return at;
  at.live = true;
  at.position = sequence_keys(p, b).seqlen + (rotary_position_per_row(f) ? slot : 0);
  at.q_offset = slots.offset(slot, 0, f.q_batch_stride, f.q_row_stride, 0);
  at.copy_offset = slots.offset(slot, 0, layout.batch_stride, layout.row_stride, 0);
  return at;
}

// Grid (seqlen_q, batch): CTA (slot, b) writes query slot `slot` of sequence b into `layout` at
// q_copy, rotated (without tables: rotary_dim 0, every dimension a copy) at copy_slot's position,
// in the split kernel's float math (append_kernel.cuh's rotated), rounded to T as the split kernel
// rounds its rotated rows for the mma.
template <typename T>
__global__ void __launch_bounds__(kRotateThreads) route_copy_q_kernel(const tileattn_kvcache_params p,
                                                                        const int32_t* lengths, const RouteQLayout layout,
                                                                        T* q_copy) {
  const tileattn_fwd_params& f = p.fwd;
  const CopySlot copy = copy_slot(p, lengths, layout);
  if (!copy.live) return;
  const int pairs = p.rotary_dim / 2;
  const int items_per_head = f.head_dim - pairs;  // the pairs, then head_dim - rotary_dim copies
  const int items = f.num_heads * items_per_head;
  const T* row = static_cast<const T*>(f.q) + copy.q_offset;
  T* out = q_copy + copy.copy_offset;
  for (int i0 = threadIdx.x; i0 < items; i0 += kRotateBatch * kRotateThreads) {
    RotaryInputs<T> in[kRotateBatch];
    int64_t at_a[kRotateBatch], at_b[kRotateBatch];  // the item's elements in the output row; at_b -1 for a copy
#pragma unroll
    for (int u = 0; u < kRotateBatch; ++u) {
      const int i = i0 + u * kRotateThreads;
      if (i >= items) continue;
      const int h = i / items_per_head, k = i % items_per_head;
      const T* x = row + h * f.q_head_stride;
      const int64_t head_at = head_offset(layout, h, f.head_dim);
      in[u].rotated = k < pairs;
      in[u].first = true;
      if (in[u].rotated) {
        const int2 pair = rotary_pair(p, k);
        const int64_t at = rotary_at(p, copy.position, k);
        in[u].xa = x[pair.x];
        in[u].xb = x[pair.y];
        in[u].c = static_cast<const T*>(p.rotary_cos)[at];
        in[u].s = static_cast<const T*>(p.rotary_sin)[at];
        at_a[u] = head_at + pair.x;
        at_b[u] = head_at + pair.y;
      } else {
        in[u].xa = x[k + pairs];  // dimension rotary_dim + (k - pairs)
        at_a[u] = head_at + k + pairs;
        at_b[u] = -1;
      }
    }
#pragma unroll
    for (int u = 0; u < kRotateBatch; ++u) {
      if (i0 + u * kRotateThreads >= items) continue;
      out[at_a[u]] = from_float<T>(rotated(in[u]));  // x'[a], or the copy
      if (at_b[u] >= 0) {
        in[u].first = false;
        out[at_b[u]] = from_float<T>(rotated(in[u]));  // x'[b]
      }
    }
  }
}

// Items of 8 elements a thread a pass in the vector kernel: 4 x (4 vectors of 16 bytes) in flight.
constexpr int kRotateVecBatch = 4;

template <typename T, int N>
struct alignas(sizeof(T) * N) Elements {
  T v[N];
};

// The same rotation through 16-byte vectors, for calls whose q strides are multiples of 8 elements
// and whose tables and q are 16-byte aligned (rotary_vectors_fit).  An item is 8 consecutive
// elements of one head's output: interleaved, 4 rotary pairs with 4 angles (8-byte cos and sin
// loads); in halves, elements [8k, 8k + 8) and [rotary_dim / 2 + 8k, ...) with 8 angles; past
// rotary_dim, 8 dimensions copied.  The float math is rotated()'s, element by element.
// kRotates false: a call without tables (packed heads' copy), every item copied, in an instance of
// its own without the rotation's code: 38 registers a thread on sm90, 6 CTAs an SM.  Through the
// rotating instance (rotary_dim 0) the copy took 199, one CTA of a query slot an SM at a time, each
// waiting out its slot's dependent loads (H100, ncu, 32 x 128 rows x 32 heads x d128: 70 us, 730 GB/s).
template <typename T, bool kInterleaved, bool kRotates = true>
__global__ void __launch_bounds__(kRotateThreads) route_copy_q_vec_kernel(const tileattn_kvcache_params p,
                                                                            const int32_t* lengths,
                                                                            const RouteQLayout layout, T* q_copy) {
  const tileattn_fwd_params& f = p.fwd;
  const CopySlot copy = copy_slot(p, lengths, layout);
  if (!copy.live) return;
  constexpr int kAngles = kInterleaved ? 4 : 8;  // angles an item uses
  const int half = kRotates ? p.rotary_dim / 2 : 0;
  const int rotary_items = half / kAngles;
  const int items_per_head = rotary_items + (f.head_dim - 2 * half) / 8;
  const int items = f.num_heads * items_per_head;
  const T* row = static_cast<const T*>(f.q) + copy.q_offset;
  T* out = q_copy + copy.copy_offset;
  const T* cos_row = static_cast<const T*>(p.rotary_cos) + rotary_at(p, copy.position, 0);
  const T* sin_row = static_cast<const T*>(p.rotary_sin) + rotary_at(p, copy.position, 0);
  using Row8 = Elements<T, 8>;
  using Angles = Elements<T, kAngles>;
  for (int i0 = threadIdx.x; i0 < items; i0 += kRotateVecBatch * kRotateThreads) {
    Row8 xa[kRotateVecBatch], xb[kRotateVecBatch];
    Angles c[kRotateVecBatch], s[kRotateVecBatch];
    int64_t at[kRotateVecBatch];  // the item's first output element (halves: its second vector half further)
    bool rotates[kRotateVecBatch];
#pragma unroll
    for (int u = 0; u < kRotateVecBatch; ++u) {
      const int i = i0 + u * kRotateThreads;
      if (i >= items) continue;
      const int h = i / items_per_head, k = i % items_per_head;
      const T* x = row + h * f.q_head_stride;
      const int64_t head_at = head_offset(layout, h, f.head_dim);
      rotates[u] = kRotates && k < rotary_items;  // kRotates: k may be negative as far as the compiler knows
      if (rotates[u]) {
        xa[u] = *reinterpret_cast<const Row8*>(x + 8 * k);
        if constexpr (!kInterleaved) xb[u] = *reinterpret_cast<const Row8*>(x + half + 8 * k);
        c[u] = *reinterpret_cast<const Angles*>(cos_row + kAngles * k);
        s[u] = *reinterpret_cast<const Angles*>(sin_row + kAngles * k);
        at[u] = head_at + 8 * k;
      } else {
        const int d = 2 * half + 8 * (k - rotary_items);
        xa[u] = *reinterpret_cast<const Row8*>(x + d);
        at[u] = head_at + d;
      }
    }
#pragma unroll
    for (int u = 0; u < kRotateVecBatch; ++u) {
      if (i0 + u * kRotateThreads >= items) continue;
      if (!rotates[u]) {
        *reinterpret_cast<Row8*>(out + at[u]) = xa[u];
        continue;
      }
      Row8 ya, yb;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if constexpr (kInterleaved) {
          const int j = e / 2;  // the pair (e & ~1, e | 1) and its angle
          ya.v[e] = from_float<T>(rotated(RotaryInputs<T>{xa[u].v[e & ~1], xa[u].v[e | 1], c[u].v[j], s[u].v[j], true,
                                                          (e & 1) == 0}));
        } else {
          const RotaryInputs<T> in{xa[u].v[e], xb[u].v[e], c[u].v[e], s[u].v[e], true, true};
          ya.v[e] = from_float<T>(rotated(in));
          yb.v[e] = from_float<T>(rotated(RotaryInputs<T>{in.xa, in.xb, in.c, in.s, true, false}));
        }
      }
      *reinterpret_cast<Row8*>(out + at[u]) = ya;
      if constexpr (!kInterleaved) *reinterpret_cast<Row8*>(out + at[u] + half) = yb;
    }
  }
}

// Whether the vector kernel can serve the call: q and the tables 16-byte aligned, q's strides
// multiples of 8 elements, and an item's angles whole and aligned in a table row (rotary_dim a
// multiple of 8 interleaved, of 16 in halves, so position x rotary_dim / 2 keeps 8- or 16-byte
// alignment), head_dim a multiple of 8.
bool rotary_vectors_fit(const tileattn_kvcache_params& p) {
  const tileattn_fwd_params& f = p.fwd;
  const int rotary_multiple = p.rotary_interleaved ? 8 : 16;
  return vector_aligned(f.q, f.q_batch_stride, f.q_row_stride, f.q_head_stride, f.cu_seqlens_q != nullptr) &&
         aligned16(p.rotary_cos) && aligned16(p.rotary_sin) && p.rotary_dim % rotary_multiple == 0 &&
         f.head_dim % 8 == 0;
}

constexpr int kUnpackThreads = 256;
constexpr int kUnpackBatch = 4;  // 16-byte vectors (or elements) a thread a pass, every load before a store

// Grid (seqlen_q, batch): CTA (slot, b) copies query slot `slot` of sequence b from the packed out
// and LSE (the forward's, over Hk heads of seqlen_q * g rows: route_q_layout(p, true)'s order and
// forward_route_params' LSE strides) into out and softmax_lse, kWidth elements at a time (8: out's
// strides multiples of 8 and out 16-byte aligned).  A sequence the lengths kernel refused is left
// as it wrote it.
template <typename T, int kWidth>
__global__ void __launch_bounds__(kUnpackThreads) route_unpack_kernel(const tileattn_kvcache_params p,
                                                                      const int32_t* lengths, const RouteQLayout layout,
                                                                      const T* packed_out, const float* packed_lse) {
  const int slot = blockIdx.x, b = blockIdx.y;
  if (lengths[b] < 0) return;
  const tileattn_fwd_params& f = p.fwd;
  using Vec = Elements<T, kWidth>;
  const int per_head = f.head_dim / kWidth;
  const int items = f.num_heads * per_head;
  const T* src = packed_out + b * layout.batch_stride + slot * layout.row_stride;
  T* dst = static_cast<T*>(f.out) + b * f.out_batch_stride + slot * f.out_row_stride;
  for (int i0 = threadIdx.x; i0 < items; i0 += kUnpackBatch * kUnpackThreads) {
    Vec v[kUnpackBatch];
#pragma unroll
    for (int u = 0; u < kUnpackBatch; ++u) {
      const int i = i0 + u * kUnpackThreads;
      if (i >= items) continue;
      const int h = i / per_head, e = i % per_head;
      v[u] = *reinterpret_cast<const Vec*>(src + head_offset(layout, h, f.head_dim) + e * kWidth);
    }
#pragma unroll
    for (int u = 0; u < kUnpackBatch; ++u) {
      const int i = i0 + u * kUnpackThreads;
      if (i >= items) continue;
      const int h = i / per_head, e = i % per_head;
      *reinterpret_cast<Vec*>(dst + h * f.out_head_stride + e * kWidth) = v[u];
    }
  }
  // Packed LSE row slot * g + j of KV head h / g is query head h's row `slot`.
  const int g = layout.group;
  for (int h = threadIdx.x; h < f.num_heads; h += kUnpackThreads) {
    const int64_t packed = (static_cast<int64_t>(b) * f.num_heads + h / g * g) * f.seqlen_q + slot * g + h % g;
    f.softmax_lse[b * f.lse_batch_stride + h * f.lse_head_stride + slot] = packed_lse[packed];
  }
}

template <typename T>
void launch_copy(const KvCacheParams& p, const int32_t* lengths, const RouteQLayout& layout, T* dst,
                 cudaStream_t stream) {
  const dim3 grid(p.fwd.seqlen_q, p.fwd.batch);  // batch <= 65535: device_checks.h
  if (!rotary_vectors_fit(p)) {
    route_copy_q_kernel<T><<<grid, kRotateThreads, 0, stream>>>(p, lengths, layout, dst);
  } else if (p.rotary_dim == 0) {
    route_copy_q_vec_kernel<T, false, false><<<grid, kRotateThreads, 0, stream>>>(p, lengths, layout, dst);
  } else if (p.rotary_interleaved) {
    route_copy_q_vec_kernel<T, true><<<grid, kRotateThreads, 0, stream>>>(p, lengths, layout, dst);
  } else {
    route_copy_q_vec_kernel<T, false><<<grid, kRotateThreads, 0, stream>>>(p, lengths, layout, dst);
  }
}

}  // namespace

void launch_route_copy_q(const KvCacheParams& p, const int32_t* lengths, const RouteQLayout& layout, void* dst,
                         cudaStream_t stream) {
  KvCacheParams call = p;
  if (call.rotary_cos == nullptr) {  // a copy: every item one of the dimensions past rotary_dim
    call.rotary_dim = 0;
    call.rotary_interleaved = false;
  }
  if (p.fwd.dtype == TILEATTN_FLOAT16) {
    launch_copy(call, lengths, layout, static_cast<__half*>(dst), stream);
  } else {
    launch_copy(call, lengths, layout, static_cast<__nv_bfloat16*>(dst), stream);
  }
  check_cuda(cudaGetLastError(), "KV-cache route q copy kernel launch");
}

void launch_route_unpack(const KvCacheParams& p, const int32_t* lengths, const RouteBuffers& buffers,
                         cudaStream_t stream) {
  const tileattn_fwd_params& f = p.fwd;
  const dim3 grid(f.seqlen_q, f.batch);
  const RouteQLayout layout = route_q_layout(p, true);
  const bool vectors =
      f.head_dim % 8 == 0 && vector_aligned(f.out, f.out_batch_stride, f.out_row_stride, f.out_head_stride);
  const auto launch = [&](auto element) {
    using T = decltype(element);
    const T* out = static_cast<const T*>(buffers.out_packed);
    if (vectors) {
      route_unpack_kernel<T, 8><<<grid, kUnpackThreads, 0, stream>>>(p, lengths, layout, out, buffers.lse_packed);
    } else {
      route_unpack_kernel<T, 1><<<grid, kUnpackThreads, 0, stream>>>(p, lengths, layout, out, buffers.lse_packed);
    }
  };
  f.dtype == TILEATTN_FLOAT16 ? launch(__half{}) : launch(__nv_bfloat16{});
  check_cuda(cudaGetLastError(), "KV-cache route unpack kernel launch");
}

}  // namespace tileattn::cuda::decode
