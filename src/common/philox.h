// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11) and the
// dropout mapping every backend shares.  docs/dropout-rng.md states the mapping in words; the CPU
// and CUDA backends both call dropout_keep() so that one (seed, offset) gives one mask.
#pragma once

#include <stdint.h>

#include "common/host_device.h"

namespace tileattn {

struct Philox4x32 {
  uint32_t x[4];
};

// The constants of the paper's Philox-4x32: two multipliers and the Weyl key increments.
constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;

TILEATTN_HOST_DEVICE void mul_hi_lo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t product = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(product >> 32);
  *lo = static_cast<uint32_t>(product);
}

// Ten rounds of: (c0, c1, c2, c3) <- (hi(M1 c2) ^ c1 ^ k0, lo(M1 c2), hi(M0 c0) ^ c3 ^ k1, lo(M0 c0)).
TILEATTN_HOST_DEVICE Philox4x32 philox4x32_10(Philox4x32 counter, uint32_t key0, uint32_t key1) {
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mul_hi_lo(kPhiloxM0, counter.x[0], &hi0, &lo0);
    mul_hi_lo(kPhiloxM1, counter.x[2], &hi1, &lo1);
    counter = Philox4x32{{hi1 ^ counter.x[1] ^ key0, lo1, hi0 ^ counter.x[3] ^ key1, lo0}};
    key0 += kPhiloxW0;
    key1 += kPhiloxW1;
  }
  return counter;
}

// Dropout threshold: an element is dropped when its 32-bit draw is below p * 2^32.
TILEATTN_HOST_DEVICE uint32_t dropout_threshold(float p) {
  const double scaled = static_cast<double>(p) * 4294967296.0;
  return scaled >= 4294967295.0 ? 0xFFFFFFFFu : static_cast<uint32_t>(scaled);
}

// The four draws of the Philox call that covers columns 4*(col/4) .. 4*(col/4)+3 of one row:
//   key     = (lo32(seed), hi32(seed))
//   counter = (col / 4, row, lo32(offset + batch * num_heads + head), hi32(...))
// Draw number col % 4 belongs to column col.  Row and column count from the start of the
// sequence (varlen: within its own sequence).  A caller reserves num_batch * num_heads offsets.
TILEATTN_HOST_DEVICE Philox4x32 dropout_draws(uint64_t seed, uint64_t offset, int batch_index,
                                              int head, int num_heads, int row, int col) {
  const uint64_t stream =
      offset + static_cast<uint64_t>(batch_index) * static_cast<uint64_t>(num_heads) +
      static_cast<uint64_t>(head);
  const Philox4x32 counter{{static_cast<uint32_t>(col) >> 2, static_cast<uint32_t>(row),
                            static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)}};
  return philox4x32_10(counter, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

TILEATTN_HOST_DEVICE bool dropout_keep(uint64_t seed, uint64_t offset, int batch_index, int head,
                                       int num_heads, int row, int col, uint32_t threshold) {
  return dropout_draws(seed, offset, batch_index, head, num_heads, row, col).x[col & 3] >= threshold;
}

}  // namespace tileattn
