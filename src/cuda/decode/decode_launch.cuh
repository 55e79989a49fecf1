// run_decode<T>: the launch sequence append -> split -> combine for one dtype, with the head dim
// rounded up to a bucket of 64, 128 or 256 (the split kernel's V vectors cover 64 dims per 8
// lanes; a smaller head dim is zero-padded in registers, never read past).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>

#include "common/env_choice.h"
#include "cuda/check.h"
#include "cuda/decode/append_kernel.cuh"
#include "cuda/decode/combine_kernel.cuh"
#include "cuda/decode/decode_launch.h"
#include "cuda/decode/split_heuristic.h"
#include "cuda/decode/split_kernel.cuh"
#include "cuda/device_checks.h"  // sm_count
#include "cuda/smem_opt_in.h"
#include "cuda/stream_workspace.h"

namespace tileattn::cuda::decode {

// The TMA ring of the split kernel's loop kTma (kLoopRing, kLoopWideRing or kLoopRingThree).
template <typename T, int kD, int kTma>
using LoopRing = TmaRing<T, kD, kTma>;

// Dynamic shared memory of the split kernel: the TMA ring, or none.  + 1023: the kernel aligns
// the ring's base to 1024 bytes (the 128-byte swizzle's period).  The ring's members, not its
// sizeof (960 bytes of tail padding after `full`): three CTAs an SM (kLoopRingThree) then take
// 3 x (66,623 + 9,072 static + 1,024 reserved) = 230,157 of the H200's 233,472 bytes, where
// sizeof + 1024 would leave under 400 to spare.
template <typename T, int kD, int kTma>
constexpr int split_dynamic_smem() {
  if constexpr (kTma == kLoopRegisters) {
    return 0;
  } else {
    using Ring = LoopRing<T, kD, kTma>;
    static_assert(offsetof(Ring, full) + sizeof(Ring::full) == Ring::kUsedBytes, "k, v and full back to back");
    return Ring::kUsedBytes + 1023;
  }
}

// Resident CTAs of the split kernel over all SMs, which the split heuristic fills (counted on the
// first device that runs it), after the kernel's shared-memory opt-in on the current device.
template <typename T, int kD, int kHalves, int kTma, bool kPages, bool kNewToken>
int prepare_split_kernel() {
  constexpr int dynamic_smem = split_dynamic_smem<T, kD, kTma>();
  const auto kernel = split_kernel<T, kD, kHalves, kTma, kPages, kNewToken>;
  static SmemOptIn opt_in;
  if (dynamic_smem > 0) opt_in_smem(opt_in, kernel, dynamic_smem, "cudaFuncSetAttribute(decode split kernel)");
  static const int resident = [kernel] {
    int per_sm = 0;
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, dynamic_smem),
               "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    return sm_count() * std::max(per_sm, 1);
  }();
  return resident;
}

// Programmatic dependent launch (compute capability 9.0 and later): the split and combine kernels
// are launched while the kernel before them in the stream still runs, and wait in-kernel
// (griddepcontrol.wait, which returns once that kernel has finished and its writes are visible)
// before they read or write anything in global memory.  The combine's launch latency (~2-3 us of
// the ~17 us fixed cost of a 1 x 2k decode call, session 12) then overlaps the split kernel, and
// the split kernel's launch overlaps whatever ran before it (in a decode step, the previous
// layer's last kernel; in bench/gpu/decode.py, the previous call's combine).
inline bool programmatic_launch_supported() {
  static const bool supported = [] {
    int device = 0, major = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
    return major >= 9;
  }();
  return supported;
}

// Clusters of (1, cluster_y, 1): the splits of one (sequence, KV head, row block) together
// (cluster_merge.cuh).  The launch and the occupancy query (cluster_resident) take the same one.
inline cudaLaunchAttribute split_cluster_attribute(int cluster_y) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = 1;
  attribute.val.clusterDim.y = static_cast<unsigned>(cluster_y);
  attribute.val.clusterDim.z = 1;
  return attribute;
}

// cluster_y > 1 (compute capability 9.0 only): the grid's CTAs go in clusters of (1, cluster_y, 1).
template <typename Kernel>
void launch_programmatic(Kernel kernel, dim3 grid, int dynamic_smem, cudaStream_t stream, const DecodeArgs& args,
                         const char* what, int cluster_y = 1) {
  if (!programmatic_launch_supported()) {
    kernel<<<grid, kThreads, dynamic_smem, stream>>>(args);
    check_cuda(cudaGetLastError(), what);
    return;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = static_cast<size_t>(dynamic_smem);
  config.stream = stream;
  cudaLaunchAttribute attributes[2]{};
  attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[0].val.programmaticStreamSerializationAllowed = 1;
  attributes[1] = split_cluster_attribute(cluster_y);
  config.attrs = attributes;
  config.numAttrs = cluster_y > 1 ? 2 : 1;
  check_cuda(cudaLaunchKernelEx(&config, kernel, args), what);
}

// TILEATTN_DECODE_SPLIT_MERGE = auto (default) | combine: `combine` merges every split call's
// partials in the combine kernel, also where a cluster merge applies (for A/B runs and tests of
// both paths).  Read on every call.
inline bool cluster_merge_disabled() { return env_choice("TILEATTN_DECODE_SPLIT_MERGE", {"auto", "combine"}) == 1; }

// CTAs of the split kernel <...> resident at once when launched in clusters of s, for s in
// [2, kMaxClusterSplits] (cudaOccupancyMaxActiveClusters x s, counted once on the first device
// that runs it), or nullptr where the cluster merge does not apply: the register loop, compute
// capability below 9.0, TILEATTN_DECODE_SPLIT_MERGE=combine.
// Call after prepare_split_kernel (the shared-memory opt-in the occupancy query needs).
template <typename T, int kD, int kHalves, int kTma, bool kPages, bool kNewToken>
const int* cluster_resident() {
  if constexpr (kTma == kLoopRegisters) {
    return nullptr;  // the register loop: no clusters
  } else {
    if (!programmatic_launch_supported() || cluster_merge_disabled()) return nullptr;
    static const std::array<int, kMaxClusterSplits + 1> table = [] {
      std::array<int, kMaxClusterSplits + 1> resident{};
      for (int s = 2; s <= kMaxClusterSplits; ++s) {
        cudaLaunchConfig_t config{};
        config.gridDim = dim3(1, s, 1);
        config.blockDim = dim3(kThreads);
        config.dynamicSmemBytes = split_dynamic_smem<T, kD, kTma>();
        cudaLaunchAttribute attribute = split_cluster_attribute(s);
        config.attrs = &attribute;
        config.numAttrs = 1;
        int clusters = 0;
        check_cuda(cudaOccupancyMaxActiveClusters(&clusters, split_kernel<T, kD, kHalves, kTma, kPages, kNewToken>, &config),
                   "cudaOccupancyMaxActiveClusters(decode split kernel)");
        resident[s] = clusters * s;
      }
      return resident;
    }();
    return table.data();
  }
}

// The split plan the kernel <T, kD, kHalves, kTma, kPages, kNewToken> runs with: the caller's split
// count or the heuristic's, and whether the splits merge in a cluster.
template <typename T, int kD, int kHalves, int kTma, bool kPages = false, bool kNewToken = false>
SplitPlan split_plan(const DecodeArgs& args) {
  constexpr int step = kTma != kLoopRegisters ? LoopRing<T, kD, kTma>::kKeys : kChunk;  // keys a warp takes at a time
  const int resident = prepare_split_kernel<T, kD, kHalves, kTma, kPages, kNewToken>();
  return choose_split_plan(args.num_splits, split_ctas(args), resident,
                           cluster_resident<T, kD, kHalves, kTma, kPages, kNewToken>(), args.p.fwd.seqlen_k, step);
}

// The workspace of `splits` partial results: O (splits, B, H, Sq, D) then LSE (splits, B, H, Sq),
// float32, each starting on a 256-byte boundary; none for one split.
struct PartialLayout {
  int64_t lse_offset, bytes;
};

inline PartialLayout partial_layout(int splits, const tileattn_fwd_params& f) {
  if (splits <= 1) return {0, 0};
  const auto round_up = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  const int64_t rows = static_cast<int64_t>(splits) * f.batch * f.num_heads * f.seqlen_q;
  const int64_t o_bytes = round_up(rows * f.head_dim * static_cast<int64_t>(sizeof(float)));
  return {o_bytes, o_bytes + round_up(rows * static_cast<int64_t>(sizeof(float)))};
}

// The head-dim bucket and row count of a call as types: fn(Bucket<kD, kHalves>{}) for the split
// kernel that serves it.  At most 8 rows a CTA (one KV group's heads x seqlen_q) take the kernel
// without the padded rows (kHalves = 1).  One dispatch for the size query and the launch, so the
// two cannot disagree on the kernel.
template <int D, int Halves>
struct Bucket {
  static constexpr int kD = D;
  static constexpr int kHalves = Halves;
};

template <typename Fn>
decltype(auto) with_bucket(const DecodeArgs& args, Fn&& fn) {
  const int head_dim = args.p.fwd.head_dim;
  const bool half_rows = args.rows <= kRows / 2;
  if (head_dim <= 64) return half_rows ? fn(Bucket<64, 1>{}) : fn(Bucket<64, 2>{});
  if (head_dim <= 128) return half_rows ? fn(Bucket<128, 1>{}) : fn(Bucket<128, 2>{});
  return half_rows ? fn(Bucket<256, 1>{}) : fn(Bucket<256, 2>{});
}

template <typename T>
void run_append(const DecodeArgs& args, cudaStream_t stream) {
  launch_programmatic(append_kernel<T>, dim3(args.p.seqlen_new, args.p.fwd.batch), 0, stream, args,
                      "decode append kernel launch");
}

// append -> split -> combine with the kernel <T, kD, kHalves, kTma, kPages, kNewToken>.  The split
// count is chosen once, and the caller's workspace is checked against that count before anything
// is launched, so a refused call changes nothing (the append writes into the cache).  With
// kNewToken the split kernel appends the call's one new token itself: no append kernel.
template <typename T, int kD, int kHalves, int kTma, bool kPages, bool kNewToken>
void launch_decode(DecodeArgs args, cudaStream_t stream) {
  const tileattn_fwd_params& f = args.p.fwd;
  constexpr int dynamic_smem = split_dynamic_smem<T, kD, kTma>();
  const auto split = split_kernel<T, kD, kHalves, kTma, kPages, kNewToken>;
  const SplitPlan plan = split_plan<T, kD, kHalves, kTma, kPages, kNewToken>(args);
  args.num_splits = plan.splits;
  args.cluster_merge = plan.cluster;  // no partials, no combine kernel (cluster_merge.cuh)
  const PartialLayout layout = partial_layout(args.cluster_merge ? 1 : args.num_splits, f);
  require_workspace(args.p, layout.bytes);
  if (args.p.k_new != nullptr && !kNewToken) run_append<T>(args, stream);
  const dim3 grid(static_cast<unsigned>(split_ctas(args)), args.num_splits);
  if (args.num_splits == 1 || args.cluster_merge) {
    launch_programmatic(split, grid, dynamic_smem, stream, args, "decode split kernel launch",
                        args.cluster_merge ? args.num_splits : 1);
    return;
  }
  std::optional<StreamWorkspace> pool;  // when the caller gave no workspace; freed on the stream after the combine
  char* base = static_cast<char*>(args.p.workspace);
  if (base == nullptr) base = reinterpret_cast<char*>(pool.emplace(stream).floats(layout.bytes / sizeof(float), false));
  args.o_partial = reinterpret_cast<float*>(base);
  args.lse_partial = reinterpret_cast<float*>(base + layout.lse_offset);
  launch_programmatic(split, grid, dynamic_smem, stream, args, "decode split kernel launch");
  const int64_t rows = static_cast<int64_t>(f.batch) * f.num_heads * f.seqlen_q;  // one combine CTA a row
  launch_programmatic(combine_kernel<T>, dim3(static_cast<unsigned>(rows)), 0, stream, args,
                      "decode combine kernel launch");
}

// fn(std::integral_constant<int, kLoop>{}) for the TMA ring `ring` names where the bucket
// <kD, kHalves> builds it: the wide ring at d128, the three-CTA ring at d128 with at most 8 rows;
// else the narrow ring.
template <int kD, int kHalves, typename Fn>
decltype(auto) with_ring(int ring, Fn&& fn) {
  if constexpr (kD == 128) {
    if (ring == kLoopWideRing) return fn(std::integral_constant<int, kLoopWideRing>{});
    if constexpr (kHalves == 1) {
      if (ring == kLoopRingThree) return fn(std::integral_constant<int, kLoopRingThree>{});
    }
  }
  return fn(std::integral_constant<int, kLoopRing>{});
}

// The most workspace a call can need: over the register kernel and, when args.tma says the call
// may take it (the pointers decide at launch), the TMA kernels of its ring, whose split count can
// differ.
template <typename T>
int64_t workspace_bytes(const DecodeArgs& args) {
  return with_bucket(args, [&](auto bucket) {
    using B = decltype(bucket);
    int splits = split_plan<T, B::kD, B::kHalves, kLoopRegisters>(args).splits;
    const auto ring_splits = [&](auto loop) {
      constexpr int kLoop = decltype(loop)::value;
      return std::max({split_plan<T, B::kD, B::kHalves, kLoop, false>(args).splits,
                       split_plan<T, B::kD, B::kHalves, kLoop, true>(args).splits,
                       split_plan<T, B::kD, B::kHalves, kLoop, false, true>(args).splits,
                       split_plan<T, B::kD, B::kHalves, kLoop, true, true>(args).splits});
    };
    if (args.tma && args.p.fwd.head_dim == B::kD) {
      with_ring<B::kD, B::kHalves>(args.ring, [&](auto loop) { splits = std::max(splits, ring_splits(loop)); });
    }
    return partial_layout(splits, args.p.fwd).bytes;
  });
}

// fn(std::bool_constant<kPages>{}, std::bool_constant<kNewToken>{}) for a TMA ring's call: the page
// window when `pages` (each block lies in one page), the split kernel's own append when the call
// brings exactly one new token.
template <typename Fn>
decltype(auto) with_ring_kernel_flags(const DecodeArgs& args, bool pages, Fn&& fn) {
  const bool new_token = args.p.k_new != nullptr && args.p.seqlen_new == 1;
  if (pages) return new_token ? fn(std::true_type{}, std::true_type{}) : fn(std::true_type{}, std::false_type{});
  return new_token ? fn(std::false_type{}, std::true_type{}) : fn(std::false_type{}, std::false_type{});
}

// The TMA kernel of the call's ring when the caller set it up (cuda_decode.cu) for exactly this
// head dim (the tensor map's box is kD wide), with the page window when each block lies in one page
// and appending the call's new token itself when there is exactly one (one token a sequence a
// step: a serving step; 1 x 2k +12%, perf log, session 30); else the register kernel, after the
// append kernel.  The wide and three-CTA rings are built at d128 only.
template <typename T, int kD, int kHalves, int kLoop>
void launch_ring(const DecodeArgs& args, cudaStream_t stream) {
  const bool pages = args.p.block_table != nullptr && args.tma_box_keys == LoopRing<T, kD, kLoop>::kKeys;
  with_ring_kernel_flags(args, pages, [&](auto kPages, auto kNewToken) {
    launch_decode<T, kD, kHalves, kLoop, decltype(kPages)::value, decltype(kNewToken)::value>(args, stream);
  });
}

template <typename T>
void run_decode(DecodeArgs args, cudaStream_t stream) {
  with_bucket(args, [&](auto bucket) {
    using B = decltype(bucket);
    if (args.tma && args.p.fwd.head_dim == B::kD) {
      with_ring<B::kD, B::kHalves>(
          args.ring, [&](auto loop) { launch_ring<T, B::kD, B::kHalves, decltype(loop)::value>(args, stream); });
    } else {
      launch_decode<T, B::kD, B::kHalves, kLoopRegisters, false, false>(args, stream);
    }
  });
}

// The plan of ring `loop`'s kernel at d128 (the kernel launch_ring would take: the caller passes
// a paged call only with pages of whole blocks of that ring) and the CTAs an SM it runs: the
// resident count over all SMs, as the heuristic fills it.  A cluster plan counts against the same
// resident count: a first version of the wide ring's rule counted clusters against their own
// residency (cudaOccupancyMaxActiveClusters, a few CTAs fewer in clusters of 3-8) and measured the
// same within 1% (session 45).  A ring the bucket does not build gives the narrow ring's plan, as
// with_ring launches it.
template <typename T>
RingWave ring_wave(const DecodeArgs& args, int loop) {
  return with_bucket(args, [&](auto bucket) {
    using B = decltype(bucket);
    return with_ring_kernel_flags(args, args.p.block_table != nullptr, [&](auto kPages, auto kNewToken) {
      constexpr bool kP = decltype(kPages)::value, kN = decltype(kNewToken)::value;
      return with_ring<B::kD, B::kHalves>(loop, [&](auto ring) {
        constexpr int kLoop = decltype(ring)::value;
        const SplitPlan plan = split_plan<T, B::kD, B::kHalves, kLoop, kP, kN>(args);
        return RingWave{split_ctas(args) * plan.splits, plan.splits,
                        prepare_split_kernel<T, B::kD, B::kHalves, kLoop, kP, kN>()};
      });
    });
  });
}

#define TILEATTN_INSTANTIATE_DECODE(T)                    \
  template void run_decode<T>(DecodeArgs, cudaStream_t); \
  template void run_append<T>(const DecodeArgs&, cudaStream_t); \
  template int64_t workspace_bytes<T>(const DecodeArgs&); \
  template RingWave ring_wave<T>(const DecodeArgs&, int);

}  // namespace tileattn::cuda::decode
