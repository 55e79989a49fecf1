// Philox-4x32 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11) and the
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

// The 64-bit product of two 32-bit words.  On the GPU through PTX's mul.wide.u32, one IMAD.WIDE:
// written as a 64-bit multiply of zero-extended words, nvcc 13.0 emitted the IMAD.WIDE plus an add
// of a zero high word (a VIADD after every multiply, 14 of a call's ~53 instructions at 7 rounds).
TILEATTN_HOST_DEVICE void mul_hi_lo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
#if defined(__CUDA_ARCH__)
  uint64_t product;
  asm("mul.wide.u32 %0, %1, %2;" : "=l"(product) : "r"(a), "r"(b));
#else
  const uint64_t product = static_cast<uint64_t>(a) * b;
#endif
  *hi = static_cast<uint32_t>(product >> 32);
  *lo = static_cast<uint32_t>(product);
}

// kRounds rounds of: (c0, c1, c2, c3) <- (hi(M1 c2) ^ c1 ^ k0, lo(M1 c2), hi(M0 c0) ^ c3 ^ k1, lo(M0 c0)).
template <int kRounds>
TILEATTN_HOST_DEVICE Philox4x32 philox4x32(Philox4x32 counter, uint32_t key0, uint32_t key1) {
  for (int round = 0; round < kRounds; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mul_hi_lo(kPhiloxM0, counter.x[0], &hi0, &lo0);
    mul_hi_lo(kPhiloxM1, counter.x[2], &hi1, &lo1);
    counter = Philox4x32{{hi1 ^ counter.x[1] ^ key0, lo1, hi0 ^ counter.x[3] ^ key1, lo0}};
    key0 += kPhiloxW0;
    key1 += kPhiloxW1;
  }
  return counter;
}

// Dropout runs seven rounds, as flash-attn 2 (and PyTorch's flash backend built from it) does.
// Salmon et al. make ten the default as a safety margin over the rounds their statistical tests
// (TestU01's BigCrush) need; on the GPU each round is two 32x32->64 multiplies and four XORs a
// call, and the calls were half of a d128 forward's time with dropout at ten rounds (perf log),
// so the three rounds are worth ~15% of that time.  Random123 publishes known answers for both.
constexpr int kDropoutPhiloxRounds = 7;

// Dropout threshold: an element is dropped when its 16-bit draw is below p * 2^16 (p resolved to
// 1/65536, 256 times finer than flash-attn's 8-bit draws; p = 1 drops every element).
TILEATTN_HOST_DEVICE uint32_t dropout_threshold(float p) {
  const double scaled = static_cast<double>(p) * 65536.0;
  return scaled >= 65536.0 ? 65536u : static_cast<uint32_t>(scaled);
}

// One Philox call gives the 16-bit draws of eight elements: rows {i0, i0 + 8} x columns
// {j0, j0 + 1, j0 + 8, j0 + 9} with i0 = 16 (i / 16) + i % 8 and j0 = 16 (j / 16) + 2 ((j % 8) / 2).
// Those are the eight elements one thread holds of a 16 x 16 patch of an mma.sync m16n8 or a
// wgmma accumulator, so a kernel draws once per eight elements (the first mapping, one 32-bit
// draw an element, cost the forward 6x its time at d128):
//   key     = (lo32(seed), hi32(seed))
//   counter = (4 (j / 16) + (j % 8) / 2,  8 (i / 16) + i % 8,  lo32(stream), hi32(stream))
//   stream  = offset + batch * num_heads + head
// Element (i, j) takes slot 4 ((i / 8) % 2) + 2 ((j / 8) % 2) + j % 2: the low (even slot) or
// high half of word slot / 2.  Rows and columns count from the start of the sequence (varlen:
// within its own sequence).  A caller reserves num_batch * num_heads offsets.
TILEATTN_HOST_DEVICE Philox4x32 dropout_draws(uint64_t seed, uint64_t offset, int batch_index,
                                              int head, int num_heads, int row, int col) {
  const uint64_t stream =
      offset + static_cast<uint64_t>(batch_index) * static_cast<uint64_t>(num_heads) +
      static_cast<uint64_t>(head);
  const uint32_t group_col = (static_cast<uint32_t>(col) >> 4) * 4 + ((static_cast<uint32_t>(col) & 7) >> 1);
  const uint32_t group_row = (static_cast<uint32_t>(row) >> 4) * 8 + (static_cast<uint32_t>(row) & 7);
  const Philox4x32 counter{{group_col, group_row, static_cast<uint32_t>(stream), static_cast<uint32_t>(stream >> 32)}};
  return philox4x32<kDropoutPhiloxRounds>(counter, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// The slot of (row, col) among its group's eight draws, and the draw in a slot.
TILEATTN_HOST_DEVICE int dropout_slot(int row, int col) {
  return ((row >> 3) & 1) * 4 + ((col >> 3) & 1) * 2 + (col & 1);
}
// Selects rather than draws.x[slot >> 1]: a runtime index would put the four words in local memory.
TILEATTN_HOST_DEVICE uint32_t dropout_draw16(const Philox4x32& draws, int slot) {
  const int word = slot >> 1;
  const uint32_t w = word < 2 ? (word == 0 ? draws.x[0] : draws.x[1]) : (word == 2 ? draws.x[2] : draws.x[3]);
  return (slot & 1) ? w >> 16 : w & 0xFFFFu;
}

TILEATTN_HOST_DEVICE bool dropout_keep(uint64_t seed, uint64_t offset, int batch_index, int head,
                                       int num_heads, int row, int col, uint32_t threshold) {
  const Philox4x32 draws = dropout_draws(seed, offset, batch_index, head, num_heads, row, col);
  return dropout_draw16(draws, dropout_slot(row, col)) >= threshold;
}

}  // namespace tileattn
