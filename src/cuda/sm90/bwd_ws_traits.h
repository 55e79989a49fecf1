// Types of the warp-specialized Hopper backward (bwd_ws_kernel.cuh) for one (head dim, dtype) of
// the key-split layout (d64, d128): tiles, the dS layouts, the tiled MMAs and the shared storage
// (the Q, dO, K, V tiles and TMA types in bwd_ws_tiles.h).
// Holds no logic beyond where the row statistics sit.
//
// A CTA owns kBlockN = 128 keys and walks 64-row query blocks.  Warpgroup 0 is the producer (TMA
// loads of K, V once and of Q, dO per block; a second warp stages the block's LSE and D; a third
// adds each block's dQ to the workspace by bulk reductions); each of
// the two consumer warpgroups owns 64 of the keys and computes with the keys as the M mode
// (FlashAttention-3's "swapped" S), so P^T and dS^T come out of S^T = K Q^T and dP^T = V dO^T in
// registers already in the layout of the A operand of dV += P^T dO and dK += dS^T Q.  Only
// dQ = dS K needs both consumers' keys: dS goes through shared memory once, and each consumer
// computes 64 of dQ's head-dim columns.
// Per consumer thread at d128: dV and dK 64 floats each, S^T and dP^T 32 each, dQ 32 (after S^T
// and dP^T are dead): the 240 registers setmaxnreg gives two consumer warpgroups.  At d64: dV, dK
// and dQ 32 each, S^T and dP^T 32; shared memory about 131 KB instead of 227 (two dQ buffers).
#pragma once

#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include "cuda/backward/bwd_config.h"  // kWsBlockM
#include "cuda/sm90/bwd_ws_tiles.h"

namespace tileattn::cuda::sm90 {

template <int kHeadDim_, typename Element_>
struct BwdWsTraits : BwdWsTiles<Element_, bwd::kWsBlockM, 128, kHeadDim_, 2> {
  using Tiles = BwdWsTiles<Element_, bwd::kWsBlockM, 128, kHeadDim_, 2>;
  using typename Tiles::SmemLayoutQ;
  using typename Tiles::SmemLayoutKV;
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = bwd::kWsBlockM;  // query rows per step (64)
  static constexpr int kBlockN = 128;          // keys per CTA
  static constexpr int kKeysPerConsumer = 64;  // wgmma M of S^T
  static constexpr int kStages = 2;            // Q / dO / LSE / D buffers
  static constexpr int kConsumerThreads = 256;
  static constexpr int kThreads = 384;
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;
  static_assert(kHeadDim == 64 || kHeadDim == 128, "the head-dim buckets 64 and 128");
  // dQ = dS K: at d128 each consumer computes 64 of the head-dim columns every block.  At d64 the
  // half would be 32 columns of K^T, which is MN-major with the 128-byte swizzle, whose atom spans
  // 64 head-dim columns: a wgmma descriptor cannot start inside an atom.  So at d64 one consumer
  // computes all of dQ, the two taking alternate blocks (bwd_ws_kernel.cuh).
  static constexpr bool kDqSplitByColumns = kHeadDim >= 128;
  static constexpr int kDqColumns = kDqSplitByColumns ? kHeadDim / 2 : kHeadDim;  // per dQ product

  using _M = cute::Int<kBlockM>;
  using _N = cute::Int<kBlockN>;
  using _KC = cute::Int<kKeysPerConsumer>;
  using _D = cute::Int<kHeadDim>;
  using _DC = cute::Int<kDqColumns>;

  // ws_consume, the keys split between the consumers; Q and dO share one full and one empty
  // barrier a stage (the column-split d256 layout frees them one after the other).
  static constexpr bool kColumnSplit = false;
  // Consumer g's part of dK and dV: its 64 keys, every column.
  using ConsumerDkvTile = cute::Shape<_KC, _D>;
  __device__ static auto consumer_dkv_coord(int g) { return cute::make_coord(g, cute::_0{}); }

  // dS as dQ's A operand: (query rows, keys), the query rows contiguous (MN-major), two buffers so
  // a consumer can write block i + 1's while the other still reads block i's.  dSt: the same bytes
  // as (keys, query rows), the layout each consumer's dS^T registers are stored through.
  using SmemLayoutdS = decltype(cute::tile_to_shape(cute::GMMA::Layout_MN_SW128_Atom<Element>{},
                                                    cute::Shape<_M, _N, cute::_2>{}));
  using SmemLayoutdSt = decltype(cute::composition(
      SmemLayoutdS{}, cute::make_ordered_layout(cute::Shape<_N, _M, cute::_2>{}, cute::Step<cute::_2, cute::_1, cute::_3>{})));

  // S^T = K Q^T and dP^T = V dO^T: M = 64 keys, N = 64 query rows, K = head dim; both K-major.
  using TiledMmaSdP = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, cute::Shape<_KC, _M, _D>>()));
  // dV += P^T dO and dK += dS^T Q: A from registers, B = dO^T / Q^T (head dim contiguous).
  using TiledMmadKV = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float, cute::Shape<_KC, _D, _M>, cute::GMMA::Major::K,
                                 cute::GMMA::Major::MN>()));
  // dQ = dS K for kDqColumns of the head dim: A = dS (query rows contiguous), B = K^T.
  using TiledMmadQ = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, cute::Shape<_M, _DC, _N>, cute::GMMA::Major::MN,
                                 cute::GMMA::Major::MN>()));

  // Deterministic calls: two dQ writer warps take alternate query blocks, each with its own
  // staging buffer.  A deterministic writer holds its block from acquiring the turn until its
  // reductions have landed (L2 round trips); with one buffer shared by both writers the consumers
  // waited for the previous block's copies about a fifth of their time (ncu SASS sampling, d128 8k,
  // 2026-11-30), and with a buffer per writer the deterministic d128 backward gained 11-16% from
  // 4k (perf log, session 13).  Atomic calls keep one writer and one buffer (two measured even).
  static constexpr int kDqWriters = 2;
  static_assert(kStages <= kDqWriters, "stage s's LSE and D live in dQ buffer s's pad columns");

  // The shared storage of a kernel with kWriters dQ writer warps (1 or 2).
  template <int kWriters>
  struct SharedStorage {
    // dQ staging rows.  One buffer: kHeadDim + 8 floats (544 B at d128), so each half-warp's 8-byte
    // stores of 4 rows of the wgmma accumulator fill all 32 banks once (one wavefront per half-warp);
    // whole 16-byte vectors, as the block's one bulk reduction needs.  Two buffers of that pitch need
    // 2 KB more than the 227 KB at d128, so with two the pitch is kHeadDim + 4 (each half-warp's
    // store takes two wavefronts) and LSE and D move into the pad columns: the reduction adds them to
    // the workspace's pad columns, which nothing reads.
    static constexpr int kDqPitch = kWriters == 1 ? kHeadDim + 8 : kHeadDim + 4;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> dout;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>, 1024> v;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutdS>, 1024> ds;
    // dQ of one query block per writer on its way to the workspace (the writer warp's bulk
    // reductions): float32 rows padded to kDqPitch.
    alignas(128) float dq[kWriters][kBlockM * kDqPitch];
    // Per stage: LSE in log2 units (+inf past seqlen_q), then D = rowsum(dO o O) (0 past
    // seqlen_q).  With two buffers: columns kHeadDim and kHeadDim + 1 of buffer `stage` instead.
    float row_stats[kWriters == 1 ? 2 * kStages * kBlockM : 1];
    uint64_t kv_full;
    uint64_t q_full[kStages];   // Q, dO landed (TMA bytes) and LSE, D staged (32 loader lanes)
    uint64_t q_empty[kStages];  // every consumer thread is done with the stage
    uint64_t dq_full[kWriters];   // both consumers' dQ halves are in `dq[w]` (256 arrivals)
    uint64_t dq_empty[kWriters];  // writer w's bulk copies have read `dq[w]` (1 arrival)

    __device__ float* dq_staging(int writer) { return dq[writer]; }
    __device__ float& lse_log2(int stage, int row) {
      if constexpr (kWriters == 1) return row_stats[stage * kBlockM + row];
      else return dq[stage][row * kDqPitch + kHeadDim];
    }
    __device__ float& delta(int stage, int row) {
      if constexpr (kWriters == 1) return row_stats[(kStages + stage) * kBlockM + row];
      else return dq[stage][row * kDqPitch + kHeadDim + 1];
    }
  };
  template <int kWriters>
  static constexpr int kSmemBytes = int(sizeof(SharedStorage<kWriters>));
  static_assert(kSmemBytes<1> <= 227 * 1024 && kSmemBytes<kDqWriters> <= 227 * 1024,
                "H100/H200 opt-in shared memory per block");
};

}  // namespace tileattn::cuda::sm90
