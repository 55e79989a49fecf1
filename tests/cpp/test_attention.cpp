// Forward and backward of the CPU backend against float64, with FA's rule
//   error(ours) <= 2 * error(naive same-precision) + floor
// for out, LSE, dQ, dK and dV, over every option and on odd shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "harness.h"

namespace tileattn::test {
namespace {

std::vector<Case> cases() {
  std::vector<Case> list;
  auto add = [&](Case c) { list.push_back(c); };
  Case c;
  c.name = "seqlen1", c.seqlen_q = 1, c.seqlen_k = 1, add(c);
  c = Case{}, c.name = "seqlen17", add(c);
  c = Case{}, c.name = "seqlen127_d40", c.seqlen_q = c.seqlen_k = 127, c.dim = 40, add(c);
  c = Case{}, c.name = "seqlen1000", c.seqlen_q = c.seqlen_k = 1000, c.heads = c.heads_k = 1, add(c);
  c = Case{}, c.name = "sq127_sk17", c.seqlen_q = 127, c.seqlen_k = 17, add(c);
  c = Case{}, c.name = "sq17_sk300_d72", c.seqlen_q = 17, c.seqlen_k = 300, c.dim = 72, add(c);
  c = Case{}, c.name = "gqa7_d96", c.heads = 14, c.heads_k = 2, c.seqlen_q = 33, c.seqlen_k = 150, c.dim = 96, add(c);
  c = Case{}, c.name = "mqa7_d200", c.heads = 7, c.heads_k = 1, c.seqlen_q = 70, c.seqlen_k = 65, c.dim = 200, add(c);
  c = Case{}, c.name = "d256_batch3", c.batch = 3, c.seqlen_q = 40, c.seqlen_k = 130, c.dim = 256, add(c);
  c = Case{}, c.name = "causal_sq_gt_sk", c.causal = true, c.seqlen_q = 150, c.seqlen_k = 70, add(c);
  c = Case{}, c.name = "causal_sq_lt_sk", c.causal = true, c.seqlen_q = 70, c.seqlen_k = 300, add(c);
  c = Case{}, c.name = "causal_1000", c.causal = true, c.seqlen_q = c.seqlen_k = 1000, c.heads = c.heads_k = 1, c.dim = 32, add(c);
  c = Case{}, c.name = "window_both", c.window_left = 20, c.window_right = 5, c.seqlen_q = 200, c.seqlen_k = 260, add(c);
  c = Case{}, c.name = "window_left_causal", c.window_left = 33, c.causal = true, c.seqlen_q = 300, c.seqlen_k = 200, add(c);
  c = Case{}, c.name = "window_right_only", c.window_right = 0, c.window_left = -1, c.seqlen_q = 90, c.seqlen_k = 90, add(c);
  c = Case{}, c.name = "softcap", c.softcap = 2.0f, c.seqlen_q = 77, c.seqlen_k = 140, add(c);
  c = Case{}, c.name = "alibi_heads", c.alibi = Alibi::kPerHead, c.seqlen_q = 64, c.seqlen_k = 129, c.heads = 4, add(c);
  c = Case{}, c.name = "alibi_batch_causal", c.alibi = Alibi::kPerBatchHead, c.batch = 2, c.causal = true,
  c.seqlen_q = 100, c.seqlen_k = 100, add(c);
  c = Case{}, c.name = "dropout", c.dropout_p = 0.17f, c.seqlen_q = 129, c.seqlen_k = 200, add(c);
  c = Case{}, c.name = "dropout_gqa_causal", c.dropout_p = 0.3f, c.heads = 6, c.heads_k = 3, c.causal = true,
  c.seqlen_q = 70, c.seqlen_k = 90, add(c);
  c = Case{}, c.name = "scale", c.scale = 0.5f, c.seqlen_q = 40, c.seqlen_k = 50, add(c);
  c = Case{}, c.name = "strided", c.strided = true, c.batch = 2, c.heads = 4, c.heads_k = 2, c.seqlen_q = 66,
  c.seqlen_k = 130, add(c);
  c = Case{}, c.name = "varlen_zero_len", c.varlen_q = {5, 0, 130, 17}, c.varlen_k = {40, 3, 129, 0}, c.heads = 3,
  c.heads_k = 1, add(c);
  c = Case{}, c.name = "varlen_causal_strided", c.varlen_q = {65, 1, 200}, c.varlen_k = {30, 70, 200},
  c.causal = true, c.strided = true, add(c);
  c = Case{}, c.name = "seqused_k", c.seqused_k = true, c.batch = 3, c.seqlen_q = 20, c.seqlen_k = 150, add(c);
  c = Case{}, c.name = "varlen_seqused_window", c.varlen_q = {50, 128}, c.varlen_k = {60, 300}, c.seqused_k = true,
  c.window_left = 16, c.window_right = 8, add(c);
  c = Case{}, c.name = "everything", c.varlen_q = {33, 100}, c.varlen_k = {140, 64}, c.heads = 4, c.heads_k = 2,
  c.causal = true, c.window_left = 40, c.softcap = 5.0f, c.alibi = Alibi::kPerBatchHead, c.dropout_p = 0.1f,
  c.dim = 72, c.strided = true, add(c);
  return list;
}

const char* dtype_label(tileattn_dtype d) {
  return d == TILEATTN_FLOAT32 ? "fp32" : d == TILEATTN_BFLOAT16 ? "bf16" : "fp16";
}

}  // namespace

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

namespace {

class Attention : public ::testing::TestWithParam<std::tuple<Case, tileattn_dtype>> {};

void expect_within(const char* what, const Errors& e) {
  EXPECT_TRUE(e.ok()) << what << ": ours " << e.ours << " > 2 x naive " << e.naive << " + " << e.floor;
}

TEST_P(Attention, MatchesFloat64Reference) {
  Case c = std::get<0>(GetParam());
  c.dtype = std::get<1>(GetParam());
  const Outcome o = run_case(c, 1234 + c.seqlen_q * 7 + c.dim);
  expect_within("out", o.out);
  expect_within("lse", o.lse);
  expect_within("dq", o.dq);
  expect_within("dk", o.dk);
  expect_within("dv", o.dv);
}

INSTANTIATE_TEST_SUITE_P(
    Cpu, Attention,
    ::testing::Combine(::testing::ValuesIn(cases()),
                       ::testing::Values(TILEATTN_FLOAT32, TILEATTN_BFLOAT16, TILEATTN_FLOAT16)),
    [](const auto& info) {
      return std::get<0>(info.param).name + "_" + dtype_label(std::get<1>(info.param));
    });

// Rows that see no key (causal with Sq > Sk: the first Sq - Sk rows) give 0 and LSE = +inf.
TEST(AttentionEdges, RowsWithoutKeysAreZeroWithInfiniteLse) {
  Case c;
  c.causal = true, c.seqlen_q = 40, c.seqlen_k = 10, c.heads = c.heads_k = 1, c.dim = 8;
  const Outcome o = run_case(c, 7);
  for (int i = 0; i < 30; ++i) {
    EXPECT_TRUE(std::isinf(o.ours.lse[i]) && o.ours.lse[i] > 0) << "row " << i;
    for (int d = 0; d < 8; ++d) EXPECT_EQ(o.ours.out[i * 8 + d], 0.0) << "row " << i;
  }
  EXPECT_TRUE(std::isfinite(o.ours.lse[30]));
  for (double g : o.ours.dq) EXPECT_TRUE(std::isfinite(g));
}

// Each task is independent, so the forward does not depend on the thread count.
TEST(AttentionEdges, ForwardIndependentOfThreadCount) {
  Case c;
  c.seqlen_q = 300, c.seqlen_k = 200, c.dtype = TILEATTN_BFLOAT16, c.backward = false, c.num_threads = 1;
  const Outcome one = run_case(c, 99);
  c.num_threads = 2;
  const Outcome two = run_case(c, 99);
  EXPECT_EQ(one.ours.out, two.ours.out);
  EXPECT_EQ(one.ours.lse, two.ours.lse);
}

// The backward splits keys into chunks when (batch, head) pairs are few; sums run in a fixed
// order, so repeated runs are bitwise equal.
TEST(AttentionEdges, BackwardIsBitwiseDeterministic) {
  Case c;
  c.seqlen_q = 200, c.seqlen_k = 700, c.heads = 2, c.heads_k = 1, c.dtype = TILEATTN_BFLOAT16;
  c.num_threads = 2;
  const std::vector<uint8_t> first = backward_bits(c, 5);
  for (int run = 0; run < 3; ++run) EXPECT_EQ(first, backward_bits(c, 5)) << "run " << run;
}

}  // namespace
}  // namespace tileattn::test
