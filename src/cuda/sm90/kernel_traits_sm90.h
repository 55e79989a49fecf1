// The CuTe types of the sm90 forward for one (head-dim bucket, dtype): the wgmma tiled MMAs, the
// shared-memory layouts (GMMA's 128-byte swizzle), the TMA copy types and the shared storage.
// Derived from sm90_tile_config(); holds no logic.
#pragma once

#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include "cuda/sm90/tile_config_sm90.h"

namespace tileattn::cuda::sm90 {

// kBlockN_ and kStages_ default to the bucket's tile (sm90_tile_config); the d64 short-walk kernel
// (kSm90ShortWalkD64) gives its own.
template <int kHeadDim_, typename Element_, int kBlockN_ = sm90_tile_config(kHeadDim_).block_n,
          int kStages_ = sm90_tile_config(kHeadDim_).stages>
struct Sm90Traits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr int kOCols = sm90_o_pass_cols(kHeadDim_);  // head-dim columns of one O store
  static constexpr int kOPasses = kHeadDim_ / kOCols;
  static constexpr bool kSeqBounds = false;  // sequence_bounds_sm90.h
  static constexpr bool kLeftWindow = false;  // left_window_sm90.h
  static constexpr int kClusterSize = 1;     // CTAs sharing each K/V load (cluster_sm90.h)
  static constexpr int kRows = kRowsPerConsumer;  // query rows of one consumer warpgroup
  static constexpr int kConsumers = sm90_consumers(kHeadDim_);
  static constexpr int kBlockM = sm90_block_m(kHeadDim_);  // query rows per tile
  static constexpr int kConsumerThreads = kConsumers * 128;
  static constexpr int kThreads = kConsumerThreads + 128;  // and the producer warpgroup
  // setmaxnreg: the producer keeps 24 registers a thread, the consumers share the rest of the
  // SM's 65536 (a multiple of 8): 2 x 128 x 240 or 3 x 128 x 160, plus 128 x 24.
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = kConsumers == 2 ? 240 : 160;
  static_assert(kHeadDim % 64 == 0, "rows of 64 elements = one 128-byte swizzle atom");

  using HeadDim = cute::Int<kHeadDim>;
  using BlockN = cute::Int<kBlockN>;
  using Rows = cute::Int<kRows>;

  // S = Q K^T, M = 64 rows of one warpgroup, both operands K-major: Q from shared memory (the ss
  // variant) or from registers loaded once a tile (rs).  At d128 an ss wgmma m64n128k16 reads 2 KB
  // of A and 4 KB of B from shared memory in its 64 cycles, so with the rs PV products and the TMA
  // fills of K and V the tensor cores need ~112 of shared memory's 128 bytes a cycle; Q's 32
  // registers a thread (of 240) take its 2 KB off every QK^T step (~96 bytes a cycle) and free Q's
  // buffer as soon as it is read: d128 8k-16k +2-3%, 1k-2k +2-4% (perf log).  Only where the
  // registers are free: not at d64 (a third consumer, 160 registers: 96 bytes of spills, 20-28%
  // slower at every length) nor d256 (128 O floats), and not with transformed scores, whose kernels
  // spill 600-800 bytes with it (76-368 without).
  static constexpr bool kQInRegistersUnlessTransformed = kHeadDim_ == 128;
  // Whether the consumer loop holds its wait for the PV product until the next block's softmax is
  // done (wgmma_wait_order.h: ptxas otherwise waits first).  With two consumers, back to back: d256
  // +2-6% from 1k tokens (8k 653 -> 683 TFLOP/s), d128 +1-3% (3.5% fewer cycles at 8k under Nsight
  // Compute); with d64's three, where V's stage is free only after three releases, releasing it a
  // softmax later gained nothing and cost 11% at causal 512 (perf log).
  static constexpr bool kSoftmaxBeforePvWait = kConsumers == 2;
  template <bool kQInRegisters>
  using TiledMmaQK = decltype(cute::make_tiled_mma(cute::conditional_return<kQInRegisters>(
      cute::GMMA::rs_op_selector<Element, Element, float, cute::Shape<Rows, BlockN, HeadDim>>(),
      cute::GMMA::ss_op_selector<Element, Element, float, cute::Shape<Rows, BlockN, HeadDim>>())));
  // Q's shared-memory rows -> its register fragment (the rs A operand): ldmatrix, 8x8 b16 matrices.
  using SmemCopyAtomQ = cute::Copy_Atom<cute::SM75_U32x4_LDSM_N, Element>;
  // O += P V: P from registers (the rs variant), V read through a transposed view of its
  // row-major smem tile, so the B operand is MN-major (head dim contiguous).
  using TiledMmaPV = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float, cute::Shape<Rows, HeadDim, BlockN>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::MN>()));
  // One wgmma spans each product's N.  CuTe's selectors take N outside {8, 16, 32, 64, 96, 128, 192,
  // 256} (80, 144, 160, 176, ...) only with CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED, else they
  // fall back to the largest of those dividing it: the 176-key (d128), 80-key and 48-key (d256)
  // blocks measured in sessions 3-4 ran QK^T as 64 x 16 wgmmas, each reading Q from shared memory
  // again (found in session 76).
  static_assert(cute::size<1>(typename TiledMmaQK<false>::Shape_MNK{}) == kBlockN &&
                    cute::size<1>(typename TiledMmaPV::Shape_MNK{}) == kHeadDim_,
                "a block's product split into narrower wgmmas (docs/cuda-forward-sm90.md, tiles)");

  // Every tile is rows of kHeadDim elements in 8 x 64 atoms with the 128-byte swizzle, the layout
  // both TMA (SWIZZLE_128B) and wgmma descriptors read without bank conflicts.
  using SmemAtom = cute::GMMA::Layout_K_SW128_Atom<Element>;
  // One consumer's 64 query rows; the Q buffer holds two of them.
  using SmemLayoutQHalf = decltype(cute::tile_to_shape(SmemAtom{}, cute::Shape<Rows, HeadDim>{}));
  // One consumer's O staging: 64 rows by kOCols columns (all of them up to d128, half at d256).
  using OCols = cute::Int<kOCols>;
  using SmemLayoutO = decltype(cute::tile_to_shape(SmemAtom{}, cute::Shape<Rows, OCols>{}));
  // The PV product over kOCols columns: its accumulator's registers are the first kOCols / 8 column
  // groups of the full one (CuTe's 64 x N wgmma C layout keeps the 8-column group outermost), so a
  // pass's O fragment is a contiguous slice of the registers.
  using TiledMmaOPass = decltype(cute::make_tiled_mma(
      cute::GMMA::rs_op_selector<Element, Element, float, cute::Shape<Rows, OCols, BlockN>,
                                 cute::GMMA::Major::K, cute::GMMA::Major::MN>()));
  using SmemLayoutKV = decltype(cute::tile_to_shape(
      SmemAtom{}, cute::Shape<BlockN, HeadDim, cute::Int<kStages>>{}));
  // V as the (D, kBlockN) B operand of P V: the same bytes, modes swapped.
  using SmemLayoutVt = decltype(cute::composition(
      SmemLayoutKV{}, cute::make_ordered_layout(cute::Shape<HeadDim, BlockN, cute::Int<kStages>>{},
                                                cute::Step<cute::_2, cute::_1, cute::_3>{})));

  static constexpr int kQHalfElems = int(cute::cosize(SmemLayoutQHalf{}));
  static constexpr int kOElems = int(cute::cosize(SmemLayoutO{}));
  static constexpr int kKVElems = int(cute::cosize(SmemLayoutKV{}));
  static constexpr uint32_t kQHalfBytes = kQHalfElems * sizeof(Element);
  static constexpr int kKVTileElems = kBlockN * kHeadDim;  // one stage of K or V
  static constexpr uint32_t kKVTileBytes = kKVTileElems * sizeof(Element);

  // Global tensors as TMA sees them: (rows, head dim, heads, batch), head dim contiguous.
  using GmemShape = cute::Shape<int32_t, int32_t, int32_t, int32_t>;
  using GmemStride = cute::Stride<int64_t, cute::_1, int64_t, int64_t>;
  using GmemLayout = cute::Layout<GmemShape, GmemStride>;
  using TmaQ = decltype(cute::make_tma_copy(
      cute::SM90_TMA_LOAD{}, cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(nullptr)), GmemLayout{}),
      SmemLayoutQHalf{}, cute::Shape<Rows, HeadDim>{}, cute::_1{}));
  // K and V loaded by `kCopies` CTAs of a cluster, each a 1/kCopies slice of the block's rows
  // multicast to all of them (LoadOp SM90_TMA_LOAD_MULTICAST), or by one CTA alone (SM90_TMA_LOAD, 1).
  template <typename LoadOp, int kCopies>
  using TmaKVOf = decltype(cute::make_tma_copy(
      LoadOp{}, cute::make_tensor(cute::make_gmem_ptr(static_cast<Element const*>(nullptr)), GmemLayout{}),
      cute::take<0, 2>(SmemLayoutKV{}), cute::Shape<BlockN, HeadDim>{}, cute::Int<kCopies>{}));
  using KVLoadOp = cute::SM90_TMA_LOAD;
  using TmaKV = TmaKVOf<KVLoadOp, 1>;
  using TmaO = decltype(cute::make_tma_copy(
      cute::SM90_TMA_STORE{}, cute::make_tensor(cute::make_gmem_ptr(static_cast<Element*>(nullptr)), GmemLayout{}),
      SmemLayoutO{}, cute::Shape<Rows, OCols>{}, cute::_1{}));

  // Registers -> smem for O: stmatrix (8x8 b16 matrices), the wgmma accumulator's natural store.
  using SmemCopyAtomO = cute::Copy_Atom<cute::SM90_U32x4_STSM_N, Element>;

  struct SharedStorage {
    cute::array_aligned<Element, kConsumers * kQHalfElems, 1024> q;  // Q of every consumer
    cute::array_aligned<Element, kKVElems, 1024> k;
    cute::array_aligned<Element, kKVElems, 1024> v;
    uint64_t q_full;            // Q landed (TMA transaction barrier)
    uint64_t q_empty;           // every consumer is done reading Q
    uint64_t k_full[kStages];   // K stage landed
    uint64_t k_empty[kStages];  // every consumer (of every CTA sharing the load) is done reading K stage
    uint64_t v_full[kStages];
    uint64_t v_empty[kStages];
    cute::array_aligned<Element, kConsumers * kOElems, 1024> o;  // O staging of every consumer
    float2 softmax_sink[kSoftmaxBeforePvWait ? kConsumerThreads : 1];  // written, never read
  };

  // Where consumer c stages its O for the TMA store.
  __device__ static Element* o_staging(SharedStorage& ss, int consumer) { return ss.o.data() + consumer * kOElems; }
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "H100/H200 opt-in shared memory per block");
};

}  // namespace tileattn::cuda::sm90
