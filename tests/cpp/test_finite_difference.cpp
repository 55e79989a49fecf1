// The float64 reference's backward is the ground truth for dQ, dK, dV; here it is itself checked
// against central finite differences of the float64 forward, on tiny shapes with every option.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "reference.h"

namespace tileattn::test {
namespace {

Problem tiny_problem(bool options) {
  std::mt19937_64 rng(11);
  std::normal_distribution<double> normal;
  Problem p;
  p.batch = 2, p.heads = 4, p.heads_k = 2, p.dim = 3;
  p.cu_q = {0, 5, 8};
  p.cu_k = {0, 4, 10};
  p.used_k = {4, 5};
  p.scale = 0.7;
  p.window_left = options ? 2 : -1;
  p.window_right = options ? 1 : -1;
  p.softcap = options ? 1.5 : 0.0;
  if (options) p.alibi = {0.3, 0.1, 0.5, 0.2, 0.25, 0.05, 0.4, 0.6};
  p.dropout_p = options ? 0.3 : 0.0;
  p.seed = 17, p.offset = 4;
  for (auto* v : {&p.q, &p.dout}) v->resize(8 * 4 * 3);
  for (auto* v : {&p.k, &p.v}) v->resize(10 * 2 * 3);
  for (auto* v : {&p.q, &p.k, &p.v, &p.dout})
    for (double& x : *v) x = normal(rng);
  return p;
}

double loss(const Problem& p) {
  const Result r = reference_attention(p, true, TILEATTN_FLOAT32, false);
  double l = 0;
  for (size_t i = 0; i < r.out.size(); ++i) l += r.out[i] * p.dout[i];
  return l;
}

void check_gradients(bool options) {
  Problem p = tiny_problem(options);
  const Result analytic = reference_attention(p, true, TILEATTN_FLOAT32, true);
  const double h = 1e-6;
  struct Input {
    std::vector<double>* values;
    const std::vector<double>* grad;
    const char* name;
  };
  for (const Input& in : {Input{&p.q, &analytic.dq, "dq"}, Input{&p.k, &analytic.dk, "dk"},
                          Input{&p.v, &analytic.dv, "dv"}}) {
    for (size_t i = 0; i < in.values->size(); ++i) {
      const double saved = (*in.values)[i];
      (*in.values)[i] = saved + h;
      const double up = loss(p);
      (*in.values)[i] = saved - h;
      const double down = loss(p);
      (*in.values)[i] = saved;
      EXPECT_NEAR((up - down) / (2 * h), (*in.grad)[i], 1e-6) << in.name << "[" << i << "]";
    }
  }
}

TEST(FiniteDifference, PlainAttention) { check_gradients(false); }
TEST(FiniteDifference, WindowSoftcapAlibiDropoutGqaVarlen) { check_gradients(true); }

}  // namespace
}  // namespace tileattn::test
