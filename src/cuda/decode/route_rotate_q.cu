// The KV-cache route's rotary: q's rows rotated into a workspace copy the forward reads
// (kvcache_forward_route.h), by a CTA a query slot, through 16-byte vectors where the call allows.
#include <cstdint>

#include "cuda/check.h"
#include "cuda/decode/append_kernel.cuh"
#include "cuda/decode/decode_args.h"
#include "cuda/decode/kvcache_forward_route.h"

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

// Grid (seqlen_q, batch): CTA (slot, b) writes query slot `slot` of sequence b rotated into
// q_rotated, laid out as q is (batch form or packed rows) with dense strides, at position
// cache_seqlens[b] + slot when causal or windowed, else cache_seqlens[b] (common/kvcache.h's
// rotary_positions_past_cache), in the split kernel's float math (append_kernel.cuh's rotated),
// rounded to T as the split kernel rounds its rotated rows for the mma.  A sequence the lengths
// kernel refused (-1: its rotary positions may lie past the tables) is skipped, as the forward
// skips it, and so are the slots of packed rows that hold no row.
template <typename T>
__global__ void __launch_bounds__(kRotateThreads) route_rotate_q_kernel(const tileattn_kvcache_params p,
                                                                        const int32_t* lengths, T* q_rotated) {
  const int slot = blockIdx.x, b = blockIdx.y;
  if (lengths[b] < 0) return;
  const tileattn_fwd_params& f = p.fwd;
  const QuerySlots slots = query_slots(f, b);
  if (!slots.live(slot)) return;
  const bool per_row_position = rotary_position_per_row(f);
  const int64_t position = sequence_keys(p, b).seqlen + (per_row_position ? slot : 0);
  const int pairs = p.rotary_dim / 2;
  const int items_per_head = f.head_dim - pairs;  // the pairs, then head_dim - rotary_dim copies
  const int items = f.num_heads * items_per_head;
  const int row_elems = f.num_heads * f.head_dim;
  const T* row = static_cast<const T*>(f.q) + slots.offset(slot, 0, f.q_batch_stride, f.q_row_stride, 0);
  T* out = q_rotated + slots.offset(slot, 0, static_cast<int64_t>(f.seqlen_q) * row_elems, row_elems, 0);
  for (int i0 = threadIdx.x; i0 < items; i0 += kRotateBatch * kRotateThreads) {
    RotaryInputs<T> in[kRotateBatch];
    int at_a[kRotateBatch], at_b[kRotateBatch];  // the item's elements in the output row; at_b -1 for a copy
#pragma unroll
    for (int u = 0; u < kRotateBatch; ++u) {
      const int i = i0 + u * kRotateThreads;
      if (i >= items) continue;
      const int h = i / items_per_head, k = i % items_per_head;
      const T* x = row + h * f.q_head_stride;
      in[u].rotated = k < pairs;
      in[u].first = true;
      if (in[u].rotated) {
        const int2 pair = rotary_pair(p, k);
        const int64_t at = rotary_at(p, position, k);
        in[u].xa = x[pair.x];
        in[u].xb = x[pair.y];
        in[u].c = static_cast<const T*>(p.rotary_cos)[at];
        in[u].s = static_cast<const T*>(p.rotary_sin)[at];
        at_a[u] = h * f.head_dim + pair.x;
        at_b[u] = h * f.head_dim + pair.y;
      } else {
        in[u].xa = x[k + pairs];  // dimension rotary_dim + (k - pairs)
        at_a[u] = h * f.head_dim + k + pairs;
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
template <typename T, bool kInterleaved>
__global__ void __launch_bounds__(kRotateThreads) route_rotate_q_vec_kernel(const tileattn_kvcache_params p,
                                                                            const int32_t* lengths, T* q_rotated) {
  const int slot = blockIdx.x, b = blockIdx.y;
  if (lengths[b] < 0) return;
  const tileattn_fwd_params& f = p.fwd;
  const QuerySlots slots = query_slots(f, b);
  if (!slots.live(slot)) return;
  const bool per_row_position = rotary_position_per_row(f);
  const int64_t position = sequence_keys(p, b).seqlen + (per_row_position ? slot : 0);
  constexpr int kAngles = kInterleaved ? 4 : 8;  // angles an item uses
  const int half = p.rotary_dim / 2;
  const int rotary_items = half / kAngles;
  const int items_per_head = rotary_items + (f.head_dim - p.rotary_dim) / 8;
  const int items = f.num_heads * items_per_head;
  const int row_elems = f.num_heads * f.head_dim;
  const T* row = static_cast<const T*>(f.q) + slots.offset(slot, 0, f.q_batch_stride, f.q_row_stride, 0);
  T* out = q_rotated + slots.offset(slot, 0, static_cast<int64_t>(f.seqlen_q) * row_elems, row_elems, 0);
  const T* cos_row = static_cast<const T*>(p.rotary_cos) + rotary_at(p, position, 0);
  const T* sin_row = static_cast<const T*>(p.rotary_sin) + rotary_at(p, position, 0);
  using Row8 = Elements<T, 8>;
  using Angles = Elements<T, kAngles>;
  for (int i0 = threadIdx.x; i0 < items; i0 += kRotateVecBatch * kRotateThreads) {
    Row8 xa[kRotateVecBatch], xb[kRotateVecBatch];
    Angles c[kRotateVecBatch], s[kRotateVecBatch];
    int at[kRotateVecBatch];  // the item's first output element (halves: its second vector half further)
    bool rotates[kRotateVecBatch];
#pragma unroll
    for (int u = 0; u < kRotateVecBatch; ++u) {
      const int i = i0 + u * kRotateThreads;
      if (i >= items) continue;
      const int h = i / items_per_head, k = i % items_per_head;
      const T* x = row + h * f.q_head_stride;
      rotates[u] = k < rotary_items;
      if (rotates[u]) {
        xa[u] = *reinterpret_cast<const Row8*>(x + 8 * k);
        if constexpr (!kInterleaved) xb[u] = *reinterpret_cast<const Row8*>(x + half + 8 * k);
        c[u] = *reinterpret_cast<const Angles*>(cos_row + kAngles * k);
        s[u] = *reinterpret_cast<const Angles*>(sin_row + kAngles * k);
        at[u] = h * f.head_dim + 8 * k;
      } else {
        const int d = p.rotary_dim + 8 * (k - rotary_items);
        xa[u] = *reinterpret_cast<const Row8*>(x + d);
        at[u] = h * f.head_dim + d;
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

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// Whether the vector kernel can serve the call: q and the tables 16-byte aligned, q's strides
// multiples of 8 elements, and an item's angles whole and aligned in a table row (rotary_dim a
// multiple of 8 interleaved, of 16 in halves, so position x rotary_dim / 2 keeps 8- or 16-byte
// alignment), head_dim a multiple of 8.
bool rotary_vectors_fit(const tileattn_kvcache_params& p) {
  const tileattn_fwd_params& f = p.fwd;
  const bool strides = f.q_head_stride % 8 == 0 && f.q_row_stride % 8 == 0 &&
                       (f.cu_seqlens_q != nullptr || f.q_batch_stride % 8 == 0);
  const int rotary_multiple = p.rotary_interleaved ? 8 : 16;
  return aligned16(f.q) && aligned16(p.rotary_cos) && aligned16(p.rotary_sin) && strides &&
         p.rotary_dim % rotary_multiple == 0 && f.head_dim % 8 == 0;
}

template <typename T>
void launch_rotate(const KvCacheParams& p, const int32_t* lengths, T* q_rotated, cudaStream_t stream) {
  const dim3 grid(p.fwd.seqlen_q, p.fwd.batch);  // batch <= 65535: device_checks.h
  if (!rotary_vectors_fit(p)) {
    route_rotate_q_kernel<T><<<grid, kRotateThreads, 0, stream>>>(p, lengths, q_rotated);
  } else if (p.rotary_interleaved) {
    route_rotate_q_vec_kernel<T, true><<<grid, kRotateThreads, 0, stream>>>(p, lengths, q_rotated);
  } else {
    route_rotate_q_vec_kernel<T, false><<<grid, kRotateThreads, 0, stream>>>(p, lengths, q_rotated);
  }
}

}  // namespace

void launch_route_rotate_q(const KvCacheParams& p, const int32_t* lengths, void* q_rotated, cudaStream_t stream) {
  if (p.fwd.dtype == TILEATTN_FLOAT16) {
    launch_rotate(p, lengths, static_cast<__half*>(q_rotated), stream);
  } else {
    launch_rotate(p, lengths, static_cast<__nv_bfloat16*>(q_rotated), stream);
  }
  check_cuda(cudaGetLastError(), "KV-cache route rotary kernel launch");
}

}  // namespace tileattn::cuda::decode
