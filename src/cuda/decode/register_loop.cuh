// The split kernel's streaming loop without staging: each warp takes 16-key chunks round-robin and
// loads K and V from global memory straight into mma operand registers, in 16-byte vectors.
//
// Two operand orders make those loads whole vectors:
//   - Q K^T sums over the head dim, so the dim order inside a k16 step is free: thread (g, t)
//     loads the 16-byte vectors at dims 32v + 8t of key g (v < D/32, 4 vectors at D = 128), so
//     for each v a quad reads 64 contiguous bytes, whole 32-byte sectors (a thread reading dims
//     [t D/4, (t+1) D/4) touched each sector in two instructions: twice the L1 requests), and
//     step c uses elements 4(c%2)..4(c%2)+3 of vector c/2.  Q's fragments (built once, in shared
//     memory) follow the same order.
//   - P V's n8 output tiles can take any 8 dims: tile 8h + e holds dims 64h + 8n + e, so thread
//     (g, t) loads one 16-byte vector (dims 64h + 8g ..) of each of its keys 2t, 2t+1, 2t+8, 2t+9
//     and pairs keys with a byte permute.
// Bytes in flight: up to 3 CTAs x 4 warps x 8 KB of registers per SM at D = 128.  Page indices are
// loaded two chunks ahead, so a page of 16 costs one cached 4-byte load off the critical path.
// docs/perf-log.md has the alternatives measured against this on the H200: a 3-stage cp.async
// pipeline (2.2 TB/s where these register loads reach 3.9, 32 x 32k) and an L2 prefetch of each
// warp's next chunk (about 10% slower).
#pragma once

#include "cuda/decode/decode_args.h"
#include "cuda/decode/elements.cuh"
#include "cuda/decode/softmax_step.cuh"

namespace tileattn::cuda::decode {

// o[j][e] is O for row g + 8 (e / 2), dim 64 (j / 8) + 8 (2t + (e & 1)) + j % 8 (the V vector order
// above).  q_frag: Q's A fragments [k16 step][lane] in the K vector order above.
template <typename T, int kD, int kHalves>
__device__ __forceinline__ void register_loop(const DecodeArgs& args, const SequenceKeys& seq, const BlockWalk& w,
                                              const ScoreRules& rules, const uint4 (&q_frag)[kD / 16][32],
                                              float (&o)[kD / 8][2 * kHalves], float (&m)[2], float (&l)[2]) {
  constexpr bool kLateV = kD > 128;
  constexpr int kC = 2 * kHalves;
  const tileattn_kvcache_params& p = args.p;
  const tileattn_fwd_params& f = p.fwd;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int D = f.head_dim;
  // The page (or cache entry) chunk c lives in; page_div's multiply-shift, not a runtime division.
  auto chunk_unit = [&](int c) -> int64_t {
    const int pos = w.base + c * kChunk;
    return p.block_table ? p.block_table[seq.row * p.block_table_batch_stride + args.page_div.div(pos)] : seq.row;
  };
  const T* k_head = static_cast<const T*>(f.k) + w.kv_head * f.k_head_stride;
  const T* v_head = static_cast<const T*>(f.v) + w.kv_head * f.v_head_stride;

  int chunk = w.begin + warp;
  int64_t next_unit = chunk < w.end ? chunk_unit(chunk) : 0;                        // this chunk
  int64_t later_unit = chunk + kWarps < w.end ? chunk_unit(chunk + kWarps) : 0;  // the next one
  for (; chunk < w.end; chunk += kWarps) {
    const int64_t unit = next_unit;
    next_unit = later_unit;
    if (chunk + 2 * kWarps < w.end) later_unit = chunk_unit(chunk + 2 * kWarps);
    const int pos0 = w.base + chunk * kChunk;
    const bool bad_page = p.block_table && (unit < 0 || unit >= p.num_blocks);
    const int64_t slot0 = p.block_table ? args.page_div.mod(pos0) : pos0;
    const T* k_chunk = k_head + (bad_page ? 0 : unit) * f.k_batch_stride + slot0 * f.k_row_stride;
    const T* v_chunk = v_head + (bad_page ? 0 : unit) * f.v_batch_stride + slot0 * f.v_row_stride;
    // Zero for keys outside [vis_lo, vis_hi], which are never read.
    auto key_valid = [&](int key) { return pos0 + key >= w.vis_lo && pos0 + key <= w.vis_hi; };

    // K: keys g and g + 8, dims 32v + 8t ...  V: keys 2t, 2t+1, 2t+8, 2t+9, dims 64h + 8g ..
    uint4 k_regs[2][kD / 32], v_regs[4][kD / 64];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const int key = g + 8 * n;
#pragma unroll
      for (int v = 0; v < kD / 32; ++v) {
        k_regs[n][v] =
            load8(k_chunk + key * f.k_row_stride, 32 * v + 8 * t, D, args.vector_k, key_valid(key) && !bad_page);
      }
    }
    auto load_v = [&] {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int key = 2 * t + (j & 1) + 8 * (j >> 1);
#pragma unroll
        for (int h = 0; h < kD / 64; ++h) {
          const T* row = v_chunk + key * f.v_row_stride;
          v_regs[j][h] = bad_page ? make_uint4(kNanPair<T>, kNanPair<T>, kNanPair<T>, kNanPair<T>)
                                  : load8(row, 64 * h + 8 * g, D, args.vector_v, key_valid(key));
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
      const uint4 a = q_frag[c][lane];
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        mma_16816<T>(s[n], a, word(k_regs[n][c / 2], 2 * (c % 2)), word(k_regs[n][c / 2], 2 * (c % 2) + 1));
      }
    }
    float alpha[2];
    const bool plain = !rules.softcap && !rules.alibi && pos0 >= w.common_lo && pos0 + kChunk - 1 <= w.common_hi;
    softmax_step(s, pos0, t, rules, plain, m, l, alpha);
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
  }
}

}  // namespace tileattn::cuda::decode
