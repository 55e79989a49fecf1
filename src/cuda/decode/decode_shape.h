// The split kernel's fixed sizes, which host code (the split heuristic, its tests) needs without
// the CUDA headers that decode_args.h brings.
#pragma once

#include "common/host_device.h"

namespace tileattn::cuda::decode {

// Keys per step of the split kernel: the K of m16n8k16 for P V, two n8 tiles for Q K^T.  Page
// sizes are multiples of 16, so a 16-aligned chunk never straddles two pages.
constexpr int kChunk = 16;
// Query rows per CTA: the M of m16n8k16.  A KV group with more rows (H / Hk x seqlen_q > 16)
// runs in several row blocks that read the same K/V, mostly from L2.
constexpr int kRows = 16;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
// More splits than this only add combine work: 128 x 8 KV heads already fills 132 SMs 7 times.
constexpr int kMaxSplits = 128;

// Most splits that merge inside a thread-block cluster instead of the combine kernel
// (cluster_merge.cuh): 8 is the largest portable cluster size, which every sm90 part schedules.
constexpr int kMaxClusterSplits = 8;

// The split kernel's streaming loops (its kTma parameter): K/V straight into registers, a TMA ring,
// the TMA ring of twice the keys a block (d128 only), or the TMA ring at three CTAs an SM (d128, at
// most 8 query rows a CTA: its static shared memory trimmed to those rows, tma_block_loop.cuh).
constexpr int kLoopRegisters = 0;
constexpr int kLoopRing = 1;
constexpr int kLoopWideRing = 2;
constexpr int kLoopRingThree = 3;

// Keys a warp's TMA block holds (tma_block_loop.cuh): 4 KB of K and 4 KB of V up to d128 (d64 32
// keys, d128 16), 16 keys (8 KB each) at d256; 16 is the k of P V's m16n8k16.  The wide ring's
// blocks hold 8 KB of each (d128: 32 keys).
TILEATTN_HOST_DEVICE constexpr int tma_block_keys(int head_dim, bool wide = false) {
  return head_dim <= 128 ? (wide ? 4096 : 2048) / head_dim : 16;
}

}  // namespace tileattn::cuda::decode
