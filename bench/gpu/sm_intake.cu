// How fast one SM can pull a stream from HBM, by load path: the question behind the decode's mid
// batches (docs/cuda-decode.md, "Next").  Unsplit with the TMA loop, 8 x 32k (64 CTAs, one an SM)
// streamed ~34 GB/s a CTA and two CTAs an SM ~33 GB/s an SM, while 64 SMs could draw 4.8 TB/s /
// 64 = 75 GB/s each from HBM; a third TMA stage changed nothing (session 36).  This streams a
// 2 GiB buffer (40x the L2) once, each CTA its own contiguous slice, each of its 4 (or 8) warps
// every 4th (8th) piece of it (the decode's order), through one of:
//   tma    a warp's ring of `stages` pieces of `rows` x 128 B (one 64-dim bf16 slab, 128-byte
//          swizzle, L2 evict_first) in `boxes` boxes on one barrier, lane 0 re-arming a stage
//          once the warp has read it;
//   bulk   the same ring filled by cp.async.bulk (1-D, no tensor map), `rows` x 128 B a stage;
//   async  the same ring filled by cp.async 16 B a lane (LDGSTS, what cuDNN's decode uses);
//   ldg    no ring: each lane keeps `stages` pieces' 16-byte ld.global.nc loads in flight (16 rows);
//   tma-cta  one ring for the CTA: a stage holds a round of every warp's piece on one barrier;
//   tma-test, tma-hint, tma-lanes  tma with the wait a test_wait spin, try_wait with a 0 ns suspend
//          hint, or stage s's boxes issued by lane s;
//   ldg-sts  the ldg path's pieces stored to shared memory and read back from there;
// and prints GB/s in all and per SM used (the CTAs' %smid), with 64, 132 or 264 CTAs placed one or
// two an SM (padding shared memory so no more fit).  A warp reads 16 B a lane of each piece it
// consumes, so every path ends in the same XOR the compiler cannot drop.
// What it showed on the H200 (session 37, bench/results/h200-sm-intake-2026-12-03.txt): with the
// copies into shared memory a CTA's rate is set by its warps and the bytes a warp takes a step,
// not by the pieces in flight: 4 warps at 2 KB a step ~9-13 GB/s with 2, 4 or 8 stages, by TMA,
// bulk copy or cp.async alike; 8 KB a step ~30-34 (one box or four on one barrier), 16 KB ~48-69;
// 8 warps twice 4 warps' rate: a warp's piece costs ~0.7-0.9 us whatever is queued behind it.
// Session 39 (bench/results/h200-sm-intake-paths-2026-12-03.txt): ld.global into registers does
// not follow that law (2, 4, 8 pieces in flight a warp: 21, 35, 48 GB/s an SM at 64 SMs, against
// cp.async's 12.8 and 12.4 and TMA's 9.2 at 8), and where the pieces lie (a CTA's own slice, one
// front across the CTAs, scattered at 64 CTAs) moves the copies' rates by under 20% (ld.global's
// fell from 48 to 13 scattered).  Session 40 (bench/results/h200-sm-intake-suspects-2026-12-03.txt):
// tma-cta streams at ~0.6x the per-warp rings; tma-test, tma-hint and tma-lanes level with tma; ldg-sts
// 38.9 GB/s an SM against ldg's 46.7 and tma's 8.7.  So not the wait, the issuing thread or the
// shared-memory writes: what serializes one warp's copies is inside the asynchronous copy path.
// Build here, run on the GPU machine:
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc -Iinclude \
//     -o build-final2/sm_intake bench/gpu/sm_intake.cu
//   ./build-final2/sm_intake            (about 20 s; one line per configuration)
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <set>
#include <vector>

#include "cuda/check.h"
#include "cuda/decode/tma_ring.cuh"
#include "cuda/tensor_map_encoder.h"

using namespace tileattn::cuda::decode;
using tileattn::cuda::check_cuda;

namespace {

constexpr int kMaxWarps = 8;
constexpr int kMaxStages = 8;
constexpr int64_t kBufferBytes = int64_t{2} << 30;
constexpr int kRowBytes = 128;

enum Path { kTma, kBulk, kAsync, kLdg, kTmaCta, kTmaTest, kTmaHint, kTmaLanes, kLdgSts };
const char* path_name(int p) {
  static const char* const names[] = {"tma",      "bulk",     "async",     "ldg",    "tma-cta",
                                      "tma-test", "tma-hint", "tma-lanes", "ldg-sts"};
  return names[p];
}

struct Config {
  int path, rows, stages;  // rows: 128-byte rows a piece (a stage); ldg: `stages` loads a lane in flight
  int fence;               // tma, bulk: lane 0 fences the async proxy before each request (the decode's)
  int boxes;               // tma: a piece comes as this many boxes of rows / boxes rows on one barrier
  int warps;               // warps a CTA (4 in the decode)
  int order;               // where a CTA's pieces lie: 0 its own contiguous slice; 1 the CTAs'
                           // pieces interleaved (one front across the buffer); 2 scattered by a hash
  int64_t rows_per_cta;
};

// Order 2's multiplier: a prime, so the scatter is a bijection of the pieces unless their count is
// a multiple of it (main() checks).  Session 39's run used 40503 = 3 x 13501, which skipped every
// grid but 64 CTAs.
constexpr int64_t kScatterMultiplier = 1000003;

// The first row of CTA `cta`'s piece p (of `pieces` a CTA, `ctas` CTAs).  Order 2 multiplies the
// piece's order-1 index by kScatterMultiplier modulo the piece count, so consecutive pieces of a
// warp land far apart.
__device__ __forceinline__ int64_t piece_row(const Config& c, int64_t cta, int64_t p, int64_t pieces, int64_t ctas) {
  if (c.order == 0) return cta * c.rows_per_cta + p * c.rows;
  const int64_t g = p * ctas + cta;
  if (c.order == 1) return g * c.rows;
  return g * kScatterMultiplier % (pieces * ctas) * c.rows;
}

// A piece of `rows` rows from `row` into dst, as `boxes` TMA boxes on barrier `bar`.
__device__ __forceinline__ void tma_load_piece(const CUtensorMap* map, unsigned char* dst, uint64_t* bar, int64_t row,
                                               int rows, int boxes, uint64_t policy) {
  const int box_rows = rows / boxes;
  for (int b = 0; b < boxes; ++b) {
    tma_load_4d(map, dst + b * box_rows * kRowBytes, bar, 0, static_cast<int>(row) + b * box_rows, 0, 0, policy);
  }
}

__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          smem_address(dst)),
      "l"(src), "r"(bytes), "r"(smem_address(bar)), "l"(policy)
      : "memory");
}

__device__ __forceinline__ void async_16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_address(dst)), "l"(src) : "memory");
}

__device__ __forceinline__ uint4 ldg_16(const void* src) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(src));
  return v;
}

// mbarrier waits other than the decode's try_wait loop (mbarrier_wait): a test_wait spin, which
// never suspends the thread, and try_wait with a suspend-time hint of 0 ns.  If the per-warp law
// were the blocking wait's wake-up, these would lift it.
__device__ __forceinline__ void mbarrier_spin(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "spin_%=:\n"
      "mbarrier.test_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra spin_%=;\n"
      "}\n" ::"r"(smem_address(bar)),
      "r"(parity)
      : "memory");
}

__device__ __forceinline__ void mbarrier_wait_hint(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "hint_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1, %2;\n"
      "@!done bra hint_%=;\n"
      "}\n" ::"r"(smem_address(bar)),
      "r"(parity), "r"(0)
      : "memory");
}

// Pieces of `rows` rows: warp w of a CTA takes pieces w, w + 4, ... of the CTA's slice.
__global__ void __launch_bounds__(kMaxWarps * 32) stream(const __grid_constant__ CUtensorMap map, const unsigned char* buf,
                                                      Config c, uint32_t* sink, int* smid) {
  extern __shared__ unsigned char smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) asm volatile("mov.u32 %0, %%smid;" : "=r"(smid[blockIdx.x]));
  const int64_t pieces = c.rows_per_cta / c.rows;
  const int piece_bytes = c.rows * kRowBytes;
  uint4 acc = make_uint4(0, 0, 0, 0);
  auto fold = [&](uint4 v) { acc.x ^= v.x, acc.y ^= v.y, acc.z ^= v.z, acc.w ^= v.w; };
  auto fold_piece = [&](const unsigned char* piece) {  // this lane's 16 B of each 512
    for (int o = lane * 16; o < piece_bytes; o += 512) fold(*reinterpret_cast<const uint4*>(piece + o));
  };
  // ldg-sts: the ldg path's registers stored into shared memory and folded from there (the copy a
  // loop would make if K/V came through registers into its ring).
  unsigned char* const staging = smem + warp * kMaxStages * 2048;
  if (c.path == kLdg || c.path == kLdgSts) {
    // Pieces of 16 rows: a lane reads 16 B of each 512 B, 4 loads a piece; `stages` pieces' loads
    // are all issued before the first is folded.
    for (int64_t p = warp; p < pieces; p += c.warps * int64_t{c.stages}) {
      uint4 v[kMaxStages][4];
#pragma unroll
      for (int s = 0; s < kMaxStages; ++s) {
        const int64_t q = p + s * c.warps;
        const unsigned char* base = buf + piece_row(c, blockIdx.x, q, pieces, gridDim.x) * kRowBytes + lane * 16;
#pragma unroll
        for (int k = 0; k < 4; ++k) v[s][k] = s < c.stages && q < pieces ? ldg_16(base + 512 * k) : make_uint4(0, 0, 0, 0);
      }
      if (c.path == kLdgSts) {
#pragma unroll
        for (int s = 0; s < kMaxStages; ++s) {
#pragma unroll
          for (int k = 0; k < 4; ++k) *reinterpret_cast<uint4*>(staging + s * 2048 + 512 * k + lane * 16) = v[s][k];
        }
        __syncwarp();
#pragma unroll
        for (int s = 0; s < kMaxStages; ++s) {
#pragma unroll
          for (int k = 0; k < 4; ++k) {  // a neighbour lane's 16 B, so the loads cannot be forwarded from the stores
            v[s][k] = *reinterpret_cast<const uint4*>(staging + s * 2048 + 512 * k + (lane + 1) % 32 * 16);
          }
        }
        __syncwarp();
      }
#pragma unroll
      for (int s = 0; s < kMaxStages; ++s) {
#pragma unroll
        for (int k = 0; k < 4; ++k) fold(v[s][k]);
      }
    }
    if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x12345678u) sink[blockIdx.x] = acc.y;
    return;
  }
  // The 128-byte swizzle needs 1024-byte aligned stages (the launch adds 1 KB for this).
  unsigned char* const aligned = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem) + 1023) & ~uintptr_t{1023});
  if (c.path == kTmaCta) {
    // One ring for the CTA: stage s holds one round of every warp's piece (warp w's i-th piece in
    // stage i % stages, slot w), all on one barrier that thread 0 arms and refills once every
    // warp has read the stage (`empty`, one arrival a warp): does a barrier's worth of bytes, not
    // a warp's, set the rate?
    __shared__ uint64_t cta_full[kMaxStages], cta_empty[kMaxStages];
    if (threadIdx.x == 0) {
      for (int s = 0; s < c.stages; ++s) mbarrier_init(&cta_full[s], 1), mbarrier_init(&cta_empty[s], c.warps);
      fence_barrier_init();
    }
    __syncthreads();
    const uint64_t policy = l2_evict_first_policy();
    const int64_t rounds = pieces / c.warps;  // rows_per_cta is a multiple of rows x warps
    auto request_round = [&](int64_t i) {
      if (i >= rounds) return;
      uint64_t* bar = &cta_full[i % c.stages];
      if (c.fence) fence_proxy_async();
      mbarrier_arrive_expect_tx(bar, c.warps * piece_bytes);
      unsigned char* dst = aligned + (i % c.stages) * c.warps * piece_bytes;
      for (int w = 0; w < c.warps; ++w) {
        tma_load_piece(&map, dst + w * piece_bytes, bar, piece_row(c, blockIdx.x, i * c.warps + w, pieces, gridDim.x),
                       c.rows, c.boxes, policy);
      }
    };
    if (threadIdx.x == 0) {
      for (int s = 0; s < c.stages; ++s) request_round(s);
    }
    for (int64_t i = 0; i < rounds; ++i) {
      const int s = static_cast<int>(i % c.stages);
      const uint32_t parity = static_cast<uint32_t>((i / c.stages) & 1);
      mbarrier_wait(&cta_full[s], parity);
      fold_piece(aligned + (s * c.warps + warp) * piece_bytes);
      __syncwarp();
      if (lane == 0) mbarrier_arrive(&cta_empty[s]);
      if (threadIdx.x == 0) {
        mbarrier_wait(&cta_empty[s], parity);
        request_round(i + c.stages);
      }
      __syncwarp();
    }
    if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x12345678u) sink[blockIdx.x] = acc.y;
    return;
  }
  unsigned char* ring = aligned + warp * c.stages * piece_bytes;
  __shared__ uint64_t full[kMaxWarps][kMaxStages];
  const uint64_t policy = l2_evict_first_policy();
  auto request = [&](int64_t i) {  // the warp's i-th piece into stage i % stages
    const int64_t p = warp + i * c.warps;
    if (p >= pieces) return;
    unsigned char* dst = ring + (i % c.stages) * piece_bytes;
    const int64_t row = piece_row(c, blockIdx.x, p, pieces, gridDim.x);
    if (c.path == kAsync) {
      for (int o = lane * 16; o < piece_bytes; o += 512) async_16(dst + o, buf + row * kRowBytes + o);
      asm volatile("cp.async.commit_group;" ::: "memory");
      return;
    }
    // tma-lanes: stage s's requests come from lane s (is the law per issuing thread?).
    if (lane != (c.path == kTmaLanes ? static_cast<int>(i % c.stages) : 0)) return;
    uint64_t* bar = &full[warp][i % c.stages];
    if (c.fence) fence_proxy_async();
    mbarrier_arrive_expect_tx(bar, piece_bytes);
    if (c.path != kBulk) {
      tma_load_piece(&map, dst, bar, row, c.rows, c.boxes, policy);
    } else {
      bulk_load(dst, buf + row * kRowBytes, piece_bytes, bar, policy);
    }
  };
  if (lane == 0) {
    for (int s = 0; s < c.stages; ++s) mbarrier_init(&full[warp][s], 1);
    fence_barrier_init();
  }
  __syncwarp();
  for (int s = 0; s < c.stages; ++s) request(s);
  const int64_t mine = pieces > warp ? (pieces - warp + c.warps - 1) / c.warps : 0;
  for (int64_t i = 0; i < mine; ++i) {
    const unsigned char* stage = ring + (i % c.stages) * piece_bytes;
    if (c.path == kAsync) {
      // Groups complete in order: at most stages - 1 younger ones may still be in flight.
      const int64_t younger = mine - 1 - i < c.stages - 1 ? mine - 1 - i : c.stages - 1;
      switch (younger) {
        case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
        case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
        case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
        case 3: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
        case 4: asm volatile("cp.async.wait_group 4;" ::: "memory"); break;
        case 5: asm volatile("cp.async.wait_group 5;" ::: "memory"); break;
        case 6: asm volatile("cp.async.wait_group 6;" ::: "memory"); break;
        default: asm volatile("cp.async.wait_group 7;" ::: "memory"); break;
      }
      __syncwarp();
    } else {
      uint64_t* bar = &full[warp][i % c.stages];
      const uint32_t parity = static_cast<uint32_t>((i / c.stages) & 1);
      if (c.path == kTmaTest) {
        mbarrier_spin(bar, parity);
      } else if (c.path == kTmaHint) {
        mbarrier_wait_hint(bar, parity);
      } else {
        mbarrier_wait(bar, parity);
      }
    }
    fold_piece(stage);
    __syncwarp();
    request(i + c.stages);
  }
  if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x12345678u) sink[blockIdx.x] = acc.y;
}

// The buffer as bf16 rows of 64 (128 B), boxes of `rows` rows, 128-byte swizzle (the decode's).
CUtensorMap row_map(void* buf, int rows) {
  CUtensorMap map{};
  const cuuint64_t dims[4] = {64, static_cast<cuuint64_t>(kBufferBytes / kRowBytes), 1, 1};
  const cuuint64_t strides[3] = {kRowBytes, static_cast<cuuint64_t>(kBufferBytes), static_cast<cuuint64_t>(kBufferBytes)};
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(rows), 1, 1}, unit[4] = {1, 1, 1, 1};
  const tileattn::cuda::TensorMapEncoder encode = tileattn::cuda::tensor_map_encoder();
  if (encode == nullptr) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled not found\n");
    std::exit(1);
  }
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, buf, dims, strides, box, unit,
                               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "tensor map encode failed (%d) for %d rows\n", static_cast<int>(r), rows);
    std::exit(1);
  }
  return map;
}

}  // namespace

int main() {
  int sms = 0, smem_per_sm = 0;
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, 0),
             "cudaDeviceGetAttribute");
  unsigned char* buf = nullptr;
  uint32_t* sink = nullptr;
  int* smid = nullptr;
  check_cuda(cudaMalloc(&buf, kBufferBytes), "cudaMalloc");
  check_cuda(cudaMemset(buf, 1, kBufferBytes), "cudaMemset");
  check_cuda(cudaMalloc(&sink, 4096 * sizeof(uint32_t)), "cudaMalloc");
  check_cuda(cudaMalloc(&smid, 4096 * sizeof(int)), "cudaMalloc");
  check_cuda(cudaFuncSetAttribute(stream, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10),
             "cudaFuncSetAttribute");
  cudaEvent_t start, stop;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  std::printf("path,rows,stages,fence,boxes,warps,order,ctas,per_sm,sms_used,bytes,us,gbs,gbs_per_sm\n");
  struct Shape {
    int path, rows, stages, fence, boxes, warps;
  };
  // Session 37: 16-row boxes gave ~12.3 GB/s a CTA at 2, 4 and 8 stages alike, with or without the
  // fence, and 64-row boxes ~42: a cost a request, not latency.  Four boxes of 16 rows on one
  // barrier stream as one box of 64, and 8 warps a CTA twice 4 (bench/results/h200-sm-intake-*).
  // Session 38 measured one stage a warp of 16-32 KB.  The rows below (session 39): the CTA-wide
  // ring (tma-cta) beside per-warp rings of the same pieces, then each path at 2 to 8 pieces in
  // flight a warp; SM_INTAKE_ORDERS=3 runs each also with the CTAs' pieces on one front (order 1)
  // and scattered (2), to ask whether the per-warp law is the addresses'.
  // Session 40: the per-warp law's suspects, each beside plain tma: the blocking wait's wake-up
  // (tma-test spins on test_wait, tma-hint passes try_wait a 0 ns suspend hint), one issuing lane
  // (tma-lanes: stage s's box from lane s), and shared-memory stores (ldg-sts).
  const std::vector<Shape> shapes = {
      {kTma, 16, 8, 1, 1, 4},      {kTmaTest, 16, 8, 1, 1, 4},  {kTmaHint, 16, 8, 1, 1, 4}, {kTmaLanes, 16, 8, 1, 1, 4},
      {kTma, 64, 2, 1, 4, 4},      {kTmaTest, 64, 2, 1, 4, 4},  {kTmaLanes, 64, 2, 1, 4, 4}, {kLdg, 16, 8, 0, 1, 4},
      {kLdgSts, 16, 8, 0, 1, 4},   {kLdgSts, 16, 4, 0, 1, 4}};
  const int orders = std::getenv("SM_INTAKE_ORDERS") ? std::atoi(std::getenv("SM_INTAKE_ORDERS")) : 1;
  for (const Shape& s : shapes) for (int order = 0; order < orders; ++order) {
    const CUtensorMap map = row_map(buf, s.rows / s.boxes);
    for (int ctas : {64, sms, 2 * sms}) {
      for (int per_sm : {1, 2}) {
        if (per_sm != (ctas > sms ? 2 : 1)) continue;  // two an SM only where one an SM cannot hold the grid
        const int ring = s.path == kLdg      ? 0
                         : s.path == kLdgSts ? s.warps * kMaxStages * 2048
                                             : s.warps * s.stages * s.rows * kRowBytes + 1024;
        // Pad the shared memory so at most per_sm CTAs share an SM (1 KB a CTA is the system's).
        const int pad = smem_per_sm / (per_sm + 1) + 1024;
        const int dynamic = ring > pad ? ring : pad;
        if (per_sm * (dynamic + 2048) > smem_per_sm || dynamic > (200 << 10)) continue;
        Config c{s.path, s.rows, s.stages, s.fence, s.boxes, s.warps, order, 0};
        c.rows_per_cta = kBufferBytes / kRowBytes / ctas / (s.rows * s.warps) * (s.rows * s.warps);
        const int64_t all_pieces = c.rows_per_cta / s.rows * ctas;
        if (order == 2 && std::gcd(all_pieces, kScatterMultiplier) != 1) {
          std::fprintf(stderr, "order 2: %lld pieces share a factor with the hash\n", static_cast<long long>(all_pieces));
          continue;
        }
        for (int rep = 0; rep < 2; ++rep) {  // the first run is a warm-up
          check_cuda(cudaEventRecord(start), "cudaEventRecord");
          stream<<<ctas, s.warps * 32, dynamic>>>(map, buf, c, sink, smid);
          check_cuda(cudaEventRecord(stop), "cudaEventRecord");
          check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
          check_cuda(cudaGetLastError(), "cudaGetLastError");
        }
        float ms = 0.0f;
        check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
        std::vector<int> ids(ctas);
        check_cuda(cudaMemcpy(ids.data(), smid, ctas * sizeof(int), cudaMemcpyDeviceToHost), "cudaMemcpy");
        const std::set<int> used(ids.begin(), ids.end());
        const double bytes = static_cast<double>(c.rows_per_cta) * kRowBytes * ctas;
        const double gbs = bytes / (ms * 1e6);
        std::printf("%s,%d,%d,%d,%d,%d,%d,%d,%d,%zu,%.0f,%.1f,%.0f,%.1f\n", path_name(s.path), s.rows, s.stages, s.fence,
                    s.boxes, s.warps, order, ctas, per_sm,
                    used.size(), bytes, ms * 1e3, gbs, gbs / used.size());
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
