// Philox against the published known-answer vectors, the dropout mask's statistics, and the
// attn_probs output that exposes the mask.
#include <gtest/gtest.h>

#include <cmath>

#include "common/philox.h"
#include "harness.h"

namespace tileattn::test {
namespace {

// Known-answer vectors of Philox-4x32 from the Random123 distribution (kat_vectors): ten rounds
// (the paper's default) and seven (what dropout runs), each for a zero, an all-ones and a pi-digits
// counter and key.
struct PhiloxInput {
  uint32_t counter[4], key[2];
};
constexpr uint32_t kOnes = 0xffffffffu;
constexpr PhiloxInput kInputs[3] = {
    {{0, 0, 0, 0}, {0, 0}},
    {{kOnes, kOnes, kOnes, kOnes}, {kOnes, kOnes}},
    {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}},
};

template <int kRounds>
void expect_known_answers(const uint32_t (&outputs)[3][4]) {
  for (int t = 0; t < 3; ++t) {
    const PhiloxInput& in = kInputs[t];
    const Philox4x32 got = philox4x32<kRounds>(
        Philox4x32{{in.counter[0], in.counter[1], in.counter[2], in.counter[3]}}, in.key[0], in.key[1]);
    for (int w = 0; w < 4; ++w) {
      EXPECT_EQ(got.x[w], outputs[t][w]) << kRounds << " rounds, vector " << t << ", word " << w;
    }
  }
}

TEST(Philox, KnownAnswersTenRounds) {
  expect_known_answers<10>({{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
                            {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
                            {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}});
}

TEST(Philox, KnownAnswersSevenRounds) {
  static_assert(kDropoutPhiloxRounds == 7, "dropout's generator is the one these vectors pin");
  expect_known_answers<7>({{0x5f6fb709u, 0x0d893f64u, 0x4f121f81u, 0x4f730a48u},
                           {0x5207ddc2u, 0x45165e59u, 0x4d8ee751u, 0x8c52f662u},
                           {0x4dfccabau, 0x190a87f0u, 0xc47362bau, 0xb6b5242au}});
}

// The keep rate over many elements is 1 - p within 5 standard deviations, for several p.
TEST(Dropout, KeepRateIsUnbiased) {
  for (float p : {0.1f, 0.5f, 0.9f}) {
    const uint32_t threshold = dropout_threshold(p);
    const int rows = 200, cols = 1000;
    long kept = 0;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) kept += dropout_keep(42, 8, 1, 3, 8, r, c, threshold);
    const double n = static_cast<double>(rows) * cols;
    const double sigma = std::sqrt(n * p * (1 - p));
    EXPECT_NEAR(kept, n * (1 - p), 5 * sigma) << "p = " << p;
  }
}

// The mapping as docs/dropout-rng.md states it, written out here with plain arithmetic: counter
// (4 (j / 16) + (j % 8) / 2, 8 (i / 16) + i % 8, stream), slot 4 ((i / 8) % 2) + 2 ((j / 8) % 2) + j % 2,
// the low half of word slot / 2 for an even slot.  Rows and columns past 2^16 check the 32-bit
// counter words.
TEST(Dropout, MappingMatchesTheSpecification) {
  const uint64_t seed = 0x0123456789abcdefull, offset = 0x100000004ull;
  const int batch = 3, head = 5, heads = 7;
  const uint64_t stream = offset + batch * heads + head;
  const uint32_t threshold = dropout_threshold(0.3f);
  int dropped = 0, checked = 0;
  for (int i : {0, 1, 7, 8, 9, 15, 16, 23, 31, 100, 70001}) {
    for (int j : {0, 1, 2, 7, 8, 9, 14, 15, 16, 17, 25, 33, 1000, 65539}) {
      const Philox4x32 counter{{static_cast<uint32_t>(4 * (j / 16) + (j % 8) / 2),
                                static_cast<uint32_t>(8 * (i / 16) + i % 8), static_cast<uint32_t>(stream),
                                static_cast<uint32_t>(stream >> 32)}};
      const Philox4x32 w = philox4x32<7>(counter, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
      const int slot = 4 * ((i / 8) % 2) + 2 * ((j / 8) % 2) + j % 2;
      const uint32_t draw = slot % 2 == 0 ? w.x[slot / 2] & 0xFFFFu : w.x[slot / 2] >> 16;
      const bool keep = draw >= threshold;
      EXPECT_EQ(dropout_keep(seed, offset, batch, head, heads, i, j, threshold), keep) << i << ", " << j;
      dropped += !keep, ++checked;
    }
  }
  EXPECT_GT(dropped, 0);
  EXPECT_LT(dropped, checked);
}

// 16-bit draws: p resolves to 1/65536, and p = 1 drops everything.
TEST(Dropout, ThresholdIsSixteenBits) {
  EXPECT_EQ(dropout_threshold(0.5f), 32768u);
  EXPECT_EQ(dropout_threshold(0.1f), 6553u);
  EXPECT_EQ(dropout_threshold(1.0f), 65536u);
  for (int j = 0; j < 64; ++j) EXPECT_FALSE(dropout_keep(9, 0, 0, 0, 1, 3, j, dropout_threshold(1.0f)));
}

// The eight elements of one group share one call: all eight slots are distinct draws, and the
// next group along the row or down the band uses another counter.
TEST(Dropout, GroupSlotsAreDistinct) {
  const Philox4x32 a = dropout_draws(5, 0, 0, 0, 1, 2, 4);
  for (int i : {2, 10})
    for (int j : {4, 5, 12, 13}) {
      const Philox4x32 b = dropout_draws(5, 0, 0, 0, 1, i, j);
      for (int w = 0; w < 4; ++w) EXPECT_EQ(a.x[w], b.x[w]) << i << ", " << j;
    }
  int slots = 0;
  for (int i : {2, 10})
    for (int j : {4, 5, 12, 13}) slots |= 1 << dropout_slot(i, j);
  EXPECT_EQ(slots, 0xFF);
  EXPECT_NE(dropout_draws(5, 0, 0, 0, 1, 2, 6).x[0], a.x[0]);
  EXPECT_NE(dropout_draws(5, 0, 0, 0, 1, 3, 4).x[0], a.x[0]);
  EXPECT_NE(dropout_draws(5, 0, 0, 0, 1, 18, 4).x[0], a.x[0]);
  EXPECT_NE(dropout_draws(5, 0, 0, 0, 1, 2, 20).x[0], a.x[0]);
}

TEST(Dropout, SeedAndOffsetChangeTheMask) {
  const uint32_t threshold = dropout_threshold(0.5f);
  int same_seed = 0, other_seed = 0, other_offset = 0;
  for (int c = 0; c < 4096; ++c) {
    const bool a = dropout_keep(1, 0, 0, 0, 4, 3, c, threshold);
    same_seed += a == dropout_keep(1, 0, 0, 0, 4, 3, c, threshold);
    other_seed += a == dropout_keep(2, 0, 0, 0, 4, 3, c, threshold);
    other_offset += a == dropout_keep(1, 4, 0, 0, 4, 3, c, threshold);
  }
  EXPECT_EQ(same_seed, 4096);
  EXPECT_NEAR(other_seed, 2048, 200);
  EXPECT_NEAR(other_offset, 2048, 200);
}

// attn_probs: rows sum to 1 in |P|, negative exactly where the mask drops, and
// out = sum_j max(P_ij, 0) / (1 - p) v_j.
TEST(Dropout, AttentionProbabilitiesExposeTheMask) {
  Case c;
  c.batch = 2, c.heads = 2, c.heads_k = 1, c.seqlen_q = 37, c.seqlen_k = 150, c.dim = 16;
  c.dropout_p = 0.25f, c.causal = true, c.probs = true, c.backward = false;
  const Outcome o = run_case(c, 3);
  const Problem& p = o.problem;
  const uint32_t threshold = dropout_threshold(c.dropout_p);
  for (int b = 0; b < c.batch; ++b)
    for (int h = 0; h < c.heads; ++h)
      for (int i = 0; i < c.seqlen_q; ++i) {
        const float* row = &o.probs[((static_cast<size_t>(b) * c.heads + h) * c.seqlen_q + i) * c.seqlen_k];
        double total = 0;
        std::vector<double> expect(c.dim, 0.0);
        for (int j = 0; j < c.seqlen_k; ++j) {
          ASSERT_FALSE(std::isnan(row[j]));
          total += std::fabs(row[j]);
          if (row[j] != 0.0f) {
            EXPECT_EQ(row[j] > 0, dropout_keep(p.seed, p.offset, b, h, c.heads, i, j, threshold));
          }
          if (row[j] > 0) {
            for (int d = 0; d < c.dim; ++d)
              expect[d] += row[j] / (1 - c.dropout_p) * p.v[((b * c.seqlen_k + j) * 1 + 0) * c.dim + d];
          }
        }
        EXPECT_NEAR(total, 1.0, 1e-5);
        for (int d = 0; d < c.dim; ++d) {
          EXPECT_NEAR(o.ours.out[((b * c.seqlen_q + i) * c.heads + h) * c.dim + d], expect[d], 1e-4);
        }
      }
}

}  // namespace
}  // namespace tileattn::test
