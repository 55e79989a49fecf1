// Types of the column-split warp-specialized Hopper backward (bwd_ws_cols_consumer.cuh), the d256
// bucket: tiles, the P^T and dS layouts, the three tiled MMAs and the shared storage (the Q, dO, K,
// V tiles and TMA types in bwd_ws_tiles.h).  Holds no logic beyond where the row statistics sit.
//
// The d128 layout (bwd_ws_traits.h: each consumer owns 64 keys and all of their dK, dV columns)
// would hold 64 keys x 256 columns of dK and of dV, 256 floats a thread, past the 240 registers
// setmaxnreg gives two consumer warpgroups.  Here a CTA owns kBlockN = 64 keys and the two
// consumers split the work of each 64-row query block as follows:
//   S^T = K Q^T, dP^T = V dO^T   by query rows: consumer g scores queries 32g .. 32g + 31 for all
//                                64 keys (M 64, N 32, K 256: 16 + 16 floats a thread);
//   P^T, dS^T                    go to shared memory, both halves, so that
//   dV += P^T dO, dK += dS^T Q   split by head-dim columns: consumer g owns columns 128g .. 128g +
//                                127 of dK and dV (M 64 keys, N 128, K 64 queries: 64 + 64 floats);
//   dQ = dS K                    split by columns the same way (M 64 queries, N 128, K 64 keys:
//                                64 floats, live only after S^T and dP^T are dead).
// Peak: 128 + 64 floats of accumulators a thread.  FlashAttention-3's d256 backward splits its
// warpgroups the same way (the dK, dV columns between them); this is our own arrangement of it.
//
// Shared memory (bytes): K, V 32768 each; Q, dO one stage of 32768 each; P^T and dS^T 8192 each,
// double-buffered (32768), so a consumer can write block i + 1's while the other still reads block
// i's; one dQ staging buffer of 64 x 264 floats (67584); row statistics 512: 231936 of the 232448
// an H100/H200 block may opt in to.  So one dQ buffer however many writers, and one Q/dO stage (a
// second would need 65536 more): Q and dO have separate barriers, and each is released as soon as
// its last product (dK for Q, dV for dO) is done, so the producer's next loads overlap the rest of
// the block's products.
#pragma once

#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include "cuda/backward/bwd_config.h"  // kWsBlockM
#include "cuda/sm90/bwd_ws_tiles.h"

namespace tileattn::cuda::sm90 {

template <int kHeadDim_, typename Element_>
struct BwdWsColsTraits : BwdWsTiles<Element_, bwd::kWsBlockM, 64, kHeadDim_, 1> {
  using Tiles = BwdWsTiles<Element_, bwd::kWsBlockM, 64, kHeadDim_, 1>;
  using typename Tiles::SmemLayoutQ;
  using typename Tiles::SmemLayoutKV;
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = bwd::kWsBlockM;  // query rows per step (64)
  static constexpr int kBlockN = 64;              // keys per CTA
  static constexpr int kQueriesPerConsumer = kBlockM / 2;  // N of S^T and dP^T
  static constexpr int kColumnsPerConsumer = kHeadDim / 2;  // N of dV, dK and dQ
  static constexpr int kStages = 1;  // Q / dO / LSE / D buffers
  static constexpr int kConsumerThreads = 256;
  static constexpr int kThreads = 384;
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;
  // Deterministic calls: two dQ writer warps take alternate query blocks from the one staging buffer
  // (a second buffer does not fit).  A deterministic writer waits for its reductions to land before
  // it passes the turn on; with one writer the next block's reductions waited for that too, and
  // deterministic calls ran at 0.79-0.83x atomic (session 16).  Atomic calls keep one writer.
  static constexpr int kDqWriters = 2;
  // ws_consume_cols; its single Q/dO stage puts Q and dO on barriers of their own (bwd_ws_roles.cuh).
  static constexpr bool kColumnSplit = true;
  static_assert(kHeadDim == 256, "the head-dim bucket 256");

  using _M = cute::Int<kBlockM>;
  using _N = cute::Int<kBlockN>;
  using _MC = cute::Int<kQueriesPerConsumer>;
  using _D = cute::Int<kHeadDim>;
  using _DC = cute::Int<kColumnsPerConsumer>;

  // Consumer g's part of dK and dV: every key, columns 128g .. 128g + 127.
  using ConsumerDkvTile = cute::Shape<_N, _DC>;
  __device__ static auto consumer_dkv_coord(int g) { return cute::make_coord(cute::_0{}, g); }

  // P^T and dS^T use the same swizzle atom as the Q, dO, K and V tiles.
  using Atom = cute::GMMA::Layout_K_SW128_Atom<Element>;
  // P^T and dS^T as (keys, query rows, buffer), the query rows contiguous (64 x 2 bytes: one
  // 128-byte swizzle row): the K-major A operands of dV and dK.  dS: the same bytes as (query rows,
  // keys, buffer), the MN-major A operand of dQ.
  using SmemLayoutPdSt = decltype(cute::tile_to_shape(Atom{}, cute::Shape<_N, _M, cute::_2>{}));
  using SmemLayoutdS = decltype(cute::composition(
      SmemLayoutPdSt{}, cute::make_ordered_layout(cute::Shape<_M, _N, cute::_2>{}, cute::Step<cute::_2, cute::_1, cute::_3>{})));

  // S^T = K Q^T and dP^T = V dO^T: M = 64 keys, N = 32 query rows, K = head dim; both K-major.
  using TiledMmaSdP = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, cute::Shape<_N, _MC, _D>>()));
  // dV += P^T dO and dK += dS^T Q for 128 columns: A = P^T / dS^T (K-major), B = dO^T / Q^T (MN-major).
  using TiledMmadKV = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, cute::Shape<_N, _DC, _M>, cute::GMMA::Major::K,
                                 cute::GMMA::Major::MN>()));
  // dQ = dS K for 128 columns: A = dS (query rows contiguous), B = K^T.
  using TiledMmadQ = decltype(cute::make_tiled_mma(
      cute::GMMA::ss_op_selector<Element, Element, float, cute::Shape<_M, _DC, _N>, cute::GMMA::Major::MN,
                                 cute::GMMA::Major::MN>()));

  template <int kWriters>
  struct SharedStorage {
    static_assert(kWriters == 1 || kWriters == 2, "one or two dQ writers, one staging buffer");
    // kHeadDim + 8 floats a row: each half-warp's 8-byte stores of 4 accumulator rows fill the 32
    // banks once, in whole 16-byte vectors, as the block's one bulk reduction needs.
    static constexpr int kDqPitch = kHeadDim + 8;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutQ>, 1024> dout;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>, 1024> k;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutKV>, 1024> v;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutPdSt>, 1024> pt;
    cute::array_aligned<Element, cute::cosize_v<SmemLayoutPdSt>, 1024> dst;
    alignas(128) float dq[1][kBlockM * kDqPitch];  // one query block's dQ on its way to the workspace
    float row_stats[2 * kBlockM];  // LSE in log2 units (+inf past seqlen_q), then D (0 past seqlen_q)
    uint64_t kv_full;
    uint64_t q_full[1];    // Q landed (TMA bytes) and the LSE staged (32 lanes)
    uint64_t q_empty[1];   // every consumer thread's dK product has read Q
    uint64_t do_full[1];   // dO landed and D staged
    uint64_t do_empty[1];  // every consumer thread's dV product has read dO
    // Per writer (the even and odd steps with two): both consumers' dQ columns of its block are in
    // `dq` (256 arrivals); its bulk copies have read them (1 arrival).
    uint64_t dq_full[kWriters];
    uint64_t dq_empty[kWriters];

    __device__ float* dq_staging(int) { return dq[0]; }
    __device__ float& lse_log2(int, int row) { return row_stats[row]; }
    __device__ float& delta(int, int row) { return row_stats[kBlockM + row]; }
  };
  template <int kWriters>
  static constexpr int kSmemBytes = int(sizeof(SharedStorage<kWriters>));
  static_assert(kSmemBytes<1> <= 227 * 1024 && kSmemBytes<kDqWriters> <= 227 * 1024,
                "H100/H200 opt-in shared memory per block");
};

}  // namespace tileattn::cuda::sm90
