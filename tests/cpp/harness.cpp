#include "harness.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "cpu/convert.h"

namespace tileattn::test {
namespace {

size_t element_size(tileattn_dtype dtype) { return dtype == TILEATTN_FLOAT32 ? 4 : 2; }

// A q-, k- or v-shaped tensor in storage: bytes plus the strides the library sees.
struct Tensor {
  tileattn_dtype dtype;
  int64_t batch_stride = 0, row_stride = 0, head_stride = 0;
  std::vector<uint8_t> bytes;

  void* data() { return bytes.data(); }
  double get(int64_t i) const {
    if (dtype == TILEATTN_FLOAT32) {
      float f;
      std::memcpy(&f, &bytes[i * 4], 4);
      return f;
    }
    uint16_t h;
    std::memcpy(&h, &bytes[i * 2], 2);
    return dtype == TILEATTN_BFLOAT16 ? cpu::bf16_to_float(h) : cpu::fp16_to_float(h);
  }
  void set(int64_t i, double x) {
    const float f = static_cast<float>(x);
    if (dtype == TILEATTN_FLOAT32) {
      std::memcpy(&bytes[i * 4], &f, 4);
      return;
    }
    const uint16_t h = dtype == TILEATTN_BFLOAT16 ? cpu::float_to_bf16(f) : cpu::float_to_fp16(f);
    std::memcpy(&bytes[i * 2], &h, 2);
  }
};

// Sizes of one side (queries or keys) of the problem.
struct Side {
  bool varlen;
  int batch, rows_per_batch, heads, dim;  // rows_per_batch: seqlen (batch form) or total rows
  const std::vector<int>* cu;
};

// Contiguous (B, S, H, D); strided pads rows and heads, and stores the key side heads-major.
Tensor make_tensor(tileattn_dtype dtype, const Side& s, bool strided, bool key_side) {
  Tensor t{dtype};
  const int64_t rows = s.rows_per_batch, D = s.dim, H = s.heads;
  const int64_t batches = s.varlen ? 1 : s.batch;
  if (!strided) {
    t.head_stride = D, t.row_stride = H * D, t.batch_stride = rows * H * D;
  } else if (!key_side) {
    t.head_stride = D + 3, t.row_stride = H * (D + 3) + 5, t.batch_stride = rows * t.row_stride + 7;
  } else {
    t.row_stride = D + 1, t.head_stride = rows * (D + 1) + 2, t.batch_stride = H * t.head_stride + 3;
  }
  if (s.varlen) t.batch_stride = 0;
  const int64_t extent = (batches - 1) * t.batch_stride + (rows - 1) * t.row_stride +
                         (H - 1) * t.head_stride + D;
  t.bytes.assign(std::max<int64_t>(extent, 1) * element_size(dtype), 0);
  return t;
}

// Storage index of canonical element (packed row, head, d).
int64_t storage_index(const Tensor& t, const Side& s, int row, int head, int d) {
  if (s.varlen) return row * t.row_stride + head * t.head_stride + d;
  const int b = row / s.rows_per_batch, i = row % s.rows_per_batch;
  return b * t.batch_stride + i * t.row_stride + head * t.head_stride + d;
}

int total_rows(const Side& s) { return s.varlen ? s.rows_per_batch : s.batch * s.rows_per_batch; }

// Fills storage with N(0,1) values and returns them (as stored) in canonical order.
std::vector<double> fill_random(Tensor& t, const Side& s, std::mt19937_64& rng) {
  std::normal_distribution<double> normal;
  std::vector<double> canonical(static_cast<size_t>(total_rows(s)) * s.heads * s.dim);
  for (int r = 0; r < total_rows(s); ++r)
    for (int h = 0; h < s.heads; ++h)
      for (int d = 0; d < s.dim; ++d) {
        const int64_t idx = storage_index(t, s, r, h, d);
        t.set(idx, normal(rng));
        canonical[(static_cast<size_t>(r) * s.heads + h) * s.dim + d] = t.get(idx);
      }
  return canonical;
}

void poison(Tensor& t) {
  for (int64_t i = 0; i < static_cast<int64_t>(t.bytes.size() / element_size(t.dtype)); ++i) {
    t.set(i, std::numeric_limits<double>::quiet_NaN());
  }
}

std::vector<double> read_canonical(const Tensor& t, const Side& s) {
  std::vector<double> canonical(static_cast<size_t>(total_rows(s)) * s.heads * s.dim);
  for (int r = 0; r < total_rows(s); ++r)
    for (int h = 0; h < s.heads; ++h)
      for (int d = 0; d < s.dim; ++d)
        canonical[(static_cast<size_t>(r) * s.heads + h) * s.dim + d] = t.get(storage_index(t, s, r, h, d));
  return canonical;
}

double floor_for(tileattn_dtype dtype, bool lse) {
  if (lse) return dtype == TILEATTN_FLOAT32 ? 1e-5 : 1e-4;
  switch (dtype) {
    case TILEATTN_FLOAT32: return 1e-6;
    case TILEATTN_FLOAT16: return 1e-4;
    case TILEATTN_BFLOAT16: return 1e-3;
  }
  return 0;
}

// Everything one run needs: storage tensors, sides, problem and params.
struct Setup {
  Side qs, ks;
  Tensor q, k, v, out, dout;
  std::vector<float> lse, alibi;
  std::vector<int32_t> cu_q, cu_k, used_k;
  Problem problem;
  ForwardParams params;
};

Setup build(const Case& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Setup s;
  const bool varlen = !c.varlen_q.empty();
  const int batch = varlen ? static_cast<int>(c.varlen_q.size()) : c.batch;
  s.cu_q.assign(1, 0);
  s.cu_k.assign(1, 0);
  for (int b = 0; b < batch; ++b) {
    s.cu_q.push_back(s.cu_q.back() + (varlen ? c.varlen_q[b] : c.seqlen_q));
    s.cu_k.push_back(s.cu_k.back() + (varlen ? c.varlen_k[b] : c.seqlen_k));
  }
  int max_q = 0, max_k = 0;
  for (int b = 0; b < batch; ++b) {
    max_q = std::max(max_q, s.cu_q[b + 1] - s.cu_q[b]);
    max_k = std::max(max_k, s.cu_k[b + 1] - s.cu_k[b]);
    const int stored = s.cu_k[b + 1] - s.cu_k[b];
    s.used_k.push_back(c.seqused_k ? static_cast<int>(rng() % (stored + 1)) : stored);
  }
  s.qs = Side{varlen, batch, varlen ? s.cu_q[batch] : c.seqlen_q, c.heads, c.dim, nullptr};
  s.ks = Side{varlen, batch, varlen ? s.cu_k[batch] : c.seqlen_k, c.heads_k, c.dim, nullptr};
  s.q = make_tensor(c.dtype, s.qs, c.strided, false);
  s.k = make_tensor(c.dtype, s.ks, c.strided, true);
  s.v = make_tensor(c.dtype, s.ks, c.strided, true);
  s.out = make_tensor(c.dtype, s.qs, c.strided, false);
  s.dout = make_tensor(c.dtype, s.qs, c.strided, false);

  Problem& p = s.problem;
  p.batch = batch, p.heads = c.heads, p.heads_k = c.heads_k, p.dim = c.dim;
  p.cu_q.assign(s.cu_q.begin(), s.cu_q.end());
  p.cu_k.assign(s.cu_k.begin(), s.cu_k.end());
  p.used_k.assign(s.used_k.begin(), s.used_k.end());
  const float scale = c.scale != 0.0f ? c.scale : 1.0f / std::sqrt(static_cast<float>(c.dim));
  p.scale = scale;
  p.window_left = c.window_left;
  p.window_right = c.causal ? 0 : c.window_right;
  p.softcap = c.softcap;
  p.dropout_p = c.dropout_p;
  p.seed = rng();
  p.offset = rng() % 1000;
  p.q = fill_random(s.q, s.qs, rng);
  p.k = fill_random(s.k, s.ks, rng);
  p.v = fill_random(s.v, s.ks, rng);
  p.dout = fill_random(s.dout, s.qs, rng);
  if (c.alibi != Alibi::kNone) {
    std::uniform_real_distribution<float> slope(0.01f, 1.0f);
    const int rows = c.alibi == Alibi::kPerHead ? 1 : batch;
    s.alibi.resize(static_cast<size_t>(rows) * c.heads);
    for (float& a : s.alibi) a = slope(rng);
    for (int b = 0; b < batch; ++b)
      for (int h = 0; h < c.heads; ++h)
        p.alibi.push_back(s.alibi[(c.alibi == Alibi::kPerHead ? 0 : b) * c.heads + h]);
  }

  ForwardParams& f = s.params;
  f = default_forward_params();
  f.q = s.q.data(), f.k = s.k.data(), f.v = s.v.data(), f.out = s.out.data();
  f.q_batch_stride = s.q.batch_stride, f.q_row_stride = s.q.row_stride, f.q_head_stride = s.q.head_stride;
  f.k_batch_stride = s.k.batch_stride, f.k_row_stride = s.k.row_stride, f.k_head_stride = s.k.head_stride;
  f.v_batch_stride = s.v.batch_stride, f.v_row_stride = s.v.row_stride, f.v_head_stride = s.v.head_stride;
  f.out_batch_stride = s.out.batch_stride, f.out_row_stride = s.out.row_stride;
  f.out_head_stride = s.out.head_stride;
  const int total_q = s.cu_q[batch];
  s.lse.assign(static_cast<size_t>(c.heads) * total_q, std::numeric_limits<float>::quiet_NaN());
  f.softmax_lse = s.lse.data();
  f.lse_head_stride = varlen ? total_q : c.seqlen_q;
  f.lse_batch_stride = varlen ? 0 : static_cast<int64_t>(c.heads) * c.seqlen_q;
  f.batch = batch, f.num_heads = c.heads, f.num_heads_k = c.heads_k, f.head_dim = c.dim;
  f.seqlen_q = varlen ? max_q : c.seqlen_q;
  f.seqlen_k = varlen ? max_k : c.seqlen_k;
  if (varlen) {
    f.cu_seqlens_q = s.cu_q.data(), f.cu_seqlens_k = s.cu_k.data();
    f.total_q = total_q, f.total_k = s.cu_k[batch];
  }
  if (c.seqused_k) f.seqused_k = s.used_k.data();
  f.softmax_scale = c.scale;
  f.window_left = p.window_left, f.window_right = p.window_right;
  f.softcap = c.softcap;
  if (!s.alibi.empty()) {
    f.alibi_slopes = s.alibi.data();
    f.alibi_batch_stride = c.alibi == Alibi::kPerHead ? 0 : c.heads;
  }
  f.dropout_p = c.dropout_p, f.philox_seed = p.seed, f.philox_offset = p.offset;
  f.dtype = c.dtype;
  f.device = TILEATTN_DEVICE_CPU;
  f.num_threads = c.num_threads;
  return s;
}

// Our LSE in canonical (H, total_q) order.
std::vector<double> lse_canonical(const Setup& s) {
  const int total_q = s.cu_q.back();
  std::vector<double> lse(static_cast<size_t>(s.params.num_heads) * total_q);
  for (int b = 0; b < s.params.batch; ++b)
    for (int h = 0; h < s.params.num_heads; ++h)
      for (int i = 0; i < s.cu_q[b + 1] - s.cu_q[b]; ++i) {
        const int64_t idx = s.params.cu_seqlens_q
                                ? h * s.params.lse_head_stride + s.cu_q[b] + i
                                : b * s.params.lse_batch_stride + h * s.params.lse_head_stride + i;
        lse[static_cast<size_t>(h) * total_q + s.cu_q[b] + i] = s.lse[idx];
      }
  return lse;
}

struct Gradients {
  Tensor dq, dk, dv;
};

Gradients run_backward(Setup& s) {
  Gradients g{make_tensor(s.params.dtype, s.qs, false, false),
              make_tensor(s.params.dtype, s.ks, false, true),
              make_tensor(s.params.dtype, s.ks, false, true)};
  poison(g.dq), poison(g.dk), poison(g.dv);
  BackwardParams b = default_backward_params();
  b.fwd = s.params;
  b.dout = s.dout.data();
  b.dout_batch_stride = s.dout.batch_stride, b.dout_row_stride = s.dout.row_stride;
  b.dout_head_stride = s.dout.head_stride;
  b.dq = g.dq.data(), b.dk = g.dk.data(), b.dv = g.dv.data();
  b.dq_batch_stride = g.dq.batch_stride, b.dq_row_stride = g.dq.row_stride, b.dq_head_stride = g.dq.head_stride;
  b.dk_batch_stride = g.dk.batch_stride, b.dk_row_stride = g.dk.row_stride, b.dk_head_stride = g.dk.head_stride;
  b.dv_batch_stride = g.dv.batch_stride, b.dv_row_stride = g.dv.row_stride, b.dv_head_stride = g.dv.head_stride;
  b.deterministic = 1;
  backward(b);
  return g;
}

}  // namespace

double max_error(const std::vector<double>& x, const std::vector<double>& ref) {
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isinf(ref[i]) && x[i] == ref[i]) continue;
    const double e = std::fabs(x[i] - ref[i]);
    worst = std::isnan(e) ? std::numeric_limits<double>::infinity() : std::max(worst, e);
  }
  return worst;
}

Outcome run_case(const Case& c, uint64_t seed) {
  Setup s = build(c, seed);
  poison(s.out);
  Outcome o;
  if (c.probs) {
    ForwardParams& f = s.params;
    o.probs.assign(static_cast<size_t>(f.batch) * f.num_heads * f.seqlen_q * f.seqlen_k,
                   std::numeric_limits<float>::quiet_NaN());
    f.attn_probs = o.probs.data();
    f.probs_row_stride = f.seqlen_k;
    f.probs_head_stride = static_cast<int64_t>(f.seqlen_q) * f.seqlen_k;
    f.probs_batch_stride = f.num_heads * f.probs_head_stride;
  }
  forward(s.params);
  o.problem = s.problem;
  o.ours.out = read_canonical(s.out, s.qs);
  o.ours.lse = lse_canonical(s);
  const Result exact = reference_attention(s.problem, true, c.dtype, c.backward);
  const Result naive = reference_attention(s.problem, false, c.dtype, c.backward);
  o.out = {max_error(o.ours.out, exact.out), max_error(naive.out, exact.out), floor_for(c.dtype, false)};
  o.lse = {max_error(o.ours.lse, exact.lse), max_error(naive.lse, exact.lse), floor_for(c.dtype, true)};
  if (!c.backward) return o;
  Gradients g = run_backward(s);
  o.ours.dq = read_canonical(g.dq, s.qs);
  o.ours.dk = read_canonical(g.dk, s.ks);
  o.ours.dv = read_canonical(g.dv, s.ks);
  // The backward recomputes P = exp(S - LSE) from the float32 LSE the forward saved; that
  // rounding moves P by up to 2^-24 |LSE| relative, which the one-pass naive softmax never pays.
  double lse_max = 0;
  for (double x : exact.lse) {
    if (std::isfinite(x)) lse_max = std::max(lse_max, std::fabs(x));
  }
  auto grad_floor = [&](const std::vector<double>& ref) {
    double ref_max = 0;
    for (double x : ref) ref_max = std::max(ref_max, std::fabs(x));
    return floor_for(c.dtype, false) + 4 * std::ldexp(1.0, -24) * lse_max * ref_max;
  };
  o.dq = {max_error(o.ours.dq, exact.dq), max_error(naive.dq, exact.dq), grad_floor(exact.dq)};
  o.dk = {max_error(o.ours.dk, exact.dk), max_error(naive.dk, exact.dk), grad_floor(exact.dk)};
  o.dv = {max_error(o.ours.dv, exact.dv), max_error(naive.dv, exact.dv), grad_floor(exact.dv)};
  return o;
}

std::vector<uint8_t> backward_bits(const Case& c, uint64_t seed) {
  Setup s = build(c, seed);
  forward(s.params);
  Gradients g = run_backward(s);
  std::vector<uint8_t> bits = g.dq.bytes;
  bits.insert(bits.end(), g.dk.bytes.begin(), g.dk.bytes.end());
  bits.insert(bits.end(), g.dv.bytes.begin(), g.dv.bytes.end());
  return bits;
}

}  // namespace tileattn::test
