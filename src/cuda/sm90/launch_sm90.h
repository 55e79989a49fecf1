// Host side of one sm90 (head-dim bucket, dtype): builds the TMA descriptors for this call's
// tensors, the tile order, and launches one persistent CTA per SM.  Included only by the
// generated fwd_sm90_<dtype>_hdim<D>.cu files.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>

#include <cute/tensor.hpp>

#include "cuda/check.h"
#include "cuda/smem_opt_in.h"
#include "cuda/device_checks.h"  // sm_count
#include "cuda/mask_policy.h"
#include "cuda/sm90/cluster_launch.h"
#include "cuda/sm90/cluster_sm90.h"
#include "cuda/sm90/fwd_kernel_sm90.h"
#include "cuda/sm90/gmem_view.h"
#include "cuda/sm90/kernel_traits_sm90.h"
#include "cuda/sm90/launch_api_sm90.h"
#include "cuda/sm90/left_window_sm90.h"
#include "cuda/sm90/paged_boxes_sm90.h"
#include "cuda/sm90/pair_major_order.h"
#include "cuda/sm90/sequence_bounds_sm90.h"
#include "cuda/sm90/short_walk.h"
#include "cuda/sm90/staggered_order.h"
#include "cuda/sm90/tail_merge_sm90.h"
#include "cuda/sm90/tail_split_choice.h"
#include "cuda/stream_workspace.h"

namespace tileattn::cuda::sm90 {

// Launches one kernel of the family; false (nothing launched) when its CTA cluster fits nowhere on
// this GPU.  kCanSplit: the call may run the tail split's kernel instead (tail_split_choice.h).
template <typename Traits, typename ScorePolicy, typename DropoutPolicy,
          bool kCanSplit = tail_split_built<Traits, ScorePolicy, DropoutPolicy>()>
bool launch_fwd_sm90_variant(const FwdKernelArgs& args, cudaStream_t stream) {
  using namespace cute;
  using Element = typename Traits::Element;
  using Rows = typename Traits::Rows;
  using BlockN = typename Traits::BlockN;
  using HeadDim = typename Traits::HeadDim;
  const ForwardParams& p = args.params;
  const TailSplitMode split_mode = tail_split_mode();  // first, so a bad value always raises
  if (p.window_left >= 0 && !masks_left_edge<Traits, ScorePolicy, DropoutPolicy>()) {
    // run_fwd_sm90 sends left windows elsewhere; a kernel whose mask has no left edge would show
    // these rows keys left of their window.
    throw Error(ErrorCode::kInternal, "window_size", "sm90 forward: a left window reached a kernel without a left edge");
  }

  Sm90Params<Traits> prm;
  prm.args = args;
  // Varlen: one packed batch of total_q / total_k rows (sm90_supports checked they fit int32);
  // its batch stride is never used, only required to be a valid TMA stride.
  // Packed query rows over keys in batch form (cu_seqlens_q alone: the KV-cache route's packed
  // calls, sm90_sequence_view) keep K/V's batch mode.
  const bool varlen = p.cu_seqlens_q != nullptr;
  const bool varlen_k = p.cu_seqlens_k != nullptr;
  const int q_rows = varlen ? static_cast<int>(p.total_q) : p.seqlen_q;
  const int batch = varlen ? 1 : p.batch;
  auto batch_stride = [&](bool packed, int64_t stride, int rows, int64_t row_stride) {
    return packed ? rows * row_stride : stride;
  };
  prm.q_shape = make_shape(q_rows, p.head_dim, p.num_heads, batch);
  // The KV-cache route (args.kv, launch_api.h): K/V are cache entries or pages, indexed per sequence
  // or per key block by the producer (sequence-bounds kernels only).
  const bool indexed = args.kv.num_units > 0;
  if (indexed && !Traits::kSeqBounds) {
    throw Error(ErrorCode::kInternal, "k", "sm90 forward: indexed K/V reached a kernel without sequence bounds");
  }
  const int kv_rows = args.kv.block_table != nullptr ? args.kv.page_size : varlen_k ? static_cast<int>(p.total_k) : p.seqlen_k;
  const int kv_units = indexed ? args.kv.num_units : varlen_k ? 1 : p.batch;
  prm.kv_shape = make_shape(kv_rows, p.head_dim, p.num_heads_k, kv_units);
  auto q = gmem_view(static_cast<const Element*>(p.q), q_rows, p.head_dim, p.num_heads, batch,
                             p.q_row_stride, p.q_head_stride, batch_stride(varlen, p.q_batch_stride, q_rows, p.q_row_stride));
  auto k = gmem_view(static_cast<const Element*>(p.k), kv_rows, p.head_dim, p.num_heads_k, kv_units,
                             p.k_row_stride, p.k_head_stride, batch_stride(varlen_k, p.k_batch_stride, kv_rows, p.k_row_stride));
  auto v = gmem_view(static_cast<const Element*>(p.v), kv_rows, p.head_dim, p.num_heads_k, kv_units,
                             p.v_row_stride, p.v_head_stride, batch_stride(varlen_k, p.v_batch_stride, kv_rows, p.v_row_stride));
  auto o = gmem_view(static_cast<Element*>(p.out), q_rows, p.head_dim, p.num_heads, batch,
                             p.out_row_stride, p.out_head_stride,
                             batch_stride(varlen, p.out_batch_stride, q_rows, p.out_row_stride));
  prm.tma_q = make_tma_copy(SM90_TMA_LOAD{}, q, typename Traits::SmemLayoutQHalf{}, Shape<Rows, HeadDim>{}, _1{});
  using KVLoadOp = typename Traits::KVLoadOp;
  using Copies = Int<Traits::kClusterSize>;
  prm.tma_k = make_tma_copy(KVLoadOp{}, k, take<0, 2>(typename Traits::SmemLayoutKV{}), Shape<BlockN, HeadDim>{},
                            Copies{});
  prm.tma_v = make_tma_copy(KVLoadOp{}, v, take<0, 2>(typename Traits::SmemLayoutKV{}), Shape<BlockN, HeadDim>{},
                            Copies{});
  prm.tma_o = make_tma_copy(SM90_TMA_STORE{}, o, typename Traits::SmemLayoutO{}, Shape<Rows, typename Traits::OCols>{},
                            _1{});
  // Pages that do not hold whole key blocks come box by box (paged_boxes_sm90.h).
  prm.page_box_rows = args.kv.block_table != nullptr ? page_box_rows<Traits::kBlockN>(args.kv.page_size) : 0;
  if (prm.page_box_rows > 0) {
    encode_page_box_map<Element>(&prm.k_pages, p.k, p.head_dim, kv_rows, p.num_heads_k, kv_units, p.k_row_stride,
                                 p.k_head_stride, p.k_batch_stride, prm.page_box_rows, "k_cache");
    encode_page_box_map<Element>(&prm.v_pages, p.v, p.head_dim, kv_rows, p.num_heads_k, kv_units, p.v_row_stride,
                                 p.v_head_stride, p.v_batch_stride, prm.page_box_rows, "v_cache");
  }

  auto kernel = &fwd_kernel_sm90<Traits, ScorePolicy, DropoutPolicy, false>;
  constexpr int kSmem = Traits::kSmemBytes;
  constexpr int kCluster = Traits::kClusterSize;
  static SmemOptIn opt_in;
  opt_in_smem(opt_in, kernel, kSmem, "cudaFuncSetAttribute(sm90 forward, max dynamic shared memory)");
  int slots = sm_count();  // CTAs (clusters with kCluster > 1) resident at once
  if constexpr (kCluster > 1) {
    static ClusterSlots cluster_slots;
    slots = max_active_clusters(cluster_slots, kernel, Traits::kThreads, kSmem, kCluster);
    if (slots == 0) return false;
  }

  // The scheduler orders the tiles of one CTA, or with a cluster the groups of kCluster query
  // blocks its CTAs run side by side (cluster_sm90.h).
  const int num_m_blocks = (p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM;
  const int num_m_groups = (num_m_blocks + kCluster - 1) / kCluster;
  const int64_t kv_bytes_per_head = 2ll * p.seqlen_k * p.head_dim * static_cast<int64_t>(sizeof(Element));
  // Causal or windowed tiles differ in length: the longest go first.
  const bool uneven = p.window_left >= 0 || p.window_right >= 0;
  const int num_tiles = num_m_groups * p.batch * p.num_heads;
  int groups = std::min(num_tiles, slots);
  prm.scheduler = TileScheduler::make(num_m_groups, p.batch, p.num_heads, p.num_heads_k, kv_bytes_per_head, uneven,
                                      groups, use_staggered_halves(Traits::kHeadDim), pair_major_choice());

  const auto launch = [&](auto chosen) {
    if constexpr (kCluster > 1) {
      launch_cluster_kernel(chosen, groups * kCluster, Traits::kThreads, kSmem, kCluster, stream, prm);
    } else {
      chosen<<<groups, Traits::kThreads, kSmem, stream>>>(prm);
      check_cuda(cudaGetLastError(), "sm90 forward kernel launch");
    }
  };
  prm.split = TailSplit::off();
  prm.split_partials = nullptr;
  prm.split_counters = nullptr;
  if constexpr (kCanSplit) {
    // The tail split (tail_split.h): its own kernel, with the same shared memory and threads (so
    // the same slots); its workspace is freed on the stream after the kernel.
    // The sequence-bounds kernels cut by the key split (tail_split.h), the others by the tail split.
    const int key_blocks = (p.seqlen_k + Traits::kBlockN - 1) / Traits::kBlockN;
    const int parts = Traits::kSeqBounds ? key_split_parts(split_mode, num_tiles, key_blocks, slots) : 0;
    if (parts > 0 || (!Traits::kSeqBounds && !uneven && use_tail_split(split_mode, num_tiles, key_blocks, slots))) {
      prm.split = parts > 0 ? TailSplit::key_split(num_tiles, parts, slots, &groups)
                            : TailSplit::make(num_tiles, key_blocks, slots, &groups);
      StreamWorkspace workspace(stream);
      prm.split_partials = workspace.floats(prm.split.slots() * tail_slot_floats<Traits>(), false);
      prm.split_counters =
          workspace.ints(static_cast<int64_t>(num_tiles - prm.split.first_tile) * kCluster * Traits::kConsumers);
      auto split_kernel = &fwd_kernel_sm90<Traits, ScorePolicy, DropoutPolicy, true>;
      static SmemOptIn split_opt_in;
      opt_in_smem(split_opt_in, split_kernel, kSmem,
                  "cudaFuncSetAttribute(sm90 forward, tail split, max dynamic shared memory)");
      launch(split_kernel);
      return true;
    }
  }
  launch(kernel);
  return true;
}

template <int kHeadDim, typename Element>
int fwd_smem_bytes_sm90() {
  return Sm90Traits<kHeadDim, Element>::kSmemBytes;
}

// Eight kernels per bucket: plain scores (scale folded into exp2) and transformed scores (softcap,
// ALiBi, a negative scale), each with and without dropout, and each of those with and without
// sequence bounds inside the tensors (varlen, seqused_k; sequence_bounds_sm90.h).  Dropout with
// plain scores has its own kernel: through the transformed one it spilled (ptxas at d64: 1076
// bytes a thread against 8 for plain scores).  Then, in the buckets of two consumers (d128, d256;
// kv_multicast_built), a ninth: plain scores without dropout, left window or bounds (a causal mask
// or right window allowed), its K/V loads shared by two CTAs (cluster_sm90.h; use_kv_multicast).
// And at d64 (short_walk_built) two more: plain scores without dropout, with and without bounds,
// on 64-key blocks for short causal calls (short_walk.h; use_short_walk).  The plain-score kernel
// and the K/V-multicast one each have a twin that walks the tail split's pieces (launched for the
// calls use_tail_split picks: tail_split_choice.h).  The plain-score kernels without dropout (with
// and without bounds) and the short-walk ones test only the right edge in their masks; the first
// two have a twin each with both edges for calls with a left window, which the short-walk kernel
// never serves (left_window_sm90.h; the K/V-multicast kernel keeps both edges).
template <int kHeadDim, typename Element>
void run_fwd_sm90(const FwdKernelArgs& args, const FwdVariant& variant, cudaStream_t stream) {
  using Traits = Sm90Traits<kHeadDim, Element>;
  using BoundsTraits = SequenceBoundsTraits<Traits>;
  const ForwardParams& p = args.params;
  const bool bounds = p.cu_seqlens_q != nullptr || p.seqused_k != nullptr;
  const bool left_window = p.window_left >= 0;  // left_window_sm90.h
  if constexpr (short_walk_built<kHeadDim>()) {
    if (!variant.transformed_scores && !variant.dropout && !left_window &&
        use_short_walk(p.seqlen_k, p.window_right >= 0)) {
      using Short = ShortWalkTraits<kHeadDim, Element>;
      // Masked calls (auto's only use of it) never split: no tail-split kernel for it.
      bounds ? launch_fwd_sm90_variant<SequenceBoundsTraits<Short>, PlainScores, NoDropout, false>(args, stream)
             : launch_fwd_sm90_variant<Short, PlainScores, NoDropout, false>(args, stream);
      return;
    }
  }
  if constexpr (kv_multicast_built<Traits>()) {
    // No left window: the two tiles of a cluster then differ only in their ranges' tops
    // (cta_key_range).  A causal mask is a right window of 0.
    if (!bounds && !left_window && !variant.transformed_scores && !variant.dropout &&
        use_kv_multicast((p.seqlen_q + Traits::kBlockM - 1) / Traits::kBlockM, p.window_right >= 0, kHeadDim) &&
        launch_fwd_sm90_variant<KVMulticastTraits<Traits>, PlainScores, NoDropout>(args, stream)) {
      return;
    }
  }
  const auto launch = [&](auto scores, auto dropout) {
    using Scores = decltype(scores);
    using Dropout = decltype(dropout);
    bounds ? launch_fwd_sm90_variant<BoundsTraits, Scores, Dropout>(args, stream)
           : launch_fwd_sm90_variant<Traits, Scores, Dropout>(args, stream);
  };
  if (variant.transformed_scores) {
    variant.dropout ? launch(ModifiedScores{}, PhiloxDropout{}) : launch(ModifiedScores{}, NoDropout{});
  } else if (variant.dropout) {
    launch(PlainScores{}, PhiloxDropout{});
  } else if (left_window) {
    // The plain kernel's twin whose mask tests the left edge too; windowed tiles never split.
    bounds ? launch_fwd_sm90_variant<LeftWindowTraits<BoundsTraits>, PlainScores, NoDropout, false>(args, stream)
           : launch_fwd_sm90_variant<LeftWindowTraits<Traits>, PlainScores, NoDropout, false>(args, stream);
  } else {
    launch(PlainScores{}, NoDropout{});
  }
}

}  // namespace tileattn::cuda::sm90

#define TILEATTN_INSTANTIATE_FWD_SM90(HEAD_DIM, ELEMENT)                                                     \
  template void tileattn::cuda::sm90::run_fwd_sm90<HEAD_DIM, ELEMENT>(const tileattn::cuda::FwdKernelArgs&, \
                                                                      const tileattn::cuda::FwdVariant&,   \
                                                                      cudaStream_t);                       \
  template int tileattn::cuda::sm90::fwd_smem_bytes_sm90<HEAD_DIM, ELEMENT>();
