// tileattn::cuda_forward_kvcache: the checks only the CUDA side can make (architecture, device
// pointers, alignment, grid limits), then the decode launch for the dtype.  Nothing here reads
// device memory, so a call is one stream-ordered sequence that a CUDA graph can capture.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <utility>

#include "api/backends.h"
#include "common/env_choice.h"
#include "cuda/check.h"
#include "cuda/decode/decode_launch.h"
#include "cuda/decode/kvcache_forward_route.h"
#include "cuda/device_checks.h"
#include "cuda/forward_kernels.h"
#include "cuda/index_poison.h"
#include "cuda/kernel_family.h"
#include "cuda/stream_workspace.h"
#include "cuda/tensor_map_encoder.h"
#include "cuda/vector_aligned.h"

namespace tileattn {
namespace {

// The cache (units, rows, Hk, D) as the 4-D tensor (D, Hk, rows, units) that a TMA box of
// (64, 1, box_keys, 1) reads one 128-byte column slab of box_keys keys of one KV head from, with the
// 128-byte swizzle (tma_block_loop.cuh reads the slabs with ldmatrix) and no L2 promotion (a
// 256-byte promotion of 128-byte rows cost 8-15%, tma_ring.cuh).  False when the driver
// refuses it (strides TMA cannot express): the caller then uses the register kernel.
bool encode_cache_map(CUtensorMap* map, const void* base, CUtensorMapDataType dtype, int head_dim, int heads_k,
                      int64_t rows, int64_t units, int64_t head_stride, int64_t row_stride, int64_t unit_stride,
                      int box_keys) {
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(heads_k),
                              static_cast<cuuint64_t>(rows), static_cast<cuuint64_t>(units)};
  const cuuint32_t box[4] = {64, 1, static_cast<cuuint32_t>(box_keys), 1};
  return cuda::encode_swizzled_map_4d(map, dtype, base, dims, {head_stride, row_stride, unit_stride}, box,
                                      CU_TENSOR_MAP_L2_PROMOTION_NONE);
}

// Where TMA staging is chosen under TILEATTN_DECODE_FAMILY=auto: calls with the split heuristic
// (num_splits = 0) whose TMA boxes are whole blocks (contiguous caches, pages a multiple of the
// block: 16 keys at d128 and d256, 32 at d64).  Measured on the H200 (docs/perf-log.md, session
// 15, both loops in one run), TMA against registers: contiguous +4% (1 x 2k) to +20% (128 x 2k),
// 8 x 32k +6%, 32 x 128k +4%; pages of 256 likewise; boxes smaller than the block (then pages of 16
// under 32-key blocks, 8 TMA loads a block) -15% (1 x 32k) to -25% (32 x 32k), so those calls stay
// on the register loop.  A fixed num_splits promises the same bits
// at every batch size, so it never switches kernels by size.
bool tma_pays_off(const tileattn_kvcache_params& p) {
  if (p.num_splits != 0) return false;
  const int block = cuda::decode::tma_block_keys(p.fwd.head_dim);
  return p.block_table == nullptr || p.page_size % block == 0;
}

// TMA staging needs compute capability 9.0 (TILEATTN_DECODE_FAMILY=sm80 opts out, sm90 uses it at
// every size), a head dim the kernel's box is built for, 16-byte aligned caches, and tensor maps
// the driver accepts.
// The part of that which the shapes and the device decide (the pointers decide the rest).
bool tma_possible(const tileattn_kvcache_params& p) {
  const int head_dim = p.fwd.head_dim;
  if (!cuda::sm90_family_allowed("TILEATTN_DECODE_FAMILY") || !cuda::is_sm90_device()) return false;
  if (!cuda::sm90_family_forced("TILEATTN_DECODE_FAMILY") && !tma_pays_off(p)) return false;
  return head_dim == 64 || head_dim == 128 || head_dim == 256;
}

// The wide ring (tma_block_loop.cuh: 32-key blocks at d128, one CTA an SM) under
// TILEATTN_DECODE_RING=auto: calls whose unsplit grid fits one CTA an SM and whose split plan on
// the wide ring still runs in one wave, on a contiguous cache or pages of whole 32-key blocks.
// There one CTA an SM streams alone, and 16 KB steps take it faster than 8 KB ones (sm_intake: a
// warp's copies arrive about one block at a time); where the grid is larger, two narrow CTAs an SM
// overlap each other's fixed costs.  Measured on the H200 (session 40,
// bench/results/h200-decode-ring-choice-ab-2026-12-03.txt): this rule against the narrow ring
// everywhere 12 x 2k +7%, 16 x 2k +5%, 8 x 2k on pages of 256 +4%, the rest level; the wide ring
// everywhere lost 24-64 x 2k 4-6% and pages of 16 (two boxes a block) 5-31%.  Session 45 measured
// the rule over batches 1-16 x 2k-16k (bench/results/h200-decode-ring-grid-2026-12-04.txt): where
// the heuristic split the wide grid into a second wave (10 sequences at 2k-8k: 3 splits, 240
// CTAs; 12 at 3k-8k: 4 splits) the wide ring lost 1-30% to the narrow one, and won or drew
// wherever its plan ran in one wave; hence the one-wave condition.  `narrow`, `wide` and `three`
// force a ring (d128, A/B runs and tests; `three`, the narrow ring at three CTAs an SM, where a CTA
// has at most 8 query rows, else the narrow ring).  Shapes and the device decide it, so the
// workspace query agrees with the call.
enum RingChoice { kRingAuto, kRingNarrow, kRingWide, kRingThree };

// TILEATTN_DECODE_RING, read and checked at every call on every device (a bad value raises an
// error naming it even where no TMA ring can run).
RingChoice ring_choice() {
  return static_cast<RingChoice>(env_choice("TILEATTN_DECODE_RING", {"auto", "narrow", "wide", "three"}));
}

cuda::decode::RingWave ring_wave(const cuda::decode::DecodeArgs& args, int loop) {
  return args.p.fwd.dtype == TILEATTN_FLOAT16 ? cuda::decode::ring_wave<__half>(args, loop)
                                              : cuda::decode::ring_wave<__nv_bfloat16>(args, loop);
}

// Whether the wide ring may serve the call at all: a contiguous cache or pages of whole 32-key
// blocks, and an unsplit grid of at most one CTA an SM.
bool wide_ring_possible(const cuda::decode::DecodeArgs& args) {
  const tileattn_kvcache_params& p = args.p;
  if (p.block_table != nullptr && p.page_size % cuda::decode::tma_block_keys(128, true) != 0) return false;
  return cuda::decode::split_ctas(args) <= cuda::sm_count();
}

// The narrow ring at three CTAs an SM (at most 8 rows a CTA) under TILEATTN_DECODE_RING=auto:
// where the ring chosen above leaves its one wave less than 90% full or needs a second, and the
// three-CTA plan fills at least 90% of its one wave (396 CTAs on the H200) with at least 16 blocks
// a warp.  Measured on the H200 with each ring forced (session 46, 28 points, two runs each,
// bench/results/h200-decode-three-ctas-grid-2026-12-04.txt): against the ring chosen before,
// 24 x 2k +16% (192 pairs: 192 narrow CTAs leave 72 SMs with one, three CTAs an SM take 2 splits,
// 384 CTAs), 24 x 4k +7%, 12 x 4k +7% (96 pairs: 96 wide CTAs, 4 splits of three), 48 x 2k +9%
// (384 pairs: 2 narrow splits run 3 waves, three CTAs one), 12-24 x 8k +3-4%; and lost where the
// plan chosen before already filled one wave (batch 8, 16, 32: -1 to -10%), at 20 sequences (320
// of 396: -6% at 4k) and at 12 x 2k (8 blocks a warp: -1.5%).  With this rule against main, two
// runs a side (bench/results/h200-decode-three-ctas-ab-2026-12-04.txt): 24 x 2k +16% (0.88 -> 1.02 of
// cuDNN), 48 x 2k +12%, 12 x 4k +7%, 24 x 4k +8%, the other rule-taken points +2-5%; the points it
// leaves alone (identical kernels) read +0.4 to +3.5%, the spread of those runs.
bool three_ring_pays_off(const cuda::decode::DecodeArgs& args, const cuda::decode::RingWave& chosen) {
  using namespace cuda::decode;
  constexpr int kMinWarpBlocks = 16;
  if (chosen.fills_one_wave()) return false;
  const RingWave three = ring_wave(args, kLoopRingThree);
  if (!three.fills_one_wave()) return false;
  const int64_t blocks = (static_cast<int64_t>(args.p.fwd.seqlen_k) + kChunk - 1) / kChunk;
  return blocks >= int64_t{kMinWarpBlocks} * kWarps * three.splits;
}

// The TMA loop's ring for a call (decode_shape.h's kLoopRing, kLoopWideRing, kLoopRingThree).
int ring_chosen(const cuda::decode::DecodeArgs& args, RingChoice choice) {
  using namespace cuda::decode;
  if (args.p.fwd.head_dim != 128) return kLoopRing;
  const bool three_fits = args.rows <= kRows / 2;
  switch (choice) {
    case kRingNarrow: return kLoopRing;
    case kRingWide: return kLoopWideRing;
    case kRingThree: return three_fits ? kLoopRingThree : kLoopRing;
    default: {
      // The wide ring where its plan runs in one wave, one CTA an SM; each plan computed once.
      std::optional<RingWave> wide;
      if (wide_ring_possible(args)) wide = ring_wave(args, kLoopWideRing);
      const bool take_wide = wide && wide->runs_one_wave();
      const int chosen = take_wide ? kLoopWideRing : kLoopRing;
      if (!three_fits) return chosen;
      return three_ring_pays_off(args, take_wide ? *wide : ring_wave(args, kLoopRing)) ? kLoopRingThree : chosen;
    }
  }
}

bool setup_tma(cuda::decode::DecodeArgs& args, RingChoice ring) {
  const tileattn_kvcache_params& p = args.p;
  const ForwardParams& f = p.fwd;
  if (!tma_possible(p) || !args.vector_k || !args.vector_v) return false;
  const bool paged = p.block_table != nullptr;
  const int64_t rows = paged ? p.page_size : f.seqlen_k;
  const int64_t units = paged ? p.num_blocks : p.num_cache_entries;
  if (rows <= 0 || units <= 0 || rows > INT32_MAX || units > INT32_MAX) return false;
  const CUtensorMapDataType dtype =
      f.dtype == TILEATTN_FLOAT16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  // A block starts at a multiple of its size, so boxes of gcd(block, page) keys stay inside a page.
  args.ring = static_cast<unsigned char>(ring_chosen(args, ring));
  const int block = cuda::decode::tma_block_keys(f.head_dim, args.ring == cuda::decode::kLoopWideRing);
  args.tma_box_keys = paged ? std::gcd(block, static_cast<int>(p.page_size)) : block;
  return encode_cache_map(&args.tma_k, f.k, dtype, f.head_dim, f.num_heads_k, rows, units, f.k_head_stride,
                          f.k_row_stride, f.k_batch_stride, args.tma_box_keys) &&
         encode_cache_map(&args.tma_v, f.v, dtype, f.head_dim, f.num_heads_k, rows, units, f.v_head_stride,
                          f.v_row_stride, f.v_batch_stride, args.tma_box_keys);
}

// The launch arguments that the shapes decide (the pointers' alignment and the tensor maps are
// the caller's to add).
cuda::decode::DecodeArgs shape_args(const KvCacheParams& p) {
  using namespace cuda;
  const ForwardParams& f = p.fwd;
  decode::DecodeArgs args{};
  args.p = p;
  args.group = f.num_heads / f.num_heads_k;
  args.rows = args.group * f.seqlen_q;
  args.row_blocks = (args.rows + decode::kRows - 1) / decode::kRows;
  args.seqlen_q_div = FastDivisor::make(f.seqlen_q);
  args.heads_k_div = FastDivisor::make(f.num_heads_k);
  args.row_blocks_div = FastDivisor::make(std::max(1, args.row_blocks));
  args.num_splits = p.num_splits;
  if (p.block_table != nullptr) args.page_div = FastDivisor::make(static_cast<int>(p.page_size));
  if (decode::split_ctas(args) > std::numeric_limits<int32_t>::max()) {
    throw Error(ErrorCode::kUnsupported, "q",
                "batch x KV heads x ceil(H / Hk x seqlen_q / 16) must fit in 2^31 CUDA blocks");
  }
  return args;
}

// Packed query rows whose cu_seqlens_q break a rule had no live slot (decode::query_slots) and were
// skipped: NaN over every output, as a varlen forward's bad index arrays get.  The poison kernel
// checks cu_seqlens_k's rules too; given cu_seqlens_q as both, it checks the rows' rules once more.
void poison_bad_packed_rows(const ForwardParams& f, cudaStream_t stream) {
  if (f.cu_seqlens_q == nullptr) return;
  ForwardParams rows = f;
  rows.cu_seqlens_k = f.cu_seqlens_q, rows.total_k = f.total_q, rows.seqlen_k = f.seqlen_q;
  rows.seqused_k = nullptr, rows.attn_probs = nullptr;
  cuda::poison_out_of_bounds_forward(rows, stream);
}

// A call with many query rows on the forward kernels (kvcache_forward_route.h): the append kernel
// when new tokens come, then each sequence's key count (NaN outputs for a sequence whose indices
// break the rules, which the forward then skips), q's copy where it is rotated or its heads packed,
// the forward, and with packed heads the copy of its out and LSE back.
void run_on_forward(const KvCacheParams& p, cudaStream_t stream) {
  using namespace cuda;
  const bool can_pack = decode::route_can_pack_heads(p);
  const int64_t bytes = decode::route_workspace_bytes(p, can_pack);
  decode::require_workspace(p, bytes);
  const bool packed = decode::route_packs_heads(p, can_pack);
  std::optional<StreamWorkspace> pool;  // when the caller gave no workspace; freed on the stream after the call
  char* workspace = static_cast<char*>(p.workspace);
  if (workspace == nullptr) workspace = reinterpret_cast<char*>(pool.emplace(stream).floats((bytes + 3) / 4, false));
  const decode::RouteBuffers buffers = decode::route_buffers(p, workspace, packed);
  if (p.k_new != nullptr) {
    const decode::DecodeArgs args = shape_args(p);
    if (p.fwd.dtype == TILEATTN_FLOAT16) {
      decode::run_append<__half>(args, stream);
    } else {
      decode::run_append<__nv_bfloat16>(args, stream);
    }
  }
  decode::launch_route_lengths(p, buffers.lengths, stream);
  if (buffers.q_copy != nullptr) {
    decode::launch_route_copy_q(p, buffers.lengths, decode::route_q_layout(p, packed), buffers.q_copy, stream);
  }
  run_forward_kernels(decode::forward_route_params(p, buffers, packed), decode::route_kv_index(p, packed));
  if (packed) decode::launch_route_unpack(p, buffers.lengths, buffers, stream);
  poison_bad_packed_rows(p.fwd, stream);
}

}  // namespace

int64_t cuda_kvcache_workspace_size(const KvCacheParams& p) {
  using namespace cuda;
  const ForwardParams& f = p.fwd;
  require_sm80();
  const RingChoice ring = ring_choice();
  if (f.batch == 0 || f.seqlen_q == 0 || f.num_heads == 0) return 0;
  require_grid_fits(f);
  decode::DecodeArgs args = shape_args(p);
  args.tma = tma_possible(p);
  args.ring = static_cast<unsigned char>(args.tma ? ring_chosen(args, ring) : decode::kLoopRing);
  // The most either path may take: the route is chosen per call (TILEATTN_KVCACHE_FORWARD is read
  // at every call), so the size covers both wherever the route is possible.
  const int64_t route = decode::forward_route_workspace_bytes(p);
  if (f.dtype == TILEATTN_FLOAT16) return std::max(route, decode::workspace_bytes<__half>(args));
  if (f.dtype == TILEATTN_BFLOAT16) return std::max(route, decode::workspace_bytes<__nv_bfloat16>(args));
  throw Error(ErrorCode::kDtype, "q", "the CUDA backend takes float16 or bfloat16");
}

void cuda_forward_kvcache(const KvCacheParams& p) {
  using namespace cuda;
  const ForwardParams& f = p.fwd;
  require_sm80();
  const std::pair<const void*, const char*> pointers[] = {
      {f.q, "q"}, {f.k, "k_cache"}, {f.v, "v_cache"}, {f.out, "out"}, {f.softmax_lse, "softmax_lse"},
      {f.alibi_slopes, "alibi_slopes"}, {f.cu_seqlens_q, "cu_seqlens_q"}, {f.cu_seqlens_k, "cu_seqlens_k"},
      {f.seqused_k, "seqused_k"}, {p.cache_seqlens, "cache_seqlens"}, {p.cache_batch_idx, "cache_batch_idx"},
      {p.cache_leftpad, "cache_leftpad"}, {p.block_table, "block_table"}, {p.k_new, "k"}, {p.v_new, "v"},
      {p.rotary_cos, "rotary_cos"}, {p.rotary_sin, "rotary_sin"}, {p.workspace, "workspace"}};
  for (const auto& [ptr, name] : pointers) require_device_pointer(ptr, name);
  const RingChoice ring = ring_choice();
  if (f.batch == 0 || f.seqlen_q == 0 || f.num_heads == 0) return;
  require_grid_fits(f);
  if (f.dtype != TILEATTN_FLOAT16 && f.dtype != TILEATTN_BFLOAT16) {
    throw Error(ErrorCode::kDtype, "q", "the CUDA backend takes float16 or bfloat16");
  }
  if (decode::forward_route_taken(p)) {
    run_on_forward(p, static_cast<cudaStream_t>(f.stream));
    return;
  }

  decode::DecodeArgs args = shape_args(p);
  args.vector_q = vector_aligned(f.q, f.q_batch_stride, f.q_row_stride, f.q_head_stride);
  args.vector_k = vector_aligned(f.k, f.k_batch_stride, f.k_row_stride, f.k_head_stride);
  args.vector_v = vector_aligned(f.v, f.v_batch_stride, f.v_row_stride, f.v_head_stride);
  args.tma = setup_tma(args, ring);
  const cudaStream_t stream = static_cast<cudaStream_t>(f.stream);
  if (f.dtype == TILEATTN_FLOAT16) {
    decode::run_decode<__half>(args, stream);
  } else {
    decode::run_decode<__nv_bfloat16>(args, stream);
  }
  poison_bad_packed_rows(f, stream);
}

}  // namespace tileattn
