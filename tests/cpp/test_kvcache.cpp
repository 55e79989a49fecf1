// flash_attn_with_kvcache on the CPU: append (with rotary) into contiguous and paged caches, then
// attention over the cache against float64 with FA's rule; unused cache slots hold NaN and must
// never reach the output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "cpu/convert.h"
#include "harness.h"
#include "reference.h"

namespace tileattn::test {
namespace {

struct KvCase {
  std::string name;
  tileattn_dtype dtype = TILEATTN_BFLOAT16;
  int batch = 3, seqlen_q = 1, heads = 8, heads_k = 2, dim = 64;
  int cache_len = 300;                 // Smax, or pages x page_size
  std::vector<int> cache_seqlens = {0, 17, 250};
  int seqlen_new = 1;                  // 0: no append
  int page_size = 0;                   // 0: contiguous cache
  bool batch_idx = false, leftpad = false, causal = false;
  int rotary_dim = 0;                  // 0: no rotary
  bool interleaved = true;
  int window_left = -1;
  bool uniform = false;                // cache_seqlens as one length (all entries equal)
};

// Storage helpers: values kept as the dtype's bits in a float32/uint16 buffer.
struct Buffer {
  tileattn_dtype dtype;
  std::vector<float> f32;
  std::vector<uint16_t> u16;
  Buffer(tileattn_dtype d, size_t n) : dtype(d) {
    if (d == TILEATTN_FLOAT32) f32.assign(n, 0.0f); else u16.assign(n, 0);
  }
  void* data() { return dtype == TILEATTN_FLOAT32 ? static_cast<void*>(f32.data()) : u16.data(); }
  double get(size_t i) const {
    if (dtype == TILEATTN_FLOAT32) return f32[i];
    return dtype == TILEATTN_BFLOAT16 ? cpu::bf16_to_float(u16[i]) : cpu::fp16_to_float(u16[i]);
  }
  void set(size_t i, double x) {
    const float f = static_cast<float>(x);
    if (dtype == TILEATTN_FLOAT32) f32[i] = f;
    else u16[i] = dtype == TILEATTN_BFLOAT16 ? cpu::float_to_bf16(f) : cpu::float_to_fp16(f);
  }
};

void rotate64(std::vector<double>& x, const Buffer& cos, const Buffer& sin, int rotary_dim, int64_t pos,
              bool interleaved) {
  const int half = rotary_dim / 2;
  for (int j = 0; j < half; ++j) {
    const int a = interleaved ? 2 * j : j, b = interleaved ? 2 * j + 1 : j + half;
    const double c = cos.get(pos * half + j), s = sin.get(pos * half + j);
    const double x0 = x[a], x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x0 * s + x1 * c;
  }
}

void run_kvcache(const KvCase& c) {
  std::mt19937_64 rng(c.cache_len * 31 + c.dim + c.seqlen_new);
  std::normal_distribution<double> normal;
  const int B = c.batch, Sq = c.seqlen_q, H = c.heads, Hk = c.heads_k, D = c.dim;
  const bool paged = c.page_size > 0;
  const int entries = c.batch_idx ? B + 2 : B;  // spare rows, so the mapping matters
  const int max_blocks = paged ? c.cache_len / c.page_size : 0;
  const int num_blocks = paged ? entries * max_blocks + 3 : 0;
  const int64_t rows_per_entry = paged ? c.page_size : c.cache_len;
  const int64_t cache_entries = paged ? num_blocks : entries;
  const int64_t row_stride = static_cast<int64_t>(Hk) * D, entry_stride = rows_per_entry * row_stride;
  // Caches start all NaN: a read of any slot outside the visible range poisons the output.
  Buffer k_cache(c.dtype, cache_entries * entry_stride), v_cache(c.dtype, cache_entries * entry_stride);
  for (size_t i = 0; i < cache_entries * entry_stride; ++i) {
    k_cache.set(i, std::numeric_limits<double>::quiet_NaN());
    v_cache.set(i, std::numeric_limits<double>::quiet_NaN());
  }
  std::vector<int32_t> batch_idx(B), leftpad(B, 0), seqlens(c.cache_seqlens.begin(), c.cache_seqlens.end());
  std::iota(batch_idx.begin(), batch_idx.end(), 0);
  if (c.batch_idx) std::shuffle(batch_idx.begin(), batch_idx.end(), rng), batch_idx[0] = B + 1;
  std::vector<int32_t> table(static_cast<size_t>(entries) * std::max(max_blocks, 1));
  std::vector<int32_t> pages(num_blocks);
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  for (size_t i = 0; i < table.size() && paged; ++i) table[i] = pages[i];
  auto slot = [&](int b, int64_t pos) -> int64_t {
    const int64_t row = batch_idx[b];
    if (!paged) return row * entry_stride + pos * row_stride;
    return table[row * max_blocks + pos / c.page_size] * entry_stride + (pos % c.page_size) * row_stride;
  };
  for (int b = 0; b < B; ++b) {
    if (c.leftpad) leftpad[b] = seqlens[b] / 3;
    for (int64_t pos = leftpad[b]; pos < seqlens[b]; ++pos)
      for (int i = 0; i < Hk * D; ++i) {
        k_cache.set(slot(b, pos) + i, normal(rng));
        v_cache.set(slot(b, pos) + i, normal(rng));
      }
  }
  Buffer q(c.dtype, static_cast<size_t>(B) * Sq * H * D), out(c.dtype, q.f32.size() + q.u16.size());
  Buffer k_new(c.dtype, static_cast<size_t>(B) * std::max(c.seqlen_new, 1) * Hk * D), v_new = k_new;
  for (size_t i = 0; i < q.f32.size() + q.u16.size(); ++i) q.set(i, normal(rng)), out.set(i, NAN);
  for (size_t i = 0; i < k_new.f32.size() + k_new.u16.size(); ++i) k_new.set(i, normal(rng)), v_new.set(i, normal(rng));
  const int rotary_positions = c.cache_len + Sq;
  Buffer cos(c.dtype, static_cast<size_t>(rotary_positions) * std::max(c.rotary_dim / 2, 1)), sin = cos;
  for (int pos = 0; pos < rotary_positions; ++pos)
    for (int j = 0; j < c.rotary_dim / 2; ++j) {
      const double angle = pos * std::pow(10000.0, -2.0 * j / std::max(c.rotary_dim, 1));
      cos.set(pos * (c.rotary_dim / 2) + j, std::cos(angle));
      sin.set(pos * (c.rotary_dim / 2) + j, std::sin(angle));
    }
  std::vector<float> lse(static_cast<size_t>(B) * H * Sq, NAN);

  KvCacheParams p = default_kvcache_params();
  ForwardParams& f = p.fwd;
  f.q = q.data(), f.k = k_cache.data(), f.v = v_cache.data(), f.out = out.data(), f.softmax_lse = lse.data();
  f.q_batch_stride = f.out_batch_stride = static_cast<int64_t>(Sq) * H * D;
  f.q_row_stride = f.out_row_stride = static_cast<int64_t>(H) * D;
  f.q_head_stride = f.out_head_stride = D;
  f.k_batch_stride = f.v_batch_stride = entry_stride;
  f.k_row_stride = f.v_row_stride = row_stride;
  f.k_head_stride = f.v_head_stride = D;
  f.lse_batch_stride = static_cast<int64_t>(H) * Sq, f.lse_head_stride = Sq;
  f.batch = B, f.seqlen_q = Sq, f.seqlen_k = c.cache_len, f.num_heads = H, f.num_heads_k = Hk, f.head_dim = D;
  f.window_left = c.window_left;
  f.window_right = c.causal ? 0 : -1;
  f.dtype = c.dtype;
  p.cache_seqlens = seqlens.data();
  if (c.uniform) {
    ASSERT_TRUE(std::all_of(seqlens.begin(), seqlens.end(), [&](int32_t s) { return s == seqlens[0]; }));
    p.cache_seqlens = nullptr, p.uniform_cache_seqlen = 1, p.cache_seqlen = seqlens[0];
  }
  p.cache_batch_idx = c.batch_idx ? batch_idx.data() : nullptr;
  p.cache_leftpad = c.leftpad ? leftpad.data() : nullptr;
  p.num_cache_entries = entries;
  if (paged) {
    p.block_table = table.data(), p.block_table_batch_stride = max_blocks;
    p.num_blocks = num_blocks, p.page_size = c.page_size, p.max_blocks = max_blocks;
  }
  if (c.seqlen_new > 0) {
    p.k_new = k_new.data(), p.v_new = v_new.data(), p.seqlen_new = c.seqlen_new;
    p.k_new_batch_stride = p.v_new_batch_stride = static_cast<int64_t>(c.seqlen_new) * Hk * D;
    p.k_new_row_stride = p.v_new_row_stride = static_cast<int64_t>(Hk) * D;
    p.k_new_head_stride = p.v_new_head_stride = D;
  }
  if (c.rotary_dim > 0) {
    p.rotary_cos = cos.data(), p.rotary_sin = sin.data();
    p.rotary_dim = c.rotary_dim, p.rotary_seqlen = rotary_positions, p.rotary_interleaved = c.interleaved;
  }
  forward_kvcache(p);

  // The appended entries: rotary(k_new) and v_new, as stored values.
  const double eps = c.dtype == TILEATTN_FLOAT32 ? 1e-5 : c.dtype == TILEATTN_FLOAT16 ? 2e-3 : 1.6e-2;
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < c.seqlen_new; ++i)
      for (int h = 0; h < Hk; ++h) {
        std::vector<double> row(D);
        const size_t from = ((static_cast<size_t>(b) * c.seqlen_new + i) * Hk + h) * D;
        for (int d = 0; d < D; ++d) row[d] = k_new.get(from + d);
        if (c.rotary_dim) rotate64(row, cos, sin, c.rotary_dim, seqlens[b] + i, c.interleaved);
        for (int d = 0; d < D; ++d) {
          const int64_t at = slot(b, seqlens[b] + i) + h * D + d;
          ASSERT_NEAR(k_cache.get(at), row[d], eps * (1 + std::fabs(row[d]))) << "k_cache b" << b << " i" << i;
          ASSERT_EQ(v_cache.get(at), v_new.get(from + d)) << "v_cache b" << b << " i" << i;
        }
      }

  // The reference: rotated q against the cache's visible rows, as a varlen problem.
  Problem pr;
  pr.batch = B, pr.heads = H, pr.heads_k = Hk, pr.dim = D;
  pr.scale = 1.0 / std::sqrt(static_cast<double>(D));
  pr.window_left = c.window_left, pr.window_right = c.causal ? 0 : -1;
  pr.softcap = 0, pr.dropout_p = 0, pr.seed = pr.offset = 0;
  pr.cu_q = {0}, pr.cu_k = {0};
  const bool per_row = c.causal || c.window_left >= 0;
  for (int b = 0; b < B; ++b) {
    const int64_t end = seqlens[b] + c.seqlen_new;
    pr.cu_q.push_back(pr.cu_q.back() + Sq);
    pr.cu_k.push_back(pr.cu_k.back() + static_cast<int>(end - leftpad[b]));
    pr.used_k.push_back(static_cast<int>(end - leftpad[b]));
    for (int i = 0; i < Sq; ++i)
      for (int h = 0; h < H; ++h) {
        std::vector<double> row(D);
        for (int d = 0; d < D; ++d) row[d] = q.get(((static_cast<size_t>(b) * Sq + i) * H + h) * D + d);
        if (c.rotary_dim) rotate64(row, cos, sin, c.rotary_dim, seqlens[b] + (per_row ? i : 0), c.interleaved);
        pr.q.insert(pr.q.end(), row.begin(), row.end());
      }
    for (int64_t pos = leftpad[b]; pos < end; ++pos)
      for (int i = 0; i < Hk * D; ++i) {
        pr.k.push_back(k_cache.get(slot(b, pos) + i));
        pr.v.push_back(v_cache.get(slot(b, pos) + i));
      }
  }
  pr.dout.assign(pr.q.size(), 0.0);
  const Result exact = reference_attention(pr, true, c.dtype, false);
  const Result naive = reference_attention(pr, false, c.dtype, false);
  std::vector<double> ours_out(pr.q.size()), ours_lse(static_cast<size_t>(H) * B * Sq);
  for (size_t i = 0; i < ours_out.size(); ++i) ours_out[i] = out.get(i);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < Sq; ++i) ours_lse[h * B * Sq + b * Sq + i] = lse[(b * H + h) * Sq + i];
  const double floor = c.dtype == TILEATTN_FLOAT32 ? 1e-5 : 2e-3;
  const Errors e_out{max_error(ours_out, exact.out), max_error(naive.out, exact.out), floor};
  const Errors e_lse{max_error(ours_lse, exact.lse), max_error(naive.lse, exact.lse), floor};
  EXPECT_TRUE(e_out.ok()) << "out: ours " << e_out.ours << " naive " << e_out.naive;
  EXPECT_TRUE(e_lse.ok()) << "lse: ours " << e_lse.ours << " naive " << e_lse.naive;
}

std::vector<KvCase> kv_cases() {
  std::vector<KvCase> list;
  KvCase c;
  c.name = "contiguous_decode", list.push_back(c);
  c = KvCase{}, c.name = "contiguous_no_append_fp32", c.seqlen_new = 0, c.dtype = TILEATTN_FLOAT32,
  c.cache_seqlens = {0, 1, 299}, list.push_back(c);
  c = KvCase{}, c.name = "paged16_rotary_interleaved", c.page_size = 16, c.cache_len = 320, c.rotary_dim = 32,
  c.causal = true, c.seqlen_q = 3, c.seqlen_new = 3, list.push_back(c);
  c = KvCase{}, c.name = "paged64_rotary_halves_batch_idx", c.page_size = 64, c.cache_len = 320, c.rotary_dim = 64,
  c.interleaved = false, c.batch_idx = true, c.seqlen_q = 2, c.seqlen_new = 2, list.push_back(c);
  c = KvCase{}, c.name = "paged256_leftpad_fp16", c.page_size = 256, c.cache_len = 512, c.leftpad = true,
  c.dtype = TILEATTN_FLOAT16, c.cache_seqlens = {0, 300, 500}, list.push_back(c);
  c = KvCase{}, c.name = "contiguous_batch_idx_leftpad_window_rotary_noncausal", c.batch_idx = true,
  c.leftpad = true, c.window_left = 50, c.rotary_dim = 16, c.seqlen_q = 4, c.seqlen_new = 4, list.push_back(c);
  c = KvCase{}, c.name = "mqa_prefill_causal", c.heads = 7, c.heads_k = 1, c.seqlen_q = 17, c.seqlen_new = 17,
  c.causal = true, c.cache_seqlens = {0, 100, 200}, c.dim = 40, list.push_back(c);
  c = KvCase{}, c.name = "uniform_seqlen_paged16_rotary", c.uniform = true, c.cache_seqlens = {250, 250, 250},
  c.page_size = 16, c.cache_len = 320, c.rotary_dim = 32, c.causal = true, c.seqlen_q = 3, c.seqlen_new = 3,
  list.push_back(c);
  c = KvCase{}, c.name = "uniform_seqlen_batch_idx_leftpad_fp32", c.uniform = true, c.cache_seqlens = {127, 127, 127},
  c.batch_idx = true, c.leftpad = true, c.dtype = TILEATTN_FLOAT32, list.push_back(c);
  return list;
}

void PrintTo(const KvCase& c, std::ostream* os) { *os << c.name; }

class KvCache : public ::testing::TestWithParam<KvCase> {};

TEST_P(KvCache, AppendsAndMatchesFloat64) { run_kvcache(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Cpu, KvCache, ::testing::ValuesIn(kv_cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace tileattn::test
