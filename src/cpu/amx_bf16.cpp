#include "cpu/amx_bf16.h"

#include <string>

#include "common/env_choice.h"
#include "cpu/amx_target.h"
#include "cpu/bf16_dot_product.h"
#include "tileattn/tileattn.hpp"

#if TILEATTN_AMX_BUILT
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
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

namespace {

// `engine` where the CPU has it (`present`), else an error naming TILEATTN_CPU_AMX=`value`.
Engine required(bool present, Engine engine, const char* value, const char* where) {
  if (!present) {
    throw Error(ErrorCode::kUnsupported, "TILEATTN_CPU_AMX",
                std::string("TILEATTN_CPU_AMX=") + value + ", but this CPU or OS lacks it (" + where +
                    "); unset it to use it where present");
  }
  return engine;
}

}  // namespace

Engine engine() {
  static const bool tiles = hardware_ready(), dot = bf16_dot::hardware_ready();
  switch (env_choice("TILEATTN_CPU_AMX", {"auto", "off", "on", "dot"})) {
    case 1: return Engine::kNone;
    case 2:
      return required(tiles, Engine::kTiles, "on",
                      "AMX-BF16 tiles need a Sapphire Rapids or later Xeon and Linux 5.16 or later");
    case 3:
      return required(dot, Engine::kDot, "dot",
                      "AVX512-BF16: AMD Zen 4 and later, Intel Cooper Lake and Sapphire Rapids and later");
    default: return tiles ? Engine::kTiles : dot ? Engine::kDot : Engine::kNone;
  }
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

// The tile configuration is loaded on every call, not once a thread: it is per-thread state that
// other AMX code in the process (torch's oneDNN on the same OpenMP thread) may have replaced, and
// loading it costs far less than one 16 x 16 x 32 step does.  Released at the end so the thread
// does not carry 8 KiB of live tile state through its context switches.
TILEATTN_AMX_TARGET void tile_product(int m, int n, int depth, const RowsOperand& a, const PairsOperand& b,
                                      float* c, int ldc, bool accumulate) {
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

}  // namespace
#else
namespace {

void tile_product(int, int, int, const RowsOperand&, const PairsOperand&, float*, int, bool) {
  throw Error(ErrorCode::kInternal, "", "AMX product called in a build without AMX support");
}

}  // namespace
#endif

void product(Engine engine, int m, int n, int depth, const RowsOperand& a, const PairsOperand& b, float* c, int ldc,
             bool accumulate) {
  if (engine == Engine::kDot) {
    bf16_dot::product(m, n, depth, a, b, c, ldc, accumulate);
  } else {
    tile_product(m, n, depth, a, b, c, ldc, accumulate);
  }
}

}  // namespace tileattn::cpu::amx
