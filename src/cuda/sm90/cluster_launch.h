// Host side of the K/V-multicast forward (cluster_sm90.h): whether a call runs it, how many clusters
// fit on the GPU at once, and the launch with a cluster dimension.
#pragma once

#include <cuda_runtime.h>

#include <atomic>

#include "common/env_choice.h"
#include "cuda/check.h"

namespace tileattn::cuda::sm90 {

// TILEATTN_FORWARD_KV_MULTICAST = auto (default) | on | off, read on every call like the family
// variables (kernel_family.h), so a test or an A/B can force either kernel in one process.  auto
// takes the cluster kernel when it measured faster (A/B, perf log, session 24):
//   - tiles of equal length (no mask): when the query blocks pair up with little waste, an even
//     count or at least 16 (the odd block's padding CTA is then under 1/32 of the work): d128
//     +2-10% from 1k tokens, d256 +2-4%, 512 level;
//   - causal or right-windowed tiles: above 32 query blocks (4k tokens at 128 rows): 8k-16k
//     +2-5%, but 512-4k went 0.89-1.06, mostly lower (the first tile of a pair waits for its
//     peer's extra block, and short tiles run in round groups that pairs make coarser).
//   - except at d128 with at most 4 query blocks (512 tokens): there the one-CTA kernel measured
//     +4% and +0.8% in two A/Bs of three runs a side (session 47, after session 44's one-compare
//     mask, which the one-CTA kernel has and the cluster kernel does not), while 768 and 1k
//     tokens ran 0.95 and 0.975 without the cluster, and d256 lost 4-5% without it at 512-1k;
//   - and at d128 above 32 query blocks (from 8k tokens): in four H100 A/Bs (session 56, two
//     orders, three machines) the one-CTA kernel read +0.6 to +1.0% at 16k every time and
//     +0.4% on average at 8k (-1.0 to +1.6), while 2k and 4k scattered around level (2k -5.8 to
//     +2.8%); the H200 read d128 8k 706-707 without the cluster against 701-703 with it at
//     level energy a call (session 48).  d256 keeps the cluster (0.97-0.99 without it, 1k-16k).
// on takes it for every call it can serve (d128 and d256 buckets; cluster_sm90.h), seqlen_q 1
// included, which is how the tests reach the padding CTA.
inline bool use_kv_multicast(int num_m_blocks, bool uneven_tiles, int head_dim) {
  constexpr int kMinUnevenMBlocks = 33;
  constexpr int kMaxOneCtaMBlocksD128 = 4;
  constexpr int kMaxClusterMBlocksD128 = 32;
  const int mode = env_choice("TILEATTN_FORWARD_KV_MULTICAST", {"auto", "on", "off"});
  if (mode != 0) return mode == 1;
  if (uneven_tiles) return num_m_blocks >= kMinUnevenMBlocks;
  if (head_dim == 128 && (num_m_blocks <= kMaxOneCtaMBlocksD128 || num_m_blocks > kMaxClusterMBlocksD128)) {
    return false;
  }
  return num_m_blocks % 2 == 0 || num_m_blocks >= 16;
}

// How many clusters of one kernel the current device runs at once, asked once per device (one per
// kernel template instance): a cluster's CTAs must share a GPC, so with one CTA an SM the count
// can be below sm_count / cluster_size.  0 when none fits (the caller runs the one-CTA kernel).
struct ClusterSlots {
  std::atomic<int> per_device[64] = {};
};

inline cudaLaunchConfig_t cluster_launch_config(int grid, int threads, int smem, int cluster, cudaStream_t stream,
                                                cudaLaunchAttribute* attribute) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  attribute->id = cudaLaunchAttributeClusterDimension;
  attribute->val.clusterDim.x = cluster;
  attribute->val.clusterDim.y = 1;
  attribute->val.clusterDim.z = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  return config;
}

template <typename Kernel>
int max_active_clusters(ClusterSlots& slots, Kernel kernel, int threads, int smem, int cluster) {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  if (device < 64) {
    const int known = slots.per_device[device].load(std::memory_order_relaxed);
    if (known > 0) return known;
  }
  cudaLaunchAttribute attribute;
  const cudaLaunchConfig_t config = cluster_launch_config(cluster, threads, smem, cluster, nullptr, &attribute);
  int count = 0;
  check_cuda(cudaOccupancyMaxActiveClusters(&count, kernel, &config), "cudaOccupancyMaxActiveClusters(sm90 forward)");
  if (count > 0 && device < 64) slots.per_device[device].store(count, std::memory_order_relaxed);
  return count;
}

template <typename Kernel, typename Params>
void launch_cluster_kernel(Kernel kernel, int grid, int threads, int smem, int cluster, cudaStream_t stream,
                           Params const& params) {
  cudaLaunchAttribute attribute;
  const cudaLaunchConfig_t config = cluster_launch_config(grid, threads, smem, cluster, stream, &attribute);
  check_cuda(cudaLaunchKernelEx(&config, kernel, params), "sm90 forward kernel launch (cluster)");
}

}  // namespace tileattn::cuda::sm90
