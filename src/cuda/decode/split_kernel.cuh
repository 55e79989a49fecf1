// The split-KV attention kernel of decoding.  Grid (batch x row blocks, KV heads, splits): one CTA
// takes the query rows of one KV group (H / Hk heads x seqlen_q rows, up to 16) against one
// split of that sequence's visible keys, so each K/V byte is read once per group.
//
// Tensor cores with the group's rows padded to m16: Q K^T is m16n8k16 over n8 key tiles, P V is
// m16n8k16 over 16 keys a step.  An FMA kernel would do the same math at 4 rows x 2 x 128 MACs per
// key on the CUDA cores; with 32 rows (8 heads per group x 4 speculative tokens) that is 8x more
// instructions per byte than the 4-row case, while the mma count does not change until 16 rows.
// Two streaming loops bring K and V in: straight into operand registers (register_loop.cuh) or
// through a TMA ring a warp (tma_block_loop.cuh, compute capability 9.0); cuda_decode.cu chooses.
// Warps take their key blocks round-robin and merge their (max, sum, O) through shared memory at
// the end in a fixed order (so a fixed num_splits gives the same bits at every batch size).
#pragma once

#include <math_constants.h>

#include <climits>
#include <type_traits>

#include "cuda/decode/append_kernel.cuh"
#include "cuda/decode/cluster_merge.cuh"
#include "cuda/decode/decode_args.h"
#include "cuda/decode/elements.cuh"
#include "cuda/decode/register_loop.cuh"
#include "cuda/decode/softmax_step.cuh"
#include "cuda/decode/tma_block_loop.cuh"
#include "cuda/decode/warp_merge.cuh"

namespace tileattn::cuda::decode {

// The warps' O merge in two halves (warps 0 + 2 into o[0], 1 + 3 into o[1]): two CTA barriers
// instead of one per warp, in a fixed order.  split_weight: the cluster merge's weight of each
// split's O (cluster_merge.cuh).  42 KB at D = 256, under the 48 KB of static shared memory.
// kSmemRows: the rows it holds (8 for the three-CTA ring, whose CTAs have at most 8: 9.1 KB at
// d128 instead of 21.7, so that three rings fit an SM, tma_block_loop.cuh); kQFrag: the register
// loop's Q fragments, which the TMA loops do not use (the other loops keep their layout as it was).
struct NoQFrag {};
template <int kD, int kSmemRows = kRows, bool kQFrag = true>
struct SplitSmem {
  std::conditional_t<kQFrag, uint4[kD / 16][32], NoQFrag> q_frag;  // Q as mma A fragments: [k16 step][lane]
  // o[0]: first the rotated Q rows in float; then the merged halves.  16-byte aligned for the float4
  // and staged-row reads (q_frag, when there, put it there already).
  alignas(16) float o[2][kSmemRows][kD + 4];
  float m[kWarps][kSmemRows], l[kWarps][kSmemRows];
  float row_max[kSmemRows], row_sum[kSmemRows], row_scale[kSmemRows];
  float split_weight[kMaxClusterSplits][kSmemRows];
  bool row_poisoned[kSmemRows];
};

// CTAs an SM the split kernel is built for (__launch_bounds__): its TMA ring's, or the register
// loop's three (one at d256).
template <typename T, int kD, int kTma>
constexpr int split_ctas_per_sm() {
  if constexpr (kTma != kLoopRegisters) return TmaRing<T, kD, kTma>::kCtasPerSm;
  return kD <= 128 ? 3 : 1;
}

// kHalves = 1 when a CTA has at most 8 query rows (GQA groups up to 8 with one new token: every
// group of the issue's 32 / 8 heads): the m16 tiles' rows 8..15 are padding, and dropping their
// accumulators (O, S, the row statistics) frees 36 registers a thread at D = 128.
// kTma (kLoopRegisters, kLoopRing, kLoopWideRing, kLoopRingThree): K and V arrive in shared memory
// by TMA, blocks of TmaRing::kKeys keys requested before the Q setup and kept TmaRing::kStages
// blocks ahead of each warp's math (tma_block_loop.cuh, TmaRing::kCtasPerSm CTAs an SM; the wide
// ring's blocks are twice as long); without it they go from global memory straight into registers,
// one 16-key chunk per warp at a time (3 CTAs an SM at d <= 128).  kPages (with kTma): a paged
// cache whose pages hold whole blocks, whose pages are read ahead (PageWindow, tma_block_loop.cuh).
template <typename T, int kD, int kHalves, int kTma, bool kPages = false, bool kNewToken = false>
__global__ void __launch_bounds__(kThreads, split_ctas_per_sm<T, kD, kTma>())
    split_kernel(const __grid_constant__ DecodeArgs args) {
  static_assert(kD % 64 == 0, "V vectors cover 64 dims per 8 lanes");
  static_assert(kHalves == 1 || kHalves == 2, "rows g, or rows g and g + 8");
  constexpr int kC = 2 * kHalves;  // accumulator floats per m16n8 tile a thread keeps
  static_assert(kTma != kLoopRingThree || (kHalves == 1 && kD == 128), "three CTAs an SM: d128, at most 8 rows");
  constexpr int kSmemRows = kTma == kLoopRingThree ? kRows / 2 : kRows;
  __shared__ SplitSmem<kD, kSmemRows, kTma != kLoopRingThree> sm;
  using Ring = TmaRing<T, kD, kTma>;
  Ring* ring = nullptr;
  if constexpr (kTma != kLoopRegisters) {
    extern __shared__ unsigned char tma_smem[];  // Ring::kUsedBytes + 1023: the 128-byte swizzle needs 1024-byte alignment
    ring = reinterpret_cast<Ring*>((reinterpret_cast<uintptr_t>(tma_smem) + 1023) & ~static_cast<uintptr_t>(1023));
  }
  const tileattn_kvcache_params& p = args.p;
  const tileattn_fwd_params& f = p.fwd;
  // Grid (KV heads x sequences x row blocks, splits), KV head fastest: CTAs launched together read
  // all heads of the same cache rows, whole 2 KB rows at 8 x d128 instead of a 256-byte slice of
  // each, which DRAM serves better when the grid runs in several waves (perf log, session 15).
  const int bx = args.heads_k_div.div(blockIdx.x), kv_head = blockIdx.x - bx * f.num_heads_k, split = blockIdx.y;
  const int b = args.row_blocks_div.div(bx), row0 = (bx - b * args.row_blocks) * kRows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int Sq = f.seqlen_q, D = f.head_dim;
  const int rows_here = min(kRows, args.rows - row0);
  // After the append kernel (TMA loop), the kernel ahead of this one is our append kernel, which
  // lets this one launch once each of its CTAs has waited for everything ahead of it to finish
  // (append_kernel.cuh).  It writes only the new positions [seqlen, seqlen + seqlen_new),
  // so all else this kernel reads (q, the index arrays, the rotary tables, the old positions) and
  // writes (out, lse, the partials the previous call's combine read) is settled: only a request of
  // a block that holds a new position waits for it (tma_request_block), and the kernel's last step
  // waits too, so this grid never ends before the append has.  Q's setup, the bounds and the first
  // requests then run under the append instead of after it.  With one new token the TMA kernel
  // appends it itself (kNewToken, below) and waits at its start as without an append.
  [[maybe_unused]] const bool after_append = kTma && !kNewToken && p.k_new != nullptr;  // read only on sm90
  // Work that reads no global memory an earlier kernel may write goes ahead of griddepcontrol.wait,
  // where it runs under the kernel ahead of this one when the CTA starts early: each warp's ring
  // barriers, and the two tensor maps (kernel parameters) fetched into the TMA unit's descriptor
  // cache, so the first requests, which wait for the sequence's bounds, do not also wait for them.
  if constexpr (kTma != kLoopRegisters) {
    if (lane == 0) {
      for (int i = 0; i < Ring::kStages; ++i) mbarrier_init(&ring->full[warp][i], 1);
      fence_barrier_init();
      if (warp == 0) prefetch_tensor_map(&args.tma_k), prefetch_tensor_map(&args.tma_v);
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Lets the combine kernel launch once every CTA of this grid has started (it then waits for
  // this grid to finish before reading anything; decode_launch.cuh).
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  // Otherwise, launched programmatically: nothing in global memory (the index arrays, q, the
  // cache, the partials the previous call's combine may still read) is touched before the kernel
  // ahead of this one in the stream has finished.  A no-op after an ordinary launch.
  if (!after_append) asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  // Local row r is query head kv_head * group + (row0 + r) / Sq, query row (row0 + r) % Sq.
  // (A FastDivisor: a runtime division is ~25 dependent instructions, and these sit on the way to
  // the first request and in the final stores.)
  auto head_of = [&](int r) { return kv_head * args.group + args.seqlen_q_div.div(row0 + r); };
  auto qrow_of = [&](int r) { return args.seqlen_q_div.mod(row0 + r); };
  // Q's loads first, before the sequence's bounds (which Q's addresses do not need) and before
  // the first K/V requests.  Issued after the requests, as they were until session 21, they
  // queued behind every CTA's first blocks (240 CTAs x 64 KB at 1 x 2k, the whole cache): the
  // timeline put 1.9 us (1 x 2k) to 3.9 us (8 x 2k) between the requests and Q in registers, with
  // the blocks already landed.  Issued first: 1 x 8k +3%, pages +4-5%, 8 x 2k +2% (perf log).
  // Then (the register loop, or rotary) Q goes into shared memory as float and is rotated pair by
  // pair at cache_seqlens (+ i when causal or windowed).  Eight elements a load, every load issued
  // before the first is used: Nsight Compute on 1 x 2k showed the element-by-element version (each
  // load behind its own branch) waiting out one memory latency per element, a quarter of the
  // kernel's time.
  constexpr int kQVectors = kRows * kD / 8 / kThreads;  // 2 at D = 128
  // Packed rows (cu_seqlens_q) place the sequence's rows in its last slots (query_slots): two
  // index loads ahead of Q's; the batch form reads nothing.  Worked out again for the stores at
  // the end rather than kept in registers through the block loop.
  const QuerySlots q_slots = query_slots(f, b);
  auto q_row = [&](int r, bool live) {
    return static_cast<const T*>(f.q) +
           (live ? q_slots.offset(qrow_of(r), head_of(r), f.q_batch_stride, f.q_row_stride, f.q_head_stride) : 0);
  };
  // The TMA loops without rotary take Q's A fragments (dims in natural order, the TMA loop's K
  // comes by ldmatrix) as 32-bit words straight from q: no staging in shared memory, no CTA
  // barrier and no conversions on the way to the first block (D == kD there, and vector_q makes
  // every word aligned).  Rotary needs the float rows, and the register loop its own order.
  // With the ring set up and the tensor maps prefetched before griddepcontrol.wait (above), this
  // took 1 x 2k-8k and 8 x 2k +1-1.5% (pages of 16 up to +4%), 12-16 x 2k +0.5% on an H100, the
  // rest level (bench/results/h100-decode-fixed-work-ab-2026-12-05-session57.txt).
  [[maybe_unused]] const bool q_direct = kTma != kLoopRegisters && p.rotary_cos == nullptr && args.vector_q;
  [[maybe_unused]] uint4 qa[kD / 16];
  uint4 q_vec[kQVectors];
  if (q_direct) {
#pragma unroll
    for (int c = 0; c < kD / 16; ++c) qa[c] = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int k = 0; k < kHalves; ++k) {
      const int r = g + 8 * k;
      const bool live = r < rows_here && q_slots.live(qrow_of(r));
      const uint32_t* q = reinterpret_cast<const uint32_t*>(q_row(r, live)) + t;  // word t: dims 2t, 2t + 1
#pragma unroll
      for (int c = 0; c < kD / 16; ++c) {  // dims 16c + 2t, +1 (word 8c + t) and 16c + 2t + 8, +9
        const uint32_t lo = live ? __ldg(q + 8 * c) : 0u, hi = live ? __ldg(q + 8 * c + 4) : 0u;
        (k == 0 ? qa[c].x : qa[c].y) = lo;
        (k == 0 ? qa[c].z : qa[c].w) = hi;
      }
    }
  } else {
#pragma unroll
    for (int k = 0; k < kQVectors; ++k) {
      const int e = threadIdx.x + k * kThreads, r = e / (kD / 8), d0 = e % (kD / 8) * 8;
      const bool live = r < rows_here && q_slots.live(qrow_of(r));
      q_vec[k] = load8(q_row(r, live), d0, D, args.vector_q, live);
    }
  }
  // The sequence's bounds after Q's loads.  Behind the direct path's sixteen loads a thread they
  // come back later (Nsight Compute at 12 x 2k: 27 stall samples at cache_seqlens' first use
  // against 11 before), but loaded first, with their checks, they held Q's loads back longer:
  // 1-2% slower at batch 1-16 (perf log, session 57).
  const SequenceKeys seq = sequence_keys(p, b);

  // This thread's rows g and g + 8, the keys [vis_lo, vis_hi] any row of the CTA sees and the keys
  // [common_lo, common_hi] every row sees.
  ScoreRules rules;
  rules.slope_log2[0] = rules.slope_log2[1] = 0.0f;
  int vis_lo = INT_MAX, vis_hi = -1, common_lo = INT_MIN, common_hi = INT_MAX;
  // Row row0 + r is query row (row0 + r) % Sq, so the first min(Sq, rows_here) rows already hold
  // every query row of the CTA, and the bounds over them are the bounds over all: one row_keys for
  // one new token, where a loop over all 16 rows (each with a runtime division, unrolled on the way
  // to the first K/V request) cost 3-8% at batch 1 (perf log, session 21).
  for (int r = 0; r < min(Sq, rows_here); ++r) {
    const RowKeys keys = seq.ok ? row_keys(f, seq, qrow_of(r)) : RowKeys{0, -1, 0};
    if (keys.lo <= keys.hi) vis_lo = min(vis_lo, keys.lo), vis_hi = max(vis_hi, keys.hi);
    common_lo = max(common_lo, keys.lo), common_hi = min(common_hi, keys.hi);
  }
  for (int k = 0; k < 2; ++k) {
    const int r = g + 8 * k;
    rules.mine[k] = seq.ok && r < rows_here ? row_keys(f, seq, qrow_of(r)) : RowKeys{0, -1, 0};
  }
  if (f.alibi_slopes) {
    for (int k = 0; k < 2; ++k) {
      if (g + 8 * k < rows_here) {
        rules.slope_log2[k] = f.alibi_slopes[b * f.alibi_batch_stride + head_of(g + 8 * k)] * kLog2e;
      }
    }
  }
  rules.scale = f.softcap > 0.0f ? f.softmax_scale / f.softcap : f.softmax_scale * kLog2e;
  rules.softcap_log2 = f.softcap * kLog2e;
  rules.softcap = f.softcap > 0.0f;
  rules.alibi = f.alibi_slopes != nullptr;

  // Chunks of kStep keys aligned to cache position 0 (so none straddles a page, page sizes being
  // multiples of 16), split evenly: 16-key chunks for the register loop, TmaRing::kKeys blocks for
  // the TMA loop.
  constexpr int kStep = kTma ? Ring::kKeys : kChunk;
  const int chunk0 = vis_lo <= vis_hi ? vis_lo / kStep * kStep : 0;
  const int num_chunks = vis_lo <= vis_hi ? (vis_hi - chunk0) / kStep + 1 : 0;
  const int per_split = (num_chunks + args.num_splits - 1) / args.num_splits;
  const int chunk_begin = split * per_split, chunk_end = min(num_chunks, chunk_begin + per_split);
  const BlockWalk walk{chunk0, chunk_begin, chunk_end, vis_lo, vis_hi, common_lo, common_hi, kv_head, b};
  // With TMA, each warp's lane 0 sets up its ring and requests its first blocks now, so their
  // latency runs under the Q setup below (Q's loads are already on their way).
  PageWindow pages{};
  WarpBlocks blocks{};
  T* const new_row_staging = reinterpret_cast<T*>(&sm.o[1][0][0]);  // o[1] is unused before the merge
  if constexpr (kTma != kLoopRegisters) {
    pages = open_page_window<Ring::kKeys, kPages>(args, seq, walk, warp, lane);
    int first_pages[Ring::kStages];
#pragma unroll
    for (int i = 0; i < Ring::kStages; ++i) first_pages[i] = pages.on ? window_page(pages, i) : 0;
    if (lane == 0) {
      for (int i = 0; i < Ring::kStages; ++i) {
        tma_request_block<Ring, kNewToken>(args, seq, walk, ring, warp, i, pages, first_pages[i]);
      }
    }
    __syncwarp();
    // One new token (kNewToken: no append kernel runs ahead of this one): the first row block's
    // first split of each KV head writes it into the cache, its loads under Q's.  No CTA of this
    // grid reads it from the cache: the warp whose last block holds it stages its row now and puts
    // it into that block's stage (tma_block_loop.cuh).  The kernels after this grid see the cache
    // written.
    if constexpr (kNewToken) {
      blocks = warp_blocks<Ring::kKeys>(seq, walk, warp);
      if (seq.ok && row0 == 0 && split == 0) {
        append_token<T, 1>(p, seq, b, 0, kv_head, kv_head + 1, threadIdx.x, kThreads);
      }
      if (blocks.last_new) stage_new_row<T, kD>(args, seq, walk, new_row_staging, lane);
    }
  }

  if (!q_direct) {  // uniform over the CTA
#pragma unroll
    for (int k = 0; k < kQVectors; ++k) {
      const int e = threadIdx.x + k * kThreads, r = e / (kD / 8), d0 = e % (kD / 8) * 8;
      const T* x = reinterpret_cast<const T*>(&q_vec[k]);
      if (kSmemRows == kRows || r < kSmemRows) {  // rows past kSmemRows are padding (kHalves = 1)
#pragma unroll
        for (int i = 0; i < 8; ++i) sm.o[0][r][d0 + i] = to_float(x[i]);
      }
    }
    __syncthreads();
  }
  if (p.rotary_cos != nullptr && seq.ok) {
    const bool per_row_position = rotary_position_per_row(f);
    const int half = p.rotary_dim / 2;
#pragma unroll 4
    for (int e = threadIdx.x; e < rows_here * half; e += kThreads) {
      const int r = e / half, j = e % half;
      const int2 pair = rotary_pair(p, j);
      const float2 cs = rotary_cos_sin<T>(p, static_cast<int64_t>(seq.seqlen) + (per_row_position ? qrow_of(r) : 0), j);
      const float xa = sm.o[0][r][pair.x], xb = sm.o[0][r][pair.y];
      sm.o[0][r][pair.x] = xa * cs.x - xb * cs.y;
      sm.o[0][r][pair.y] = xa * cs.y + xb * cs.x;
    }
    __syncthreads();
  }

  float o[kD / 8][kC] = {};
  float m[2] = {-CUDART_INF_F, -CUDART_INF_F}, l[2] = {0.0f, 0.0f};  // [1] unused when kHalves = 1
  if constexpr (kTma != kLoopRegisters) {
    if (!q_direct) {  // the same fragments from the (rotated) float rows
      const auto& qf = sm.o[0];
#pragma unroll
      for (int c = 0; c < kD / 16; ++c) {
        const int d = 16 * c + 2 * t;
        qa[c] = make_uint4(pack2<T>(qf[g][d], qf[g][d + 1]),
                           kHalves == 2 ? pack2<T>(qf[g + 8][d], qf[g + 8][d + 1]) : 0u,
                           pack2<T>(qf[g][d + 8], qf[g][d + 9]),
                           kHalves == 2 ? pack2<T>(qf[g + 8][d + 8], qf[g + 8][d + 9]) : 0u);
      }
    }
    tma_block_loop<Ring, kHalves, kNewToken>(args, seq, walk, ring, pages, rules, qa, o, m, l, blocks,
                                              new_row_staging);
  } else {
    for (int e = threadIdx.x; e < kD / 16 * 32; e += kThreads) {
      const int c = e / 32, fl = e % 32, fg = fl / 4, d = 32 * (c / 2) + 8 * (fl % 4) + 4 * (c % 2);
      const auto& qf = sm.o[0];
      sm.q_frag[c][fl] =
          make_uint4(pack2<T>(qf[fg][d], qf[fg][d + 1]), pack2<T>(qf[fg + 8][d], qf[fg + 8][d + 1]),
                     pack2<T>(qf[fg][d + 2], qf[fg][d + 3]), pack2<T>(qf[fg + 8][d + 2], qf[fg + 8][d + 3]));
    }
    __syncthreads();  // q_frag complete
    register_loop<T, kD, kHalves>(args, seq, walk, rules, sm.q_frag, o, m, l);
  }


  // Merge the warps: O = sum_w 2^(m_w - M) O_w, l = sum_w 2^(m_w - M) l_w, M = max_w m_w.
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    l[k] += __shfl_xor_sync(0xffffffffu, l[k], 1);
    l[k] += __shfl_xor_sync(0xffffffffu, l[k], 2);
  }
  // Rows g + 8 only where the shared memory keeps them (the three-CTA ring's CTAs have 8 rows).
  constexpr int kRowHalves = kSmemRows / 8;
  if (t == 0) {
    if constexpr (kRowHalves == 2) {
      sm.m[warp][g] = m[0], sm.m[warp][g + 8] = m[1];
      sm.l[warp][g] = l[0], sm.l[warp][g + 8] = l[1];
    } else {
      sm.m[warp][g] = m[0], sm.l[warp][g] = l[0];
    }
  }
  // The loops' O fragment orders (register_loop.cuh, tma_block_loop.cuh): o[j][e] is O in row
  // g + 8 (e / 2), dim o_dim(j, e).
  auto o_dim = [&](int j, int e) {
    return kTma ? 8 * j + 2 * t + (e & 1) : 64 * (j / 8) + 8 * (2 * t + (e & 1)) + j % 8;
  };
  // Four slots: with at most 8 rows (kHalves = 1) in 16 rows of shared memory, the four warps'
  // O fit side by side (o viewed as [4][8][kD + 4]), so each warp stores its O unscaled beside
  // its (m, l), and after one CTA barrier the threads that write the outputs weigh and sum them
  // (warp_merge.cuh) -- where the two-step merge takes three barriers.  Not where the cluster
  // merge reads o[0] + o[1] from its peers, nor while o may hold what other warps still read: the
  // new token's row staged in o[1] (kNewToken), or Q's float rows in o[0], which the TMA loops'
  // warps read after the staging barrier with no barrier after it (q_direct leaves o unused).
  constexpr bool kFourSlotsFit = kHalves == 1 && kSmemRows == kRows && !kNewToken;
  const bool four_slots = kFourSlotsFit && !(kTma && args.cluster_merge) && (kTma == kLoopRegisters || q_direct);
  auto& slot4 = *reinterpret_cast<float(*)[kWarps][8][kD + 4]>(&sm.o[0][0][0]);
  if (four_slots) {
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
#pragma unroll
      for (int e = 0; e < kC; ++e) slot4[warp][g][o_dim(j, e)] = o[j][e];  // kC = 2: row g only
    }
  }
  __syncthreads();
  if (!four_slots) {
    // Warps 2 and 3 store their scaled O into halves 0 and 1, then warps 0 and 1 add theirs: out
    // is (O_0 + O_2) + (O_1 + O_3), the same bits at every batch size for a fixed num_splits.
    static_assert(kWarps == 4, "two merge halves of two warps each");
    // Each thread needs only its own warp's weight, from its m (the value it stored in sm.m):
    // one exp2f, the same bits merged_row gives that warp.  The row sum, with all four weights,
    // is taken once a row, by warp 0's first thread.
    float weight[2];  // this warp's in rows g and g + 8; [1] unread with one row half (kC = 2)
#pragma unroll
    for (int k = 0; k < kRowHalves; ++k) {
      const int r = g + 8 * k;
      weight[k] = warp_weight(m[k], merged_max(sm, r));
      if (warp == 0 && t == 0) {
        const MergedRow row = merged_row(sm, r);
        sm.row_max[r] = row.max, sm.row_sum[r] = row.sum, sm.row_scale[r] = row.scale;
      }
    }
    auto merge = [&](bool add) {
#pragma unroll
      for (int j = 0; j < kD / 8; ++j) {
#pragma unroll
        for (int e = 0; e < kC; ++e) {
          merge_into_half(sm.o[warp % 2][g + 8 * (e / 2)][o_dim(j, e)], o[j][e], weight[e / 2], add);
        }
      }
    };
    if (warp >= 2) merge(false);
    __syncthreads();
    if (warp < 2) merge(true);
    __syncthreads();
  }
  // Row r's statistics (the weights with four slots only), and its merged O at dim d, from either
  // merge.
  auto row_stats = [&](int r) {
    return four_slots ? merged_row(sm, r) : MergedRow{sm.row_max[r], sm.row_sum[r], sm.row_scale[r], {}};
  };
  auto merged_o = [&](int r, int d, const MergedRow& stats) {
    if constexpr (kFourSlotsFit) {
      if (four_slots) return four_slot_sum(slot4, r, d, stats.weight);
    }
    return __fadd_rn(sm.o[0][r][d], sm.o[1][r][d]);
  };

  const QuerySlots slots = query_slots(f, b);  // where the outputs go
  // The splits of a cluster launch (args.cluster_merge: the TMA loop, 2-8 splits) merge in
  // distributed shared memory and write out and lse themselves; no partials, no combine kernel.
  if (kTma && args.cluster_merge) {
    merge_splits_in_cluster<T, kD>(args, sm, seq.ok, slots, rows_here, head_of, qrow_of);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (after_append) asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    return;
  }

  // out = O / l and lse = ln 2 (M + log2 l); a row that saw no key gets 0 and +inf (-inf for a
  // split's partial, which the combine skips); an invalid sequence gets NaN, and NaN scores (a NaN
  // input, a page that does not exist) NaN through the row sum.  Four dims a thread, a float4
  // store into the partials when D % 4 == 0.
  const bool final_output = args.num_splits == 1;
  const int64_t split_rows = static_cast<int64_t>(f.batch) * f.num_heads * Sq;
  constexpr int kQuads = kD / 4;  // the bucket's, so the row decode divides by a constant
  for (int e = threadIdx.x; e < rows_here * kQuads; e += kThreads) {
    const int r = e / kQuads, d0 = e % kQuads * 4, h = head_of(r), i = qrow_of(r);
    if (d0 >= D) continue;
    const MergedRow stats = row_stats(r);
    float x[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int d = d0 + c;  // < kD: kD is a multiple of 64
      x[c] = split_partial_o(seq.ok, stats.scale, merged_o(r, d, stats));
    }
    if (d0 == 0) {  // the row's first thread writes its LSE with the statistics it holds
      // A split's LSE is -inf when it saw no key; the output's +inf.
      const float lse = split_partial_lse(seq.ok, stats.max, stats.sum);
      if (!final_output) {
        args.lse_partial[split * split_rows + (static_cast<int64_t>(b) * f.num_heads + h) * Sq + i] = lse;
      } else if (slots.live(i)) {
        f.softmax_lse[slots.lse_offset(f, i, h)] = lse == -CUDART_INF_F ? CUDART_INF_F : lse;
      }
    }
    if (final_output) {
      if (!slots.live(i)) continue;
      T* out = static_cast<T*>(f.out) + slots.offset(i, h, f.out_batch_stride, f.out_row_stride, f.out_head_stride);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        if (d0 + c < D) out[d0 + c] = from_float<T>(x[c]);
      }
    } else {
      const int64_t row = split * split_rows + (static_cast<int64_t>(b) * f.num_heads + h) * Sq + i;
      float* partial = args.o_partial + row * D + d0;
      if (D % 4 == 0) {
        *reinterpret_cast<float4*>(partial) = make_float4(x[0], x[1], x[2], x[3]);
      } else {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          if (d0 + c < D) partial[c] = x[c];
        }
      }
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (after_append) asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

}  // namespace tileattn::cuda::decode
