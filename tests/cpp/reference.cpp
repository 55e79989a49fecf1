#include "reference.h"

#include <cmath>
#include <limits>

#include "common/mask.h"
#include "common/philox.h"
#include "cpu/convert.h"

namespace tileattn::test {

double round_to(tileattn_dtype dtype, double x) {
  const float f = static_cast<float>(x);
  switch (dtype) {
    case TILEATTN_FLOAT32: return f;
    case TILEATTN_BFLOAT16: return cpu::bf16_to_float(cpu::float_to_bf16(f));
    case TILEATTN_FLOAT16: return cpu::fp16_to_float(cpu::float_to_fp16(f));
  }
  return x;
}

namespace {

struct Rounder {
  bool exact;
  tileattn_dtype dtype;
  // A product's result: float32 accumulation, then stored in dtype.
  double stored(double x) const { return exact ? x : round_to(dtype, x); }
  // A float32 intermediate (softmax statistics, row sums).
  double f32(double x) const { return exact ? x : static_cast<double>(static_cast<float>(x)); }
  // One step of a float32 (naive) or float64 (exact) running sum.
  double add(double sum, double term) const { return f32(sum + term); }
};

}  // namespace

Result reference_attention(const Problem& p, bool exact, tileattn_dtype dtype, bool with_backward) {
  const Rounder round{exact, dtype};
  const int H = p.heads, D = p.dim, group = p.heads / p.heads_k;
  const int total_q = p.cu_q[p.batch], total_k = p.cu_k[p.batch];
  const double inf = std::numeric_limits<double>::infinity();
  Result res;
  res.out.assign(static_cast<size_t>(total_q) * H * D, 0.0);
  res.lse.assign(static_cast<size_t>(H) * total_q, inf);
  if (with_backward) {
    res.dq.assign(res.out.size(), 0.0);
    res.dk.assign(static_cast<size_t>(total_k) * p.heads_k * D, 0.0);
    res.dv.assign(res.dk.size(), 0.0);
  }
  const uint32_t threshold = dropout_threshold(static_cast<float>(p.dropout_p));
  for (int b = 0; b < p.batch; ++b) {
    const int sq = p.cu_q[b + 1] - p.cu_q[b], sk = p.used_k[b];
    for (int h = 0; h < H; ++h) {
      const int hk = h / group;
      auto Q = [&](int i, int d) { return p.q[((p.cu_q[b] + i) * H + h) * D + d]; };
      auto K = [&](int j, int d) { return p.k[((p.cu_k[b] + j) * p.heads_k + hk) * D + d]; };
      auto V = [&](int j, int d) { return p.v[((p.cu_k[b] + j) * p.heads_k + hk) * D + d]; };
      auto dO = [&](int i, int d) { return p.dout[((p.cu_q[b] + i) * H + h) * D + d]; };
      const double slope = p.alibi.empty() ? 0.0 : p.alibi[b * H + h];
      for (int i = 0; i < sq; ++i) {
        const ColumnRange vis = visible_columns(i, sq, sk, p.window_left, p.window_right);
        std::vector<double> s(sk, -inf), dtanh(sk, 1.0), prob(sk, 0.0), zscale(sk, 0.0);
        double m = -inf;
        for (int j = vis.first; j <= vis.last; ++j) {
          double dot = 0;
          for (int d = 0; d < D; ++d) dot = round.add(dot, Q(i, d) * K(j, d));
          double x = round.stored(dot) * p.scale;
          if (p.softcap > 0) {
            const double th = std::tanh(x / p.softcap);
            dtanh[j] = 1 - th * th;
            x = p.softcap * th;
          }
          x -= slope * alibi_distance(i, j, sq, sk);
          s[j] = round.stored(x);
          m = std::max(m, s[j]);
        }
        const size_t lse_index = static_cast<size_t>(h) * total_q + p.cu_q[b] + i;
        if (vis.first > vis.last) continue;  // no visible key: out 0, lse +inf
        double sum = 0;
        for (int j = vis.first; j <= vis.last; ++j) sum = round.add(sum, std::exp(s[j] - m));
        res.lse[lse_index] = round.f32(m + std::log(sum));
        for (int j = vis.first; j <= vis.last; ++j) {
          prob[j] = round.stored(std::exp(s[j] - m) / sum);
          const bool keep = p.dropout_p == 0 ||
                            dropout_keep(p.seed, p.offset, b, h, H, i, j, threshold);
          zscale[j] = keep ? 1.0 / (1.0 - p.dropout_p) : 0.0;
        }
        double* o = &res.out[((p.cu_q[b] + i) * H + h) * D];
        for (int d = 0; d < D; ++d) {
          double acc = 0;
          for (int j = vis.first; j <= vis.last; ++j) acc = round.add(acc, prob[j] * zscale[j] * V(j, d));
          o[d] = round.stored(acc);
        }
        if (!with_backward) continue;
        // dP_ij = z_ij / (1 - p) dO_i . v_j;  D_i = dO_i . O_i;  dS = P o (dP - D).
        double delta = 0;
        for (int d = 0; d < D; ++d) delta = round.add(delta, dO(i, d) * o[d]);
        for (int j = vis.first; j <= vis.last; ++j) {
          double dp = 0;
          for (int d = 0; d < D; ++d) dp = round.add(dp, dO(i, d) * V(j, d));
          dp = round.stored(dp) * zscale[j];
          const double ds = round.stored(prob[j] * (dp - delta) * dtanh[j] * p.scale);
          for (int d = 0; d < D; ++d) {
            double& dq = res.dq[((p.cu_q[b] + i) * H + h) * D + d];
            double& dk = res.dk[((p.cu_k[b] + j) * p.heads_k + hk) * D + d];
            double& dv = res.dv[((p.cu_k[b] + j) * p.heads_k + hk) * D + d];
            dq = round.add(dq, ds * K(j, d));
            dk = round.add(dk, ds * Q(i, d));
            dv = round.add(dv, prob[j] * zscale[j] * dO(i, d));
          }
        }
      }
    }
  }
  if (!exact) {
    for (auto* grad : {&res.dq, &res.dk, &res.dv}) {
      for (double& x : *grad) x = round.stored(x);
    }
  }
  return res;
}

}  // namespace tileattn::test
