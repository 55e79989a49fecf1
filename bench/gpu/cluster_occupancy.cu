// How many CTA clusters of a one-CTA-an-SM kernel (384 threads, the sm90 forward's shared-memory
// sizes) the device runs at once: a cluster's CTAs share a GPC, so with GPCs of odd SM counts the
// answer can be under sm_count / cluster.  On the H200 (session 24): 66 clusters of two at every
// size (all 132 SMs), 30 of four (120).  Build and run on the GPU machine:
//   nvcc -O2 -arch=sm_90 -o /tmp/cluster_occupancy bench/gpu/cluster_occupancy.cu && /tmp/cluster_occupancy
#include <cstdio>
#include <cuda_runtime.h>
__global__ void __launch_bounds__(384, 1) k(int* p) { if (p) p[threadIdx.x] = 0; }
int main() {
  int sms = 0; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  for (int smem : {80 << 10, 160 << 10, 200 << 10, 224 << 10}) {
    cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    for (int cluster : {1, 2, 4}) {
      cudaLaunchConfig_t c{}; cudaLaunchAttribute a;
      c.gridDim = dim3(cluster); c.blockDim = dim3(384); c.dynamicSmemBytes = smem;
      a.id = cudaLaunchAttributeClusterDimension; a.val.clusterDim.x = cluster; a.val.clusterDim.y = 1; a.val.clusterDim.z = 1;
      c.attrs = &a; c.numAttrs = 1;
      int n = -1; cudaError_t e = cudaOccupancyMaxActiveClusters(&n, k, &c);
      printf("SMs %d smem %d KB cluster %d: %d clusters (%d CTAs) %s\n", sms, smem >> 10, cluster, n, n * cluster, cudaGetErrorString(e));
    }
  }
}
