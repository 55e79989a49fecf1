#include "cpu/amx_bf16.h"

#include <algorithm>
#include <cstring>

#include "common/env_choice.h"
#include "cpu/convert.h"
#include "cpu/exp2_poly.h"
#include "cpu/vector_math.h"
#include "tileattn/tileattn.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define TILEATTN_AMX_BUILT 1
#include <cpuid.h>
// GCC 12's AVX-512 headers build their "undefined" vectors from an uninitialized variable, which
// -Wall reports at every masked intrinsic this file uses; nothing here reads one.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
// Every function below that runs only where enabled() is true may use AVX-512 too: every CPU with
// AMX-BF16 has it (checked anyway in hardware_ready).
#define TILEATTN_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512bf16")))
#else
#define TILEATTN_AMX_BUILT 0
#define TILEATTN_AMX_TARGET
#endif

namespace tileattn::cpu::amx {
namespace {

#if TILEATTN_AMX_BUILT
// CPUID leaf 7: subleaf 0 EDX bit 22 AMX-BF16, bit 24 AMX-TILE, EBX bit 16 AVX512F, bit 30 AVX512BW;
// subleaf 1 EAX bit 5 AVX512_BF16.  Then the OS: Linux keeps the 8 KiB tile-data state off until a
// process asks (ARCH_REQ_XCOMP_PERM = 0x1023 for XFEATURE_XTILEDATA = 18); the grant covers every
// thread of the process, those started later included.
bool hardware_ready() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool tiles = (d >> 22 & 1u) && (d >> 24 & 1u) && (b >> 16 & 1u) && (b >> 30 & 1u);
  if (!tiles || !__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a >> 5 & 1u)) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}
#else
bool hardware_ready() { return false; }
#endif

}  // namespace

bool enabled() {
  static const bool ready = hardware_ready();
  const int choice = env_choice("TILEATTN_CPU_AMX", {"auto", "off", "on"});
  if (choice == 2 && !ready) {
    throw Error(ErrorCode::kUnsupported, "TILEATTN_CPU_AMX",
                "TILEATTN_CPU_AMX=on, but this CPU or OS offers no AMX-BF16 tiles (they need a Sapphire Rapids "
                "or later Xeon and Linux 5.16 or later); unset it to use them where present");
  }
  return ready && choice != 1;
}

#if TILEATTN_AMX_BUILT
namespace {

// Palette 1 with all 8 tiles at their largest, 16 rows of 64 bytes: C tiles 0-3 (2 x 2 blocks of
// 16 x 16 float32), A tiles 4-5, B tiles 6-7.
struct TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// One block of MT x NT C tiles (MT, NT in {1, 2}) over `steps` steps of 32 depth: per step MT A
// tiles and NT B tiles are loaded and feed MT x NT tdpbf16ps.  The 2 x 2 block reuses each loaded
// tile twice; measured alone on this host's cores, it ran at ~1050 GFLOP/s a core.
template <int MT, int NT>
TILEATTN_AMX_TARGET void product_block(const uint16_t* a, int lda, const uint16_t* b, int ldb, int steps, float* c,
                                       int ldc, bool accumulate) {
  const int a_stride = lda * 2, b_stride = ldb * 2, c_stride = ldc * 4;
  float* c10 = c + kRowsPerTile * ldc;
  if (accumulate) {
    _tile_loadd(0, c, c_stride);
    if constexpr (NT == 2) _tile_loadd(1, c + kColsPerTile, c_stride);
    if constexpr (MT == 2) _tile_loadd(2, c10, c_stride);
    if constexpr (MT == 2 && NT == 2) _tile_loadd(3, c10 + kColsPerTile, c_stride);
  } else {
    _tile_zero(0);
    if constexpr (NT == 2) _tile_zero(1);
    if constexpr (MT == 2) _tile_zero(2);
    if constexpr (MT == 2 && NT == 2) _tile_zero(3);
  }
  for (int s = 0; s < steps; ++s) {
    // A: rows 0-15 (and 16-31) of depth s*32 .. s*32+31; B: pair rows s*16 .. s*16+15, which
    // hold depth s*32 .. s*32+31, of columns 0-15 (and 16-31).
    const uint16_t* a_step = a + s * kDepthPerStep;
    const uint16_t* b_step = b + static_cast<int64_t>(s) * (kDepthPerStep / 2) * ldb;
    _tile_loadd(4, a_step, a_stride);
    if constexpr (MT == 2) _tile_loadd(5, a_step + kRowsPerTile * lda, a_stride);
    _tile_loadd(6, b_step, b_stride);
    if constexpr (NT == 2) _tile_loadd(7, b_step + 2 * kColsPerTile, b_stride);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NT == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (MT == 2) _tile_dpbf16ps(2, 5, 6);
    if constexpr (MT == 2 && NT == 2) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, c_stride);
  if constexpr (NT == 2) _tile_stored(1, c + kColsPerTile, c_stride);
  if constexpr (MT == 2) _tile_stored(2, c10, c_stride);
  if constexpr (MT == 2 && NT == 2) _tile_stored(3, c10 + kColsPerTile, c_stride);
}

}  // namespace

// The tile configuration is loaded on every call, not once a thread: it is per-thread state that
// other AMX code in the process (torch's oneDNN on the same OpenMP thread) may have replaced, and
// loading it costs far less than one 16 x 16 x 32 step does.  Released at the end so the thread
// does not carry 8 KiB of live tile state through its context switches.
TILEATTN_AMX_TARGET void product(int m, int n, int depth, const RowsOperand& a, const PairsOperand& b, float* c,
                                 int ldc, bool accumulate) {
  const TileConfig config;
  _tile_loadconfig(&config);
  const int steps = depth / kDepthPerStep;
  for (int row = 0; row < m; row += 2 * kRowsPerTile) {
    const bool two_rows = row + 2 * kRowsPerTile <= m;
    for (int col = 0; col < n; col += 2 * kColsPerTile) {
      const bool two_cols = col + 2 * kColsPerTile <= n;
      const uint16_t* a_block = a.data + static_cast<int64_t>(row) * a.ld;
      const uint16_t* b_block = b.data + 2 * col;
      float* c_block = c + static_cast<int64_t>(row) * ldc + col;
      if (two_rows && two_cols) {
        product_block<2, 2>(a_block, a.ld, b_block, b.ld, steps, c_block, ldc, accumulate);
      } else if (two_rows) {
        product_block<2, 1>(a_block, a.ld, b_block, b.ld, steps, c_block, ldc, accumulate);
      } else if (two_cols) {
        product_block<1, 2>(a_block, a.ld, b_block, b.ld, steps, c_block, ldc, accumulate);
      } else {
        product_block<1, 1>(a_block, a.ld, b_block, b.ld, steps, c_block, ldc, accumulate);
      }
    }
  }
  _tile_release();
}
#else
void product(int, int, int, const RowsOperand&, const PairsOperand&, float*, int, bool) {
  throw Error(ErrorCode::kInternal, "", "AMX product called in a build without AMX support");
}
#endif

#if TILEATTN_AMX_BUILT
namespace {

// 16 floats to bf16 (VCVTNEPS2BF16: nearest even, NaN stays NaN, subnormals to 0), of which the
// lanes past `count` are stored as zeros; count <= 16.
TILEATTN_AMX_TARGET inline void store_bf16(__m512 values, int count, uint16_t* dst) {
  const __mmask16 live = count >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << count) - 1);
  const __m256i bits = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_mov_ps(live, values));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), bits);
}

TILEATTN_AMX_TARGET void row_to_bf16(const float* src, int count, int padded, uint16_t* dst) {
  for (int i = 0; i < padded; i += 16) {
    const int live = std::max(0, std::min(16, count - i));
    const __mmask16 mask = live >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << live) - 1);
    store_bf16(_mm512_maskz_loadu_ps(mask, src + i), live, dst + i);
  }
}

// 2^x on 16 lanes, as exp2_approx in vector_math.cpp: n = round(max(x, -127)), f = x - n,
// 2^f by kExp2Poly, times 2^n by VSCALEFPS; 0 where x < -126, NaN kept (VMAXPS returns its second
// operand when either is NaN, so the clamp lets a NaN through).
TILEATTN_AMX_TARGET inline __m512 exp2_lanes(__m512 x) {
  const __m512 clamped = _mm512_max_ps(_mm512_set1_ps(-127.0f), x);
  const __m512 n = _mm512_roundscale_ps(clamped, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(clamped, n);
  __m512 p = _mm512_set1_ps(kExp2Poly[0]);
  for (int i = 1; i < 8; ++i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Poly[i]));
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), _CMP_LT_OQ);
  return _mm512_mask_mov_ps(_mm512_scalef_ps(p, n), underflow, _mm512_setzero_ps());
}

}  // namespace

TILEATTN_AMX_TARGET float exp2_row_to_bf16(const float* x, float shift, int count, int padded, uint16_t* y) {
  const __m512 offset = _mm512_set1_ps(shift);
  __m512 sum = _mm512_setzero_ps();
  for (int i = 0; i < padded; i += 16) {
    const int live = std::max(0, std::min(16, count - i));
    const __mmask16 mask = live >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << live) - 1);
    const __m512 power = _mm512_maskz_mov_ps(mask, exp2_lanes(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, x + i), offset)));
    sum = _mm512_add_ps(sum, power);
    store_bf16(power, live, y + i);
  }
  return _mm512_reduce_add_ps(sum);
}
#else
namespace {
void row_to_bf16(const float* src, int count, int padded, uint16_t* dst) {
  float_row_to_bf16(src, count, dst);
  std::fill(dst + count, dst + padded, uint16_t{0});
}
}  // namespace

float exp2_row_to_bf16(const float*, float, int, int, uint16_t*) {
  throw Error(ErrorCode::kInternal, "", "AMX row kernel called in a build without AMX support");
}
#endif

// Rows and pair rows are whole multiples of 16 elements here (depth_padded of 32, cols_padded of
// 16), so row_to_bf16 writes each in 16-lane stores.
void pack_rows(const float* src, int src_ld, int rows, int depth, int rows_padded, int depth_padded, uint16_t* dst,
               int dst_ld) {
  for (int r = 0; r < rows_padded; ++r) {
    row_to_bf16(src + static_cast<int64_t>(r) * src_ld, r < rows ? depth : 0, depth_padded, dst + static_cast<int64_t>(r) * dst_ld);
  }
}

namespace {
// Two bf16 values as the pairs layout stores them: the even depth row in the low half.
inline uint32_t pair_of(uint16_t even, uint16_t odd) { return static_cast<uint32_t>(even) | static_cast<uint32_t>(odd) << 16; }
}  // namespace

void pack_pairs_transposed(const float* src, int src_ld, int cols, int depth, int cols_padded, int depth_padded,
                           uint16_t* dst) {
  // Column c of B is row c of M, so each pair row t takes M[c][2t], M[c][2t + 1] for every c: a
  // transpose of M read as 32-bit pairs.  Rows of M are converted once into `row`, then scattered.
  uint32_t* out = reinterpret_cast<uint32_t*>(dst);
  const int pair_rows = depth_padded / 2;
  alignas(64) uint16_t row[256 + kDepthPerStep];
  for (int c = 0; c < cols_padded; ++c) {
    row_to_bf16(src + static_cast<int64_t>(c) * src_ld, c < cols ? depth : 0, depth_padded, row);
    for (int t = 0; t < pair_rows; ++t) out[static_cast<int64_t>(t) * cols_padded + c] = pair_of(row[2 * t], row[2 * t + 1]);
  }
}

void pack_pairs(const float* src, int src_ld, int depth, int cols, int depth_padded, int cols_padded, uint16_t* dst) {
  // Rows 2t and 2t + 1 of M, converted, then interleaved element by element.
  uint32_t* out = reinterpret_cast<uint32_t*>(dst);
  alignas(64) uint16_t even[256 + kColsPerTile], odd[256 + kColsPerTile];
  for (int t = 0; t < depth_padded / 2; ++t) {
    const float* in_even = src + static_cast<int64_t>(2 * t) * src_ld;
    row_to_bf16(in_even, 2 * t < depth ? cols : 0, cols_padded, even);
    row_to_bf16(in_even + src_ld, 2 * t + 1 < depth ? cols : 0, cols_padded, odd);
    uint32_t* out_row = out + static_cast<int64_t>(t) * cols_padded;
    for (int n = 0; n < cols_padded; ++n) out_row[n] = pair_of(even[n], odd[n]);
  }
}

}  // namespace tileattn::cpu::amx
