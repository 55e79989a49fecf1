// The split-KV attention kernel of decoding.  Grid (batch x row blocks, KV heads, splits): one CTA
// takes the query rows of one KV group (H / Hk heads x seqlen_q rows, up to 16) against one
// split of that sequence's visible keys, so each K/V byte is read once per group.
//
// Tensor cores with the group's rows padded to m16: Q K^T is m16n8k16 over two n8 key tiles, P V
// is m16n8k16 over the 16 keys.  An FMA kernel would do the same math at 4 rows x 2 x 128 MACs
// per key on the CUDA cores; with 32 rows (8 heads per group x 4 speculative tokens) that is 8x
// more instructions per byte than the 4-row case, while the mma count does not change until 16
// rows.  Both permutation tricks below let K and V go from global memory straight into operand
// registers in 16-byte vectors, with no shared-memory staging:
//   - Q K^T sums over the head dim, so the dim order inside a k16 step is free: thread (g, t)
//     loads the 16-byte vectors at dims 32v + 8t of key g (v < D/32, 4 vectors at D = 128), so
//     for each v a quad reads 64 contiguous bytes, whole 32-byte sectors (a thread reading dims
//     [t D/4, (t+1) D/4) touched each sector in two instructions: twice the L1 requests), and
//     step c uses elements 4(c%2)..4(c%2)+3 of vector c/2.  Q's fragments (built once, in shared
//     memory) follow the same order.
//   - P V's n8 output tiles can take any 8 dims: tile 8h + e holds dims 64h + 8n + e, so thread
//     (g, t) loads one 16-byte vector (dims 64h + 8g ..) of each of its keys 2t, 2t+1, 2t+8, 2t+9
//     and pairs keys with a byte permute.
// Warps take 16-key chunks round-robin and merge their (max, sum, O) through shared memory at the
// end in a fixed order (so a fixed num_splits gives the same bits at every batch size).  Bytes in
// flight: up to 3 CTAs x 4 warps x 8 KB of registers per SM at D = 128.  Page indices are loaded
// two chunks ahead, so a page of 16 costs one cached 4-byte load off the critical path.
// docs/perf-log.md has the alternatives measured against this on the H200: a 3-stage cp.async
// pipeline (2.2 TB/s where these register loads reach 3.9, 32 x 32k) and an L2 prefetch of each
// warp's next chunk (about 10% slower).
#pragma once

#include <math_constants.h>

#include <climits>

#include "cuda/decode/append_kernel.cuh"
#include "cuda/decode/decode_args.h"
#include "cuda/decode/elements.cuh"
#include "cuda/decode/tma_ring.cuh"

namespace tileattn::cuda::decode {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The warps' O merge in two halves (warps 0 + 2 into o[0], 1 + 3 into o[1]): two CTA barriers
// instead of one per warp, in a fixed order.  41 KB at D = 256, under the 48 KB of static shared
// memory.
template <int kD>
struct SplitSmem {
  uint4 q_frag[kD / 16][32];    // Q as mma A fragments: [k16 step][lane]
  float o[2][kRows][kD + 4];    // o[0]: first the rotated Q rows in float; then the merged halves
  float m[kWarps][kRows], l[kWarps][kRows];
  float row_max[kRows], row_sum[kRows], row_scale[kRows];
};

// With TMA (compute capability 9.0): each warp's ring of K and V chunk tiles (16 keys x kD, dense
// rows, as the tensor map's box lands them) and one transaction barrier per stage.  16 KB of
// stages a warp at d <= 128 (d64 4, d128 2), two CTAs (8 warps) an SM; d256 keeps 2 stages and one
// CTA.  Measured on the H200 (perf log): 2-17% faster than the register kernel for caches of
// 2k-8k keys at every batch and for a single sequence (1 x 32k +10%), 4-6% slower for long caches
// at batch 8-32, where the register kernel's 12 warps an SM stream faster (a first version with
// one CTA of 4 warps an SM and 5 stages was 15-25% slower everywhere); cuda_decode.cu chooses.
template <typename T, int kD>
struct TmaStages {
  static constexpr int kCtasPerSm = kD <= 128 ? 2 : 1;
  static constexpr int kStages = kD == 64 ? 4 : 2;
  static constexpr int kTileElems = kChunk * kD;
  static constexpr uint32_t kStageBytes = 2 * kTileElems * sizeof(T);  // K and V
  alignas(128) T k[kWarps][kStages][kTileElems];
  alignas(128) T v[kWarps][kStages][kTileElems];
  uint64_t full[kWarps][kStages];
};

// The visible cache positions [lo, hi] of query row i (of Sq), bottom-right aligned over the
// sequence's keys [first, end): row i's diagonal is key end - Sq + i.
struct RowKeys {
  int lo, hi, diagonal;
};

__device__ __forceinline__ RowKeys row_keys(const tileattn_fwd_params& f, const SequenceKeys& seq, int i) {
  const int64_t diagonal = static_cast<int64_t>(i) + seq.end - f.seqlen_q;
  int64_t lo = seq.first, hi = static_cast<int64_t>(seq.end) - 1;
  if (f.window_left >= 0 && diagonal - f.window_left > lo) lo = diagonal - f.window_left;
  if (f.window_right >= 0 && diagonal + f.window_right < hi) hi = diagonal + f.window_right;
  return RowKeys{static_cast<int>(lo), static_cast<int>(hi), static_cast<int>(diagonal)};
}

// kHalves = 1 when a CTA has at most 8 query rows (GQA groups up to 8 with one new token: every
// group of the issue's 32 / 8 heads): the m16 tiles' rows 8..15 are padding, and dropping their
// accumulators (O, S, the row statistics) frees 36 registers a thread at D = 128.
// kTma: K and V arrive in shared memory by TMA, requested before the Q setup and kept
// TmaStages::kStages chunks ahead of each warp's math (TmaStages::kCtasPerSm CTAs an SM); without
// it they go from global memory straight into registers, one chunk per warp at a time (3 CTAs an
// SM at d <= 128).
template <typename T, int kD, int kHalves, bool kTma>
__global__ void __launch_bounds__(kThreads, kTma ? TmaStages<T, kD>::kCtasPerSm : kD <= 128 ? 3 : 1)
    split_kernel(const __grid_constant__ DecodeArgs args) {
  static_assert(kD % 64 == 0, "V vectors cover 64 dims per 8 lanes");
  static_assert(kHalves == 1 || kHalves == 2, "rows g, or rows g and g + 8");
  constexpr bool kLateV = kD > 128;
  constexpr int kC = 2 * kHalves;  // accumulator floats per m16n8 tile a thread keeps
  __shared__ SplitSmem<kD> sm;
  using Stages = TmaStages<T, kD>;
  Stages* st = nullptr;
  if constexpr (kTma) {
    extern __shared__ unsigned char tma_smem[];  // sizeof(Stages) + 128: aligned here for TMA
    st = reinterpret_cast<Stages*>((reinterpret_cast<uintptr_t>(tma_smem) + 127) & ~static_cast<uintptr_t>(127));
  }
  const tileattn_kvcache_params& p = args.p;
  const tileattn_fwd_params& f = p.fwd;
  const int b = blockIdx.x / args.row_blocks, row0 = blockIdx.x % args.row_blocks * kRows;
  const int kv_head = blockIdx.y, split = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int Sq = f.seqlen_q, D = f.head_dim;
  const int rows_here = min(kRows, args.rows - row0);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Lets the combine kernel launch once every CTA of this grid has started (it then waits for
  // this grid to finish before reading anything; decode_launch.cuh).
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  const SequenceKeys seq = sequence_keys(p, b);
  // Local row r is query head kv_head * group + (row0 + r) / Sq, query row (row0 + r) % Sq.
  auto head_of = [&](int r) { return kv_head * args.group + (row0 + r) / Sq; };
  auto qrow_of = [&](int r) { return (row0 + r) % Sq; };

  // This thread's rows g and g + 8, and the keys [vis_lo, vis_hi] any row of the CTA sees.
  RowKeys mine[2];
  float slope_log2[2] = {0.0f, 0.0f};
  int vis_lo = INT_MAX, vis_hi = -1;
  for (int r = 0; r < kRows; ++r) {
    RowKeys keys{0, -1, 0};
    if (seq.ok && r < rows_here) keys = row_keys(f, seq, qrow_of(r));
    if (keys.lo <= keys.hi) vis_lo = min(vis_lo, keys.lo), vis_hi = max(vis_hi, keys.hi);
    if (r == g) mine[0] = keys;
    if (r == g + 8) mine[1] = keys;
  }
  if (f.alibi_slopes) {
    for (int k = 0; k < 2; ++k) {
      if (g + 8 * k < rows_here) {
        slope_log2[k] = f.alibi_slopes[b * f.alibi_batch_stride + head_of(g + 8 * k)] * kLog2e;
      }
    }
  }
  // Chunks of 16 keys aligned to cache position 0 (so none straddles a page), split evenly.
  const int chunk0 = vis_lo <= vis_hi ? vis_lo / kChunk * kChunk : 0;
  const int num_chunks = vis_lo <= vis_hi ? (vis_hi - chunk0) / kChunk + 1 : 0;
  const int per_split = (num_chunks + args.num_splits - 1) / args.num_splits;
  const int chunk_begin = split * per_split, chunk_end = min(num_chunks, chunk_begin + per_split);

  // The page (or cache entry) chunk c lives in.
  auto chunk_unit = [&](int c) -> int64_t {
    const int pos = chunk0 + c * kChunk;
    return p.block_table ? p.block_table[seq.row * p.block_table_batch_stride + pos / p.page_size] : seq.row;
  };
  const T* k_head = static_cast<const T*>(f.k) + kv_head * f.k_head_stride;
  const T* v_head = static_cast<const T*>(f.v) + kv_head * f.v_head_stride;
  // With TMA, each warp's lane 0 sets up its ring and requests its first chunks now, so their
  // latency runs under the Q setup below.
  auto issue = [&](int i) {  // the warp's i-th chunk into stage i % kStages
    const int c = chunk_begin + warp + i * kWarps;
    if (c >= chunk_end) return;
    uint64_t* bar = &st->full[warp][i % Stages::kStages];
    const int64_t unit = chunk_unit(c);
    if (p.block_table && (unit < 0 || unit >= p.num_blocks)) {  // read as NaN by the consumer
      mbarrier_arrive(bar);
      return;
    }
    const int pos0 = chunk0 + c * kChunk, row = p.block_table ? pos0 % p.page_size : pos0;
    fence_proxy_async();
    mbarrier_arrive_expect_tx(bar, Stages::kStageBytes);
    tma_load_4d(&args.tma_k, st->k[warp][i % Stages::kStages], bar, 0, kv_head, row, static_cast<int>(unit));
    tma_load_4d(&args.tma_v, st->v[warp][i % Stages::kStages], bar, 0, kv_head, row, static_cast<int>(unit));
  };
  if constexpr (kTma) {
    if (lane == 0) {
      for (int i = 0; i < Stages::kStages; ++i) mbarrier_init(&st->full[warp][i], 1);
      fence_barrier_init();
      for (int i = 0; i < Stages::kStages; ++i) issue(i);
    }
    __syncwarp();
  }

  // Q into shared memory as float, then rotated pair by pair at cache_seqlens (+ i when causal or
  // windowed).  Eight elements a load, every load issued before the first is used: Nsight Compute
  // on 1 x 2k showed the element-by-element version (each load behind its own branch) waiting
  // out one memory latency per element, a quarter of the kernel's time.
  constexpr int kQVectors = kRows * kD / 8 / kThreads;  // 2 at D = 128
  uint4 q_vec[kQVectors];
#pragma unroll
  for (int k = 0; k < kQVectors; ++k) {
    const int e = threadIdx.x + k * kThreads, r = e / (kD / 8), d0 = e % (kD / 8) * 8;
    const T* q = static_cast<const T*>(f.q) + b * f.q_batch_stride;
    if (r < rows_here) q += qrow_of(r) * f.q_row_stride + head_of(r) * f.q_head_stride;
    q_vec[k] = load8(q, d0, D, args.vector_q, r < rows_here);
  }
#pragma unroll
  for (int k = 0; k < kQVectors; ++k) {
    const int e = threadIdx.x + k * kThreads, r = e / (kD / 8), d0 = e % (kD / 8) * 8;
    const T* x = reinterpret_cast<const T*>(&q_vec[k]);
#pragma unroll
    for (int i = 0; i < 8; ++i) sm.o[0][r][d0 + i] = to_float(x[i]);
  }
  __syncthreads();
  if (p.rotary_cos != nullptr && seq.ok) {
    const bool per_row_position = f.window_left >= 0 || f.window_right >= 0;
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
  for (int e = threadIdx.x; e < kD / 16 * 32; e += kThreads) {
    const int c = e / 32, fl = e % 32, fg = fl / 4, d = 32 * (c / 2) + 8 * (fl % 4) + 4 * (c % 2);
    const auto& qf = sm.o[0];
    sm.q_frag[c][fl] = make_uint4(pack2<T>(qf[fg][d], qf[fg][d + 1]), pack2<T>(qf[fg + 8][d], qf[fg + 8][d + 1]),
                                  pack2<T>(qf[fg][d + 2], qf[fg][d + 3]), pack2<T>(qf[fg + 8][d + 2], qf[fg + 8][d + 3]));
  }

  const float score_scale = f.softcap > 0.0f ? f.softmax_scale / f.softcap : f.softmax_scale * kLog2e;
  const float softcap_log2 = f.softcap * kLog2e;

  float o[kD / 8][kC] = {};
  float m[2] = {-CUDART_INF_F, -CUDART_INF_F}, l[2] = {0.0f, 0.0f};  // [1] unused when kHalves = 1
  __syncthreads();  // q_frag complete

  int chunk = chunk_begin + warp;
  int64_t next_unit = !kTma && chunk < chunk_end ? chunk_unit(chunk) : 0;               // this chunk
  int64_t later_unit = !kTma && chunk + kWarps < chunk_end ? chunk_unit(chunk + kWarps) : 0;  // the next one
  for (int i = 0; chunk < chunk_end; chunk += kWarps, ++i) {
    int64_t unit;
    if constexpr (kTma) {
      unit = chunk_unit(chunk);  // an L1 hit: lane 0 read it to issue the load
      mbarrier_wait(&st->full[warp][i % Stages::kStages], (i / Stages::kStages) & 1);
    } else {
      unit = next_unit;
      next_unit = later_unit;
      if (chunk + 2 * kWarps < chunk_end) later_unit = chunk_unit(chunk + 2 * kWarps);
    }
    const int pos0 = chunk0 + chunk * kChunk;
    const bool bad_page = p.block_table && (unit < 0 || unit >= p.num_blocks);
    const int64_t slot0 = p.block_table ? pos0 % p.page_size : pos0;
    const T* k_chunk = k_head + (bad_page ? 0 : unit) * f.k_batch_stride + slot0 * f.k_row_stride;
    const T* v_chunk = v_head + (bad_page ? 0 : unit) * f.v_batch_stride + slot0 * f.v_row_stride;
    auto key_valid = [&](int key) { return pos0 + key >= vis_lo && pos0 + key <= vis_hi; };
    // Eight elements of a key: with TMA from the stage (zeros past head_dim: the box's fill), else
    // from global memory; zero for keys outside [vis_lo, vis_hi], which are never read otherwise.
    const T* k_tile = kTma ? st->k[warp][i % Stages::kStages] : nullptr;
    const T* v_tile = kTma ? st->v[warp][i % Stages::kStages] : nullptr;
    auto fetch = [&](const T* tile, const T* chunk_base, int64_t row_stride, bool vector, int key, int dim0,
                     bool valid) -> uint4 {
      if constexpr (kTma) {
        return valid ? *reinterpret_cast<const uint4*>(tile + key * kD + dim0) : make_uint4(0, 0, 0, 0);
      } else {
        return load8(chunk_base + key * row_stride, dim0, D, vector, valid);
      }
    };

    // K: keys g and g + 8, dims 32v + 8t ...  V: keys 2t, 2t+1, 2t+8, 2t+9, dims 64h + 8g ..
    uint4 k_regs[2][kD / 32], v_regs[4][kD / 64];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const int key = g + 8 * n;
#pragma unroll
      for (int v = 0; v < kD / 32; ++v) {
        k_regs[n][v] = fetch(k_tile, k_chunk, f.k_row_stride, args.vector_k, key, 32 * v + 8 * t,
                             key_valid(key) && !bad_page);
      }
    }
    auto load_v = [&] {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int key = 2 * t + (j & 1) + 8 * (j >> 1);
#pragma unroll
        for (int h = 0; h < kD / 64; ++h) {
          v_regs[j][h] = bad_page ? make_uint4(kNanPair<T>, kNanPair<T>, kNanPair<T>, kNanPair<T>)
                                  : fetch(v_tile, v_chunk, f.v_row_stride, args.vector_v, key, 64 * h + 8 * g,
                                          key_valid(key));
        }
      }
    };
    // Up to D = 128 both operands are in flight together (64 registers at D = 128); at 256 that
    // would take 128 registers next to O's 128, so V waits until S is done.
    if constexpr (!kLateV) load_v();
    if (bad_page) {  // loud, not out of bounds: the rows that see this chunk come out NaN
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int v = 0; v < kD / 32; ++v) k_regs[n][v] = make_uint4(kNanPair<T>, kNanPair<T>, kNanPair<T>, kNanPair<T>);
    }

    // S = Q K^T for keys pos0 + [0, 8) (tile 0) and pos0 + [8, 16) (tile 1).
    float s[2][kC] = {};
#pragma unroll
    for (int c = 0; c < kD / 16; ++c) {
      const uint4 a = sm.q_frag[c][lane];
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        mma_16816<T>(s[n], a, word(k_regs[n][c / 2], 2 * (c % 2)), word(k_regs[n][c / 2], 2 * (c % 2) + 1));
      }
    }

    // Scores in base 2:  s = scale q.k;  s = softcap tanh(s / softcap);  s -= slope |diagonal - j|;
    // invisible columns -inf.  Then the online softmax (FA2 eq. 5):  m' = max(m, rowmax S),
    // P = 2^(S - m'),  l' = 2^(m - m') l + rowsum P,  O' = 2^(m - m') O + P V.
    float row_max[2] = {-CUDART_INF_F, -CUDART_INF_F};
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int e = 0; e < kC; ++e) {
        const int k = e / 2, key = pos0 + 8 * n + 2 * t + (e & 1);
        float x = s[n][e] * score_scale;
        if (f.softcap > 0.0f) x = softcap_log2 * tanhf(x);
        if (f.alibi_slopes) x -= slope_log2[k] * fabsf(static_cast<float>(mine[k].diagonal - key));
        x = key >= mine[k].lo && key <= mine[k].hi ? x : -CUDART_INF_F;
        s[n][e] = x;
        row_max[k] = fmaxf(row_max[k], x);
      }
    }
    float alpha[2], m_use[2];
#pragma unroll
    for (int k = 0; k < kHalves; ++k) {
      row_max[k] = fmaxf(row_max[k], __shfl_xor_sync(0xffffffffu, row_max[k], 1));
      row_max[k] = fmaxf(row_max[k], __shfl_xor_sync(0xffffffffu, row_max[k], 2));
      const float m_new = fmaxf(m[k], row_max[k]);
      alpha[k] = m_new == -CUDART_INF_F ? 1.0f : exp2f(m[k] - m_new);
      m_use[k] = m_new == -CUDART_INF_F ? 0.0f : m_new;  // a row with no visible key yet: P = 0
      m[k] = m_new;
      l[k] *= alpha[k];
    }
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int e = 0; e < kC; ++e) {
        s[n][e] = exp2f(s[n][e] - m_use[e / 2]);
        l[e / 2] += s[n][e];
      }
    }
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
#pragma unroll
      for (int e = 0; e < kC; ++e) o[j][e] *= alpha[e / 2];
    }

    if constexpr (kLateV) load_v();
    // O += P V: P's C fragments are the A fragment of the 16-key step as they stand.
    const uint4 pa = kHalves == 2 ? make_uint4(pack2<T>(s[0][0], s[0][1]), pack2<T>(s[0][kC - 2], s[0][kC - 1]),
                                               pack2<T>(s[1][0], s[1][1]), pack2<T>(s[1][kC - 2], s[1][kC - 1]))
                                  : make_uint4(pack2<T>(s[0][0], s[0][1]), 0u, pack2<T>(s[1][0], s[1][1]), 0u);
#pragma unroll
    for (int h = 0; h < kD / 64; ++h) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const uint32_t select = (e & 1) ? 0x7632u : 0x5410u;  // high or low halves of both words
        const uint32_t b0 = __byte_perm(word(v_regs[0][h], e / 2), word(v_regs[1][h], e / 2), select);
        const uint32_t b1 = __byte_perm(word(v_regs[2][h], e / 2), word(v_regs[3][h], e / 2), select);
        mma_16816<T>(o[8 * h + e], pa, b0, b1);
      }
    }
    if constexpr (kTma) {  // every lane has read the stage (its values fed the mmas): refill it
      __syncwarp();
      if (lane == 0) issue(i + Stages::kStages);
    }
  }

  // Merge the warps: O = sum_w 2^(m_w - M) O_w, l = sum_w 2^(m_w - M) l_w, M = max_w m_w.
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    l[k] += __shfl_xor_sync(0xffffffffu, l[k], 1);
    l[k] += __shfl_xor_sync(0xffffffffu, l[k], 2);
  }
  if (t == 0) {
    sm.m[warp][g] = m[0], sm.m[warp][g + 8] = m[1];
    sm.l[warp][g] = l[0], sm.l[warp][g + 8] = l[1];
  }
  __syncthreads();
  float own_scale[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int r = g + 8 * k;
    float row_m = -CUDART_INF_F;
    for (int w = 0; w < kWarps; ++w) row_m = fmaxf(row_m, sm.m[w][r]);
    own_scale[k] = m[k] == -CUDART_INF_F ? 0.0f : exp2f(m[k] - row_m);
    if (warp == 0 && t == 0) {
      float row_l = 0.0f;
      for (int w = 0; w < kWarps; ++w) {
        row_l += sm.m[w][r] == -CUDART_INF_F ? 0.0f : exp2f(sm.m[w][r] - row_m) * sm.l[w][r];
      }
      sm.row_max[r] = row_m, sm.row_sum[r] = row_l, sm.row_scale[r] = row_l == 0.0f ? 0.0f : 1.0f / row_l;
    }
  }
  // Warps 2 and 3 store their O into halves 0 and 1, then warps 0 and 1 add theirs: out is
  // (O_0 + O_2) + (O_1 + O_3), the same bits at every batch size for a fixed num_splits.
  static_assert(kWarps == 4, "two merge halves of two warps each");
  auto merge = [&](bool add) {
#pragma unroll
    for (int j = 0; j < kD / 8; ++j) {
#pragma unroll
      for (int e = 0; e < kC; ++e) {
        const int r = g + 8 * (e / 2), d = 64 * (j / 8) + 8 * (2 * t + (e & 1)) + j % 8;
        const float x = o[j][e] * own_scale[e / 2];
        float& slot = sm.o[warp % 2][r][d];
        slot = add ? slot + x : x;
      }
    }
  };
  if (warp >= 2) merge(false);
  __syncthreads();
  if (warp < 2) merge(true);
  __syncthreads();

  // out = O / l and lse = ln 2 (M + log2 l); a row that saw no key gets 0 and +inf (-inf for a
  // split's partial, which the combine skips); an invalid sequence gets NaN.  Four dims a thread,
  // a float4 store into the partials when D % 4 == 0.
  const bool final_output = args.num_splits == 1;
  const int64_t split_rows = static_cast<int64_t>(f.batch) * f.num_heads * Sq;
  const int quads = (D + 3) / 4;
  for (int e = threadIdx.x; e < rows_here * quads; e += kThreads) {
    const int r = e / quads, d0 = e % quads * 4, h = head_of(r), i = qrow_of(r);
    const float scale = sm.row_scale[r];
    float x[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int d = d0 + c;  // < kD: kD is a multiple of 64
      x[c] = !seq.ok ? CUDART_NAN_F : scale == 0.0f ? 0.0f : (sm.o[0][r][d] + sm.o[1][r][d]) * scale;
    }
    if (final_output) {
      T* out = static_cast<T*>(f.out) + b * f.out_batch_stride + i * f.out_row_stride + h * f.out_head_stride;
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
  if (threadIdx.x < rows_here) {
    const int r = threadIdx.x, h = head_of(r), i = qrow_of(r);
    const float sum = sm.row_sum[r];
    const float empty = final_output ? CUDART_INF_F : -CUDART_INF_F;
    const float lse = !seq.ok ? CUDART_NAN_F : sum == 0.0f ? empty : (sm.row_max[r] + log2f(sum)) * kLn2;
    if (final_output) {
      f.softmax_lse[b * f.lse_batch_stride + h * f.lse_head_stride + i] = lse;
    } else {
      args.lse_partial[split * split_rows + (static_cast<int64_t>(b) * f.num_heads + h) * Sq + i] = lse;
    }
  }
}

}  // namespace tileattn::cuda::decode
