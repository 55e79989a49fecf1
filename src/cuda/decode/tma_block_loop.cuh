// The split kernel's streaming loop with TMA staging (compute capability 9.0): each warp owns a
// ring of stages, each stage one block of kKeys keys of K and V brought in by TMA in 128-byte
// swizzled slabs, and reads its operands out of the stage with ldmatrix.
//
// What made it fast (docs/perf-log.md, session 15): the boxes are loaded with an L2 evict_first
// policy and no L2 promotion (tma_ring.cuh), worth 8-28%; next to that the loop is lean: operands
// come from ldmatrix in the mma fragment order (the first TMA loop used 16-byte shared loads and
// byte permutes, ~650 SASS instructions a 16-key step), a block every row sees whole skips the
// masking, and O is rescaled only when a row's running max moved.
//
// Stage layout: slab s (dims 64s .. 64s + 63) of a tile is kKeys rows of 128 bytes; the 16-byte
// column c of key j sits at column c ^ (j % 8) (TMA's 128-byte swizzle), so the 8 rows of one
// ldmatrix matrix (8 consecutive keys, one column) fall in 8 different bank groups.
#pragma once

#include <math_constants.h>

#include "cuda/decode/append_kernel.cuh"
#include "cuda/decode/decode_args.h"
#include "cuda/decode/elements.cuh"
#include "cuda/decode/softmax_step.cuh"
#include "cuda/decode/tma_ring.cuh"

namespace tileattn::cuda::decode {

// kLoop == kLoopWideRing (d128 only, `ring_chosen` in cuda_decode.cu): blocks of twice the keys,
// 16 KB of K and V a stage, 128 KB a CTA and one CTA an SM.  A warp's copies into shared memory
// arrive about one block at a time whatever their size (bench/gpu/sm_intake.cu), so 16 KB steps
// stream a CTA faster where one CTA an SM has the SM alone: the grids of at most one CTA an SM (12 x
// 2k +7% in session 39's branch, 24-64 x 2k -3 to -5%, where two CTAs an SM overlap each other's
// fixed costs).
// kLoop == kLoopRingThree (d128, at most 8 query rows): the narrow ring at three CTAs an SM, for
// grids that two CTAs an SM would leave uneven (cuda_decode.cu says which).  Three 64 KB rings fit
// the SM's 228 KB only beside a static part trimmed to 8 rows (split_kernel.cuh's SplitSmem: 9.1
// KB instead of 21.7); the dynamic part, sized by kUsedBytes rather than sizeof
// (split_dynamic_smem), then leaves ~3 KB an SM to spare instead of ~0.4.
template <typename T, int kD, int kLoop = kLoopRing>
struct TmaRing {
  static constexpr bool kWide = kLoop == kLoopWideRing;
  using Elem = T;
  static constexpr int kDim = kD;
  static constexpr int kKeys = tma_block_keys(kD, kWide);  // d64 32, d128 16 (wide 32), d256 16 keys
  // 2 stages a warp, 4 warps: 64 KB a CTA and two CTAs an SM up to d128 (so one CTA's start and
  // end overlap the other's streaming: +2-7% over one CTA with 3 stages of twice the keys,
  // perf log); d256 and the wide ring: 128 KB, one CTA.
  static constexpr int kStages = 2;
  static constexpr int kCtasPerSm = kLoop == kLoopRingThree ? 3 : kD <= 128 && !kWide ? 2 : 1;
  static constexpr int kSlabs = kD / 64;
  static constexpr int kSlabBytes = kKeys * 128;
  static constexpr int kTileBytes = kSlabs * kSlabBytes;
  alignas(1024) unsigned char k[kWarps][kStages][kTileBytes];
  alignas(1024) unsigned char v[kWarps][kStages][kTileBytes];
  uint64_t full[kWarps][kStages];
  // The bytes the members span (k, v and full back to back: kTileBytes is a multiple of 1024);
  // sizeof adds up to 1 KB of tail padding for the alignment, which nothing reads.
  static constexpr int kUsedBytes = 2 * kWarps * kStages * kTileBytes + kWarps * kStages * 8;
};

// The page (or cache entry) of cache position pos, and whether it is a page that exists.  The page
// index comes from page_div's multiply-shift, like the page window's (page_ahead), not from a
// runtime division (~25 dependent instructions on lane 0's path to the request).
__device__ __forceinline__ int64_t position_unit(const DecodeArgs& args, const SequenceKeys& seq, int pos, bool& ok) {
  const tileattn_kvcache_params& p = args.p;
  if (p.block_table == nullptr) {
    ok = true;
    return seq.row;
  }
  const int64_t unit = p.block_table[seq.row * p.block_table_batch_stride + args.page_div.div(pos)];
  ok = unit >= 0 && unit < p.num_blocks;
  return unit;
}

// Whether the box of `box` keys from `start` holds a key of [vis_lo, vis_hi].  Only such boxes have
// their page looked up: a box past the sequence's end can lie past its last block-table entry (d64:
// 32-key blocks over pages of 16), even past the table's row.
__device__ __forceinline__ bool box_visible(const BlockWalk& w, int start, int box) {
  return start <= w.vis_hi && start + box - 1 >= w.vis_lo;
}

// The pages of a warp's blocks, read from block_table 32 blocks ahead of their use, when each block
// lies in one page (a paged cache whose pages hold whole blocks: args.tma_box_keys == kKeys, every
// paged call under TILEATTN_DECODE_FAMILY=auto).  `on` is the split kernel's compile-time kPages:
// as a runtime flag the window's code cost the contiguous cache 1-3% at batch 1 (session 23).
// Lane l of `cur` holds the page of the warp's block first + l (its i-th block being w.begin +
// warp + i * kWarps), lane l of `next` that of first + 32 + l; -1 for a block past the split or with
// no visible key.  Without it, lane 0 read the table right before each request, a dependent load on
// the path to the TMA issue (a new 128-byte table line every 8 requests of a warp at pages of 16),
// and every lane read it again after the wait: pages of 16 were 2-9% under the contiguous cache in
// sweep v10, 1-7% with the window (v11).
struct PageWindow {
  bool on;
  int first, cur, next;
};

template <int kKeys>
__device__ __forceinline__ int page_ahead(const DecodeArgs& args, const SequenceKeys& seq, const BlockWalk& w, int warp,
                                          int i) {
  const int block = w.begin + warp + i * kWarps;
  const int pos0 = w.base + block * kKeys;
  if (block >= w.end || !box_visible(w, pos0, kKeys)) return -1;
  return args.p.block_table[seq.row * args.p.block_table_batch_stride + args.page_div.div(pos0)];
}

template <int kKeys, bool kOn>
__device__ __forceinline__ PageWindow open_page_window(const DecodeArgs& args, const SequenceKeys& seq,
                                                       const BlockWalk& w, int warp, int lane) {
  PageWindow pw{kOn, 0, -1, -1};
  if (pw.on) {
    pw.cur = page_ahead<kKeys>(args, seq, w, warp, lane);
    pw.next = page_ahead<kKeys>(args, seq, w, warp, 32 + lane);
  }
  return pw;
}

// Before the warp's block i is read (i warp-uniform, rising by one): once i leaves `cur`, the
// window moves on by 32 blocks and the table load of the new `next` starts.
template <int kKeys>
__device__ __forceinline__ void advance_page_window(PageWindow& pw, const DecodeArgs& args, const SequenceKeys& seq,
                                                    const BlockWalk& w, int warp, int lane, int i) {
  if (!pw.on || i - pw.first < 32) return;
  pw.first += 32;
  pw.cur = pw.next;
  pw.next = page_ahead<kKeys>(args, seq, w, warp, pw.first + 32 + lane);
}

// The page of the warp's block i, first <= i < first + 64, to every lane (all 32 call it, i
// warp-uniform).  `next` is read only once i reaches it, so its table load has 30 blocks' time
// to land before anything waits on it.
__device__ __forceinline__ int window_page(const PageWindow& pw, int i) {
  const int offset = i - pw.first;
  if (offset < 32) return __shfl_sync(0xffffffffu, pw.cur, offset);
  return __shfl_sync(0xffffffffu, pw.next, offset - 32);
}

// The page of the box of keys from pos, and whether it exists: from the window when it is on (the
// window's page of this block), else from block_table.
__device__ __forceinline__ int64_t box_unit(const DecodeArgs& args, const SequenceKeys& seq, int pos,
                                            const PageWindow& pw, int page, bool& ok) {
  if (!pw.on) return position_unit(args, seq, pos, ok);
  ok = page >= 0 && page < args.p.num_blocks;
  return page;
}

// Keys a TMA box of the warp's blocks covers: with the page window the whole block (launch_ring
// takes the window only where args.tma_box_keys == kKeys), a constant, so the page check's box loop
// is one step; else the runtime box.
template <int kKeys>
__device__ __forceinline__ int block_box_keys(const PageWindow& pw, const DecodeArgs& args) {
  return pw.on ? kKeys : args.tma_box_keys;
}

// Issue a box's K and V copies, slab by slab (64 columns a slab), into the stage at byte `offset`
// of each slab (j * 128 for the box from key j of the block), for the key at `pos` on page `unit`.
// The key's row in its page is a multiply and a shift (page_div) instead of a runtime division.
template <typename Ring>
__device__ __forceinline__ void tma_copy_box(const DecodeArgs& args, const BlockWalk& w, Ring* ring, int warp,
                                             int stage, uint64_t* bar, int pos, int64_t unit, int offset) {
  const int row = args.p.block_table ? args.page_div.mod(pos) : pos;
  const uint64_t policy = l2_evict_first_policy();
#pragma unroll
  for (int s = 0; s < Ring::kSlabs; ++s) {
    tma_load_4d(&args.tma_k, ring->k[warp][stage] + (s * Ring::kSlabBytes + offset), bar, 64 * s, w.kv_head, row,
                static_cast<int>(unit), policy);
    tma_load_4d(&args.tma_v, ring->v[warp][stage] + (s * Ring::kSlabBytes + offset), bar, 64 * s, w.kv_head, row,
                static_cast<int>(unit), policy);
  }
}

// Lane 0's request of a block that is one TMA box: a contiguous cache (args.tma_box_keys == kKeys,
// cuda_decode.cu) or pages read through the window (pages of whole blocks).  The general path
// below loops over boxes of the runtime args.tma_box_keys and looks each one's page up in
// block_table: ~146 SASS lines a request in the wide kernel, issued as a warp's even with one lane
// active, about a fifth of a 32-key step.  One box: one visibility test, one page check, four
// copies at d128, ~98 lines (session 60, H200: contiguous caches +0.1-1.8%, pages level; 7% fewer
// instructions at 12 x 2k bought nothing there, so those warps do not wait on issue).
template <typename Ring>
__device__ __forceinline__ void tma_request_whole_block(const DecodeArgs& args, const SequenceKeys& seq,
                                                        const BlockWalk& w, Ring* ring, int warp, int stage, int pos0,
                                                        const PageWindow& pw, int page, uint64_t* bar) {
  bool ok = false;
  const int64_t unit = box_visible(w, pos0, Ring::kKeys) ? box_unit(args, seq, pos0, pw, page, ok) : 0;
  fence_proxy_async();  // the warp's reads (and edge fills) of this stage before TMA rewrites it
  if (!ok) {
    mbarrier_arrive(bar);
    return;
  }
  mbarrier_arrive_expect_tx(bar, 2 * Ring::kSlabs * Ring::kKeys * 128);
  tma_copy_box(args, w, ring, warp, stage, bar, pos0, unit, 0);
}

// Lane 0: request the warp's i-th block into stage i % kStages (`page`: window_page(pw, i), which
// all lanes computed).  Boxes of args.tma_box_keys keys wholly outside [vis_lo, vis_hi] or on a page
// that does not exist are skipped (the consumer fills their rows); the barrier expects the bytes of
// the boxes requested.
template <typename Ring, bool kNewToken>
__device__ __forceinline__ void tma_request_block(const DecodeArgs& args, const SequenceKeys& seq, const BlockWalk& w,
                                                  Ring* ring, int warp, int i, const PageWindow& pw, int page) {
  const int block = w.begin + warp + i * kWarps;
  if (block >= w.end) return;
  const int stage = i % Ring::kStages, pos0 = w.base + block * Ring::kKeys;
  const tileattn_kvcache_params& p = args.p;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // A block holding a position the append kernel writes is requested once that kernel has
  // finished (split_kernel.cuh, "after an append"); returns at once when it has.
  if (!kNewToken && p.k_new != nullptr && pos0 + Ring::kKeys > seq.seqlen) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
  }
#endif
  uint64_t* bar = &ring->full[warp][stage];
  if (pw.on || p.block_table == nullptr) {
    tma_request_whole_block<Ring>(args, seq, w, ring, warp, stage, pos0, pw, page, bar);
    return;
  }
  // Pages smaller than the block, without the window: boxes of gcd(block, page size) keys, each
  // one's page looked up in block_table.
  const int box = args.tma_box_keys;
  uint32_t bytes = 0;
  for (int j = 0; j < Ring::kKeys; j += box) {
    bool ok = false;
    if (box_visible(w, pos0 + j, box)) position_unit(args, seq, pos0 + j, ok);
    if (ok) bytes += 2 * Ring::kSlabs * box * 128;
  }
  fence_proxy_async();  // the warp's reads (and edge fills) of this stage before TMA rewrites it
  if (bytes == 0) {
    mbarrier_arrive(bar);
    return;
  }
  mbarrier_arrive_expect_tx(bar, bytes);
  for (int j = 0; j < Ring::kKeys; j += box) {
    if (!box_visible(w, pos0 + j, box)) continue;
    bool ok;
    const int64_t unit = position_unit(args, seq, pos0 + j, ok);
    if (!ok) continue;
    tma_copy_box(args, w, ring, warp, stage, bar, pos0 + j, unit, j * 128);
  }
}

// Byte offset in a tile of the 16-byte column `col` (of kD / 8) of key `key`.
template <int kKeys>
__device__ __forceinline__ uint32_t tile_offset(int key, int col) {
  return (col / 8) * (kKeys * 128) + key * 128 + (((col % 8) ^ (key % 8)) << 4);
}

// A block's rows no box brought in.  Keys outside [vis_lo, vis_hi]: V rows become zero (their P is
// 0, and stale shared memory could hold NaN, 0 x NaN = NaN); K rows stay stale, their scores are
// masked to -inf by selection.  Visible keys on a page that does not exist: K and V rows become
// NaN, so the scores are NaN and the row sum l with them (the warp merge keeps a NaN l), and the
// rows' O and LSE come out NaN (loud, not out of bounds), as in the register loop.  NaN V alone
// would leave the LSE finite.
template <typename Ring>
__device__ __forceinline__ void fill_unloaded_rows(const DecodeArgs& args, const SequenceKeys& seq, const BlockWalk& w,
                                                   unsigned char* k_tile, unsigned char* v_tile, int pos0,
                                                   int lane) {
  using T = typename Ring::Elem;
  constexpr int kCols = Ring::kDim / 8;
  for (int e = lane; e < Ring::kKeys * kCols; e += 32) {
    const int key = e / kCols, col = e % kCols, pos = pos0 + key;
    const int box_start = pos0 + key / args.tma_box_keys * args.tma_box_keys;
    const uint32_t offset = tile_offset<Ring::kKeys>(key, col);
    if (pos < w.vis_lo || pos > w.vis_hi) {
      *reinterpret_cast<uint4*>(v_tile + offset) = make_uint4(0, 0, 0, 0);
      continue;
    }
    bool ok;
    position_unit(args, seq, box_start, ok);
    if (!ok) {
      const uint4 nan = make_uint4(kNanPair<T>, kNanPair<T>, kNanPair<T>, kNanPair<T>);
      *reinterpret_cast<uint4*>(k_tile + offset) = nan;
      *reinterpret_cast<uint4*>(v_tile + offset) = nan;
    }
  }
  fence_proxy_async();
  __syncwarp();
}

// One new token taken by the split kernel (kNewToken, split_kernel.cuh).  The warp whose last block
// holds it (below) stages its row before the loop, K rotated as append_token rotates it and V as
// given, kD values each (T) at `staging`, and copies that into the block's stage once the TMA has
// filled it: the cache's slot, which the writer CTA (split_kernel.cuh) may not have written yet,
// brought whatever it held.  Staged in the prologue, the loads of k_new/v_new and the rotary tables
// run under the first requests and hold no registers in the loop.  `rotated` rounds each product and
// the difference on its own (no FMA contraction, which could differ between its two call sites), so
// the attention sees the bits the cache gets.
struct WarpBlocks {
  int count;      // blocks begin + warp + i kWarps below end
  bool last_new;  // the last of them holds the one new token the split kernel takes itself
};

template <int kKeys>
__device__ __forceinline__ WarpBlocks warp_blocks(const SequenceKeys& seq, const BlockWalk& w, int warp) {
  const int count = w.end > w.begin + warp ? (w.end - w.begin - warp + kWarps - 1) / kWarps : 0;
  const int last_pos0 = w.base + (w.begin + warp + (count - 1) * kWarps) * kKeys;
  // The new position seqlen is the last key any row sees, so the block that holds it is the last of
  // the walk, and the last of its warp's.
  return {count, count > 0 && last_pos0 + kKeys > seq.seqlen};
}

template <typename T, int kD>
__device__ __forceinline__ void stage_new_row(const DecodeArgs& args, const SequenceKeys& seq, const BlockWalk& w,
                                              T* staging, int lane) {
  const tileattn_kvcache_params& p = args.p;
  const int64_t pos = seq.seqlen;
  const T* k_row = new_row<T>(p.k_new, p.k_new_batch_stride, 0, p.k_new_head_stride, w.sequence, 0, w.kv_head);
  const T* v_row = new_row<T>(p.v_new, p.v_new_batch_stride, 0, p.v_new_head_stride, w.sequence, 0, w.kv_head);
  constexpr int kPerLane = kD / 32;
  RotaryInputs<T> k[kPerLane];
  T v[kPerLane];
#pragma unroll
  for (int u = 0; u < kPerLane; ++u) {
    const int d = lane + 32 * u;
    k[u] = load_rotary_inputs(p, k_row, d, pos);
    v[u] = v_row[d];
  }
#pragma unroll
  for (int u = 0; u < kPerLane; ++u) {
    const int d = lane + 32 * u;
    staging[d] = from_float<T>(rotated(k[u]));
    staging[kD + d] = v[u];
  }
  __syncwarp();
}

template <typename Ring, typename T = typename Ring::Elem, int kD = Ring::kDim>
__device__ __forceinline__ void copy_new_row(const DecodeArgs& args, const SequenceKeys& seq, const BlockWalk& w,
                                             const T* staging, unsigned char* k_tile, unsigned char* v_tile, int pos0,
                                             int lane) {
  constexpr int kCols = kD / 8;  // 16-byte columns of a row; kD == head_dim on the TMA path
  const int pos = seq.seqlen, key = pos - pos0;
  // Visible only (fill_unloaded_rows zeroed V outside [vis_lo, vis_hi], as 0 x NaN would be NaN);
  // on a page that does not exist the row keeps fill_unloaded_rows' NaN, as append_token skips it.
  bool ok = pos >= w.vis_lo && pos <= w.vis_hi;
  if (ok) position_unit(args, seq, pos0 + key / args.tma_box_keys * args.tma_box_keys, ok);
  if (ok && lane < kCols) {
    const uint32_t offset = tile_offset<Ring::kKeys>(key, lane);
    *reinterpret_cast<uint4*>(k_tile + offset) = reinterpret_cast<const uint4*>(staging)[lane];
    *reinterpret_cast<uint4*>(v_tile + offset) = reinterpret_cast<const uint4*>(staging + kD)[lane];
  }
  __syncwarp();
}

// The warp's i-th block: S = Q K^T, the online softmax, O += P V (FA2 eq. 5, softmax_step.cuh),
// then the request of its (i + kStages)-th.  kNewRow: the block holds the new token the split kernel
// takes itself, staged at `staging` (copy_new_row).  qa: Q's A fragments for the kD / 16 k-steps,
// dims in natural order.  o[n][e] is O for row g + 8 (e / 2), dim 8n + 2t + (e & 1).
template <typename Ring, int kHalves, bool kNewToken, bool kNewRow, typename T = typename Ring::Elem,
          int kD = Ring::kDim>
__device__ __forceinline__ void tma_block_step(const DecodeArgs& args, const SequenceKeys& seq, const BlockWalk& w,
                                               Ring* ring, PageWindow& pw, const ScoreRules& rules,
                                               const uint4 (&qa)[kD / 16], float (&o)[kD / 8][2 * kHalves],
                                               float (&m)[2], float (&l)[2], int i, const T* staging) {
  constexpr int kKeys = Ring::kKeys, kC = 2 * kHalves;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4;
  const int quad = lane / 8, row8 = lane % 8;  // this lane's ldmatrix row: matrix `quad`, row `row8`
  const int block = w.begin + warp + i * kWarps;
  const int stage = i % Ring::kStages, pos0 = w.base + block * kKeys;
  advance_page_window<kKeys>(pw, args, seq, w, warp, lane, i);
  const int page = pw.on ? window_page(pw, i) : 0;
  const int ahead_page = pw.on ? window_page(pw, i + Ring::kStages) : 0;
  mbarrier_wait(&ring->full[warp][stage], (i / Ring::kStages) & 1);
  const bool inside = pos0 >= w.vis_lo && pos0 + kKeys - 1 <= w.vis_hi;
  if (!inside || args.p.block_table != nullptr) {
    bool all_pages = true;
    const int box = block_box_keys<kKeys>(pw, args);
    for (int j = 0; j < kKeys && args.p.block_table; j += box) {
      bool ok = true;
      if (box_visible(w, pos0 + j, box)) box_unit(args, seq, pos0 + j, pw, page, ok);
      all_pages = all_pages && ok;
    }
    if (!inside || !all_pages) {
      fill_unloaded_rows<Ring>(args, seq, w, ring->k[warp][stage], ring->v[warp][stage], pos0, lane);
    }
  }
  if constexpr (kNewRow) {
    copy_new_row<Ring>(args, seq, w, staging, ring->k[warp][stage], ring->v[warp][stage], pos0, lane);
  }
  const uint32_t k_tile = smem_address(ring->k[warp][stage]);
  const uint32_t v_tile = smem_address(ring->v[warp][stage]);

  // S = Q K^T.  One ldmatrix.x4 per 16 keys and k16 step: matrices (keys +0..7, dims +0..7),
  // (+0..7, +8..15), (+8..15, +0..7), (+8..15, +8..15) are b0, b1 of key tile 2np and of 2np + 1.
  float s[kKeys / 8][kC] = {};
#pragma unroll
  for (int c = 0; c < kD / 16; ++c) {
#pragma unroll
    for (int np = 0; np < kKeys / 16; ++np) {
      uint32_t b[4];
      ldmatrix_x4(b, k_tile + tile_offset<kKeys>(16 * np + 8 * (quad / 2) + row8, 2 * c + quad % 2));
      mma_16816<T>(s[2 * np], qa[c], b[0], b[1]);
      mma_16816<T>(s[2 * np + 1], qa[c], b[2], b[3]);
    }
  }

  const bool plain = !rules.softcap && !rules.alibi && pos0 >= w.common_lo && pos0 + kKeys - 1 <= w.common_hi;
  float alpha[2];
  const float m_old[2] = {m[0], m[1]};
  softmax_step(s, pos0, t, rules, plain, m, l, alpha);
  // Rescale O only when some row of the warp has a new max (rare once a row has seen a few
  // blocks: 16 FMULs a thread a key tile skipped).
  bool moved = false;
#pragma unroll
  for (int k = 0; k < kHalves; ++k) moved = moved || m[k] != m_old[k];
  if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) {
#pragma unroll
      for (int e = 0; e < kC; ++e) o[n][e] *= alpha[e / 2];
    }
  }

  // O += P V, 16 keys a step: P's C fragments of key tiles 2j, 2j + 1 are the A fragment as they
  // stand; ldmatrix.trans matrices (keys +0..7, dims +0..7), (+8..15, +0..7), (+0..7, +8..15),
  // (+8..15, +8..15) are b0, b1 of dim tile 2p and of 2p + 1.
#pragma unroll
  for (int j = 0; j < kKeys / 16; ++j) {
    const auto& s0 = s[2 * j];
    const auto& s1 = s[2 * j + 1];
    const uint4 pa = kHalves == 2 ? make_uint4(pack2<T>(s0[0], s0[1]), pack2<T>(s0[kC - 2], s0[kC - 1]),
                                               pack2<T>(s1[0], s1[1]), pack2<T>(s1[kC - 2], s1[kC - 1]))
                                  : make_uint4(pack2<T>(s0[0], s0[1]), 0u, pack2<T>(s1[0], s1[1]), 0u);
#pragma unroll
    for (int pd = 0; pd < kD / 16; ++pd) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, v_tile + tile_offset<kKeys>(16 * j + 8 * (quad % 2) + row8, 2 * pd + quad / 2));
      mma_16816<T>(o[2 * pd], pa, b[0], b[1]);
      mma_16816<T>(o[2 * pd + 1], pa, b[2], b[3]);
    }
  }
  __syncwarp();  // every lane's ldmatrix of this stage has returned (their values fed the mmas)
  if (lane == 0) tma_request_block<Ring, kNewToken>(args, seq, w, ring, warp, i + Ring::kStages, pw, ahead_page);
}

// The warp's blocks.  With one new token taken by the split kernel (kNewToken), the one that holds
// it (WarpBlocks::last_new) has its step peeled off the loop: inside it, as a branch, the new row's
// code raised the loop's registers from 182 to 212 at d128 and cost calls without an append 1.5-6%
// (perf log, session 30), and kernels without kNewToken keep their loop as it was.
template <typename Ring, int kHalves, bool kNewToken, typename T = typename Ring::Elem, int kD = Ring::kDim>
__device__ __forceinline__ void tma_block_loop(const DecodeArgs& args, const SequenceKeys& seq, const BlockWalk& w,
                                               Ring* ring, PageWindow& pw, const ScoreRules& rules,
                                               const uint4 (&qa)[kD / 16], float (&o)[kD / 8][2 * kHalves],
                                               float (&m)[2], float (&l)[2], const WarpBlocks& blocks,
                                               const T* staging) {
  if constexpr (!kNewToken) {
    const int warp = threadIdx.x / 32;
    for (int i = 0; w.begin + warp + i * kWarps < w.end; ++i) {
      tma_block_step<Ring, kHalves, false, false>(args, seq, w, ring, pw, rules, qa, o, m, l, i, staging);
    }
  } else {
    const int plain = blocks.count - (blocks.last_new ? 1 : 0);
    for (int i = 0; i < plain; ++i) {
      tma_block_step<Ring, kHalves, true, false>(args, seq, w, ring, pw, rules, qa, o, m, l, i, staging);
    }
    if (blocks.last_new) {
      tma_block_step<Ring, kHalves, true, true>(args, seq, w, ring, pw, rules, qa, o, m, l, plain, staging);
    }
  }
}

}  // namespace tileattn::cuda::decode
