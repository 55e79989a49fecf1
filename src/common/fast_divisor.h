// Division by a divisor fixed at launch, for dividends in [0, 2^31): one 32 x 32 -> 64-bit
// multiply and a shift instead of the ~25 dependent instructions (I2F, MUFU.RCP, F2I and fix-ups)
// of a runtime integer division.  The sm90 forward decodes every tile with three or four of them,
// on each warp's critical path at the start of the tile (Nsight Compute, d128 causal 512: ~240
// scalar instructions a tile before the first wait).  cutlass::FastDivmod does the same, but the
// tile scheduler is also compiled by the CPU-only test build (tests/cpp), which has no CUTLASS.
//
// With l = ceil(log2 d), shift = 31 + l and multiplier = ceil(2^shift / d):
//   n * multiplier / 2^shift = n / d + n * e / 2^shift,  0 <= e < 1,
// and n < 2^31 bounds the error term by 2^-l <= 1 / d, less than the distance from n / d to the next
// integer, so the floor is exact.  The multiplier fits in 32 bits because d > 2^(l-1).
#pragma once

#include <stdint.h>

#include "common/host_device.h"

namespace tileattn {

struct FastDivisor {
  uint32_t divisor = 1;
  uint32_t multiplier = 1u << 31;
  uint32_t shift = 31;

  // Host side; d in [1, 2^31).
  static FastDivisor make(int d) {
    FastDivisor f;
    f.divisor = static_cast<uint32_t>(d);
    uint32_t l = 0;
    while ((1ull << l) < f.divisor) ++l;
    f.shift = 31 + l;
    f.multiplier = static_cast<uint32_t>(((1ull << f.shift) + f.divisor - 1) / f.divisor);
    return f;
  }

  // floor(n / divisor) for n in [0, 2^31).
  TILEATTN_HOST_DEVICE int div(int n) const {
    return static_cast<int>((static_cast<uint64_t>(static_cast<uint32_t>(n)) * multiplier) >> shift);
  }

  // n mod divisor for n in [0, 2^31): the quotient's multiply-shift and one multiply-subtract.
  TILEATTN_HOST_DEVICE int mod(int n) const { return n - div(n) * static_cast<int>(divisor); }
};

}  // namespace tileattn
