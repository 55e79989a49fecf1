// sequence_in_bounds, the CUDA kernels' test of cu_seqlens and seqused_k (the CPU backend raises on
// the same rules through validate_sequence_lengths): true exactly for the sequences that obey them.
// The kernels call it on arrays nobody checked on the host; here it runs on the host.
#include <gtest/gtest.h>

#include <vector>

#include "common/sequence.h"
#include "tileattn/tileattn.hpp"

namespace tileattn::test {
namespace {

struct Varlen {
  std::vector<int32_t> cu_q, cu_k, used;
  ForwardParams p = default_forward_params();
  Varlen(std::vector<int32_t> q, std::vector<int32_t> k, int max_q, int max_k, int64_t total_q, int64_t total_k)
      : cu_q(std::move(q)), cu_k(std::move(k)) {
    p.batch = static_cast<int>(cu_q.size()) - 1;
    p.cu_seqlens_q = cu_q.data(), p.cu_seqlens_k = cu_k.data();
    p.seqlen_q = max_q, p.seqlen_k = max_k, p.total_q = total_q, p.total_k = total_k;
  }
  void use(std::vector<int32_t> u) {
    used = std::move(u);
    p.seqused_k = used.data();
  }
};

std::vector<bool> in_bounds(const ForwardParams& p) {
  std::vector<bool> result;
  for (int b = 0; b < p.batch; ++b) result.push_back(sequence_in_bounds(p, b));
  return result;
}

using Flags = std::vector<bool>;

TEST(SequenceInBounds, ValidSequences) {
  Varlen v({0, 5, 5, 12}, {0, 7, 9, 9}, 7, 7, 14, 9);  // an empty query run and an empty key run
  EXPECT_EQ(in_bounds(v.p), (Flags{true, true, true}));
  v.use({7, 0, 0});
  EXPECT_EQ(in_bounds(v.p), (Flags{true, true, true}));
}

TEST(SequenceInBounds, EachRuleBroken) {
  EXPECT_EQ(in_bounds(Varlen({0, 5, 13}, {0, 4, 8}, 8, 4, 12, 8).p), (Flags{true, false}));  // rows 5..13 of 12
  EXPECT_EQ(in_bounds(Varlen({0, 8, 5}, {0, 3, 6}, 8, 3, 8, 6).p), (Flags{true, false}));    // backwards
  EXPECT_EQ(in_bounds(Varlen({-2, 4}, {0, 4}, 6, 4, 4, 4).p), (Flags{false}));               // negative start
  EXPECT_EQ(in_bounds(Varlen({0, 5, 12}, {0, 5, 12}, 6, 7, 12, 12).p), (Flags{true, false})); // 7 rows, max 6
  EXPECT_EQ(in_bounds(Varlen({0, 2, 4}, {0, 3, 7}, 2, 4, 4, 6).p), (Flags{true, false}));    // keys past total
  EXPECT_EQ(in_bounds(Varlen({0, 2, 4}, {0, 3, 7}, 2, 3, 4, 7).p), (Flags{true, false}));    // 4 keys, max 3
  Varlen used({0, 2, 4}, {0, 3, 7}, 2, 4, 4, 7);
  used.use({4, 1});  // sequence 0 has 3 keys
  EXPECT_EQ(in_bounds(used.p), (Flags{false, true}));
  used.use({-1, 4});
  EXPECT_EQ(in_bounds(used.p), (Flags{false, true}));
}

TEST(SequenceInBounds, SeqUsedKInBatchForm) {
  std::vector<int32_t> used = {3, 9, -1, 8};
  ForwardParams p = default_forward_params();
  p.batch = 4, p.seqlen_q = 4, p.seqlen_k = 8, p.seqused_k = used.data();
  EXPECT_EQ(in_bounds(p), (Flags{true, false, false, true}));
  p.seqused_k = nullptr;
  EXPECT_EQ(in_bounds(p), (Flags{true, true, true, true}));
}

}  // namespace
}  // namespace tileattn::test
