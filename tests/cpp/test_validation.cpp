// Every validation rule: a valid call, broken in one way, must throw tileattn::Error naming the
// argument (and, through the C ABI, return the matching code and message).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "tileattn/tileattn.hpp"

namespace tileattn::test {
namespace {

// A small valid batch-form problem: B=2, Sq=5, Sk=7, H=4, Hk=2, D=8, float32, contiguous.
struct Valid {
  std::vector<float> q = std::vector<float>(2 * 5 * 4 * 8, 0.5f), k = std::vector<float>(2 * 7 * 2 * 8, 0.5f),
                     v = k, out = q, lse = std::vector<float>(2 * 4 * 5), dout = q, dq = q, dk = k, dv = k;
  std::vector<float> slopes = std::vector<float>(4, 0.1f);
  std::vector<int32_t> cu_q = {0, 2, 5}, cu_k = {0, 7, 14}, used = {3, 7};
  ForwardParams f;
  BackwardParams b;

  Valid() {
    f = default_forward_params();
    f.q = q.data(), f.k = k.data(), f.v = v.data(), f.out = out.data(), f.softmax_lse = lse.data();
    f.batch = 2, f.seqlen_q = 5, f.seqlen_k = 7, f.num_heads = 4, f.num_heads_k = 2, f.head_dim = 8;
    f.q_batch_stride = 5 * 4 * 8, f.q_row_stride = 4 * 8, f.q_head_stride = 8;
    f.k_batch_stride = 7 * 2 * 8, f.k_row_stride = 2 * 8, f.k_head_stride = 8;
    f.v_batch_stride = f.k_batch_stride, f.v_row_stride = f.k_row_stride, f.v_head_stride = 8;
    f.out_batch_stride = f.q_batch_stride, f.out_row_stride = f.q_row_stride, f.out_head_stride = 8;
    f.lse_batch_stride = 4 * 5, f.lse_head_stride = 5;
    f.dtype = TILEATTN_FLOAT32;
    b = default_backward_params();
    b.fwd = f;
    b.dout = dout.data(), b.dq = dq.data(), b.dk = dk.data(), b.dv = dv.data();
    b.dout_batch_stride = b.dq_batch_stride = f.q_batch_stride;
    b.dout_row_stride = b.dq_row_stride = f.q_row_stride;
    b.dout_head_stride = b.dq_head_stride = 8;
    b.dk_batch_stride = b.dv_batch_stride = f.k_batch_stride;
    b.dk_row_stride = b.dv_row_stride = f.k_row_stride;
    b.dk_head_stride = b.dv_head_stride = 8;
  }

  // The varlen form of the same buffers: 5 query rows, 14 key rows.
  void make_varlen() {
    f.cu_seqlens_q = cu_q.data(), f.cu_seqlens_k = cu_k.data();
    f.total_q = 5, f.total_k = 14, f.seqlen_q = 3, f.seqlen_k = 7;
    f.lse_batch_stride = 0, f.lse_head_stride = 5;
  }
};

// `saying`, where given, is a piece of the message: where two rules name the same argument, it tells
// which one fired, so a test of the first still fails when that rule is gone and the second names it.
void expect_forward_error(const std::function<void(Valid&)>& breaks, const std::string& argument,
                          ErrorCode code = ErrorCode::kInvalidArgument, const std::string& saying = "") {
  Valid v;
  breaks(v);
  try {
    forward(v.f);
    ADD_FAILURE() << "no error; expected one naming " << argument;
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(argument), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(saying), std::string::npos) << e.what();
  }
}

void expect_backward_error(const std::function<void(Valid&)>& breaks, const std::string& argument) {
  Valid v;
  breaks(v);
  try {
    backward(v.b);
    ADD_FAILURE() << "no error; expected one naming " << argument;
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
  }
}

TEST(Validation, ValidCallsPass) {
  Valid v;
  EXPECT_NO_THROW(forward(v.f));
  v.b.fwd = v.f;
  EXPECT_NO_THROW(backward(v.b));
  Valid w;
  w.make_varlen();
  EXPECT_NO_THROW(forward(w.f));
}

TEST(Validation, HeadCounts) {
  expect_forward_error([](Valid& v) { v.f.num_heads_k = 3; }, "k");
  expect_forward_error([](Valid& v) { v.f.num_heads = 0; }, "q");
  expect_forward_error([](Valid& v) { v.f.num_heads_k = 0; }, "k");
  Valid v;
  v.f.num_heads_k = 3;
  try {
    forward(v.f);
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "k has 3 heads, which does not divide the 4 heads of q");
  }
}

TEST(Validation, Shapes) {
  expect_forward_error([](Valid& v) { v.f.head_dim = 0; }, "q");
  expect_forward_error([](Valid& v) { v.f.head_dim = 257; }, "q");
  expect_forward_error([](Valid& v) { v.f.batch = -1; }, "batch");
  expect_forward_error([](Valid& v) { v.f.seqlen_q = -2; }, "seqlen_q");
  expect_forward_error([](Valid& v) { v.f.seqlen_k = -2; }, "seqlen_k");
}

TEST(Validation, Pointers) {
  expect_forward_error([](Valid& v) { v.f.q = nullptr; }, "q");
  expect_forward_error([](Valid& v) { v.f.k = nullptr; }, "k");
  expect_forward_error([](Valid& v) { v.f.v = nullptr; }, "v");
  expect_forward_error([](Valid& v) { v.f.out = nullptr; }, "out");
  expect_forward_error([](Valid& v) { v.f.softmax_lse = nullptr; }, "softmax_lse");
}

// A pointer that is not a multiple of its element size (C API callers; UBSan flagged the CPU's float
// loads through such pointers) is refused naming the argument.
template <typename T>
T* moved_bytes(T* ptr, int bytes) {
  return reinterpret_cast<T*>(reinterpret_cast<char*>(ptr) + bytes);
}

TEST(Validation, MisalignedPointers) {
  expect_forward_error([](Valid& v) { v.f.q = moved_bytes(v.q.data(), 2); }, "q");
  expect_forward_error([](Valid& v) { v.f.out = moved_bytes(v.out.data(), 1); }, "out");
  expect_forward_error([](Valid& v) { v.f.softmax_lse = moved_bytes(v.lse.data(), 2); }, "softmax_lse");
  expect_forward_error([](Valid& v) { v.f.alibi_slopes = moved_bytes(v.slopes.data(), 1); }, "alibi_slopes");
  expect_forward_error(
      [](Valid& v) {
        v.make_varlen();
        v.f.cu_seqlens_k = moved_bytes(v.cu_k.data(), 2);
      },
      "cu_seqlens_k");
  expect_backward_error([](Valid& v) { v.b.dk = moved_bytes(v.dk.data(), 2); }, "dk");
}

TEST(Validation, Dtypes) {
  expect_forward_error([](Valid& v) { v.f.dtype = static_cast<tileattn_dtype>(7); }, "q", ErrorCode::kDtype);
  expect_forward_error(
      [](Valid& v) { v.f.device = TILEATTN_DEVICE_CUDA; }, "q", ErrorCode::kDtype);
  expect_forward_error([](Valid& v) { v.f.device = static_cast<tileattn_device>(5); }, "device");
}

TEST(Validation, Strides) {
  expect_forward_error([](Valid& v) { v.f.q_row_stride = -1; }, "q");
  expect_forward_error([](Valid& v) { v.f.k_head_stride = -8; }, "k");
  expect_forward_error([](Valid& v) { v.f.v_batch_stride = -1; }, "v");
  // Strides whose byte counts overflow int64 (x2 bytes wraps -2^63 + 8 to +16), or whose span
  // passes 2^62 bytes, are refused rather than checked on wrapped values.
  expect_forward_error([](Valid& v) { v.f.q_head_stride = std::numeric_limits<int64_t>::min() + 8; }, "q");
  expect_forward_error([](Valid& v) { v.f.k_row_stride = std::numeric_limits<int64_t>::max(); }, "k");
  expect_forward_error([](Valid& v) { v.f.out_batch_stride = int64_t{1} << 62; }, "out");
  expect_forward_error([](Valid& v) { v.f.v_row_stride = -(int64_t{1} << 62); }, "v");  // x2 bytes: INT64_MIN
  expect_forward_error(  // the optional tables too: sequence 1's slopes 2^63 bytes on
      [](Valid& v) { v.f.alibi_slopes = v.slopes.data(), v.f.alibi_batch_stride = int64_t{1} << 61; },
      "alibi_slopes");
  // Written tensors must not overlap themselves.
  expect_forward_error([](Valid& v) { v.f.out_head_stride = 4; }, "out");
  expect_forward_error([](Valid& v) { v.f.out_row_stride = 8; }, "out");
  expect_forward_error([](Valid& v) { v.f.lse_head_stride = 2; }, "softmax_lse");
}

TEST(Validation, Options) {
  expect_forward_error([](Valid& v) { v.f.window_left = -2; }, "window_left");
  expect_forward_error([](Valid& v) { v.f.window_right = -5; }, "window_right");
  expect_forward_error([](Valid& v) { v.f.dropout_p = 1.0f; }, "dropout_p");
  expect_forward_error([](Valid& v) { v.f.dropout_p = -0.1f; }, "dropout_p");
  expect_forward_error([](Valid& v) { v.f.dropout_p = std::nanf(""); }, "dropout_p");
  expect_forward_error([](Valid& v) { v.f.softcap = -1.0f; }, "softcap");
  expect_forward_error([](Valid& v) { v.f.softcap = std::numeric_limits<float>::infinity(); }, "softcap");
  expect_forward_error([](Valid& v) { v.f.softcap = std::numeric_limits<float>::denorm_min(); }, "softcap");
  expect_forward_error([](Valid& v) { v.f.softcap = 3e38f; }, "softcap");  // x log2(e) is inf
  // Lengths within 256 of 2^31 would wrap the CPU's tile loops.
  expect_forward_error([](Valid& v) { v.f.seqlen_q = std::numeric_limits<int32_t>::max() - 100; }, "seqlen_q");
  expect_forward_error([](Valid& v) { v.f.seqlen_k = std::numeric_limits<int32_t>::max(); }, "seqlen_k");
  expect_forward_error(
      [](Valid& v) {
        v.f.softcap = 1e-30f;
        v.f.softmax_scale = 1e10f;
      },
      "softcap");
  expect_forward_error([](Valid& v) { v.f.softmax_scale = std::nanf(""); }, "softmax_scale");
  expect_forward_error([](Valid& v) { v.f.num_threads = -1; }, "num_threads");
  expect_forward_error(
      [](Valid& v) {
        v.f.alibi_slopes = v.slopes.data();
        v.f.alibi_batch_stride = -1;
      },
      "alibi_slopes", ErrorCode::kInvalidArgument, "less than its 4 heads");
  expect_forward_error(
      [](Valid& v) {
        v.f.alibi_slopes = v.slopes.data();
        v.f.alibi_batch_stride = 2;
      },
      "alibi_slopes");
}

TEST(Validation, Varlen) {
  expect_forward_error(
      [](Valid& v) {
        v.make_varlen();
        v.f.cu_seqlens_k = nullptr;
      },
      "cu_seqlens_k");
  expect_forward_error(
      [](Valid& v) {
        v.make_varlen();
        v.cu_q = {0, 3, 2};
      },
      "cu_seqlens_q");
  expect_forward_error(
      [](Valid& v) {
        v.make_varlen();
        v.f.total_k = 12;
      },
      "cu_seqlens_k");
  expect_forward_error(
      [](Valid& v) {
        v.make_varlen();
        v.cu_q = {-1, 2, 5};
      },
      "cu_seqlens_q");
  expect_forward_error(
      [](Valid& v) {
        v.make_varlen();
        v.f.seqlen_q = 2;
      },
      "max_seqlen_q");
  expect_forward_error(
      [](Valid& v) {
        v.f.seqused_k = v.used.data();
        v.used = {3, 8};
      },
      "seqused_k");
  expect_forward_error(
      [](Valid& v) {
        v.make_varlen();
        v.f.total_q = -1;
      },
      "q");
  expect_forward_error(
      [](Valid& v) {
        v.make_varlen();
        v.f.total_k = -1;
      },
      "k", ErrorCode::kInvalidArgument, "packed rows");
}

// Varlen max_seqlen_q/k are bounds the library lowers to total_q/k (past seqlen's own limit of
// 2^31 - 257 here); the outputs are the tight bounds' bits.  With attn_probs they stay as given.
TEST(Validation, VarlenLooseBounds) {
  Valid tight, loose;
  tight.make_varlen(), loose.make_varlen();
  loose.f.seqlen_q = loose.f.seqlen_k = INT32_MAX;
  loose.b.fwd = loose.f, tight.b.fwd = tight.f;
  constexpr float kUnwritten = -7777.0f;  // the packed tensors' tails past the rows stay so in both
  for (Valid* v : {&tight, &loose}) {
    for (auto* x : {&v->out, &v->lse, &v->dq, &v->dk, &v->dv}) std::fill(x->begin(), x->end(), kUnwritten);
    forward(v->f);
    backward(v->b);
  }
  for (auto member : {&Valid::out, &Valid::lse, &Valid::dq, &Valid::dk, &Valid::dv}) {
    EXPECT_NE((tight.*member)[0], kUnwritten);
    EXPECT_EQ(loose.*member, tight.*member);
  }
  int64_t bytes = -1;
  EXPECT_EQ(tileattn_backward_workspace_size(&loose.b, &bytes), TILEATTN_OK);
  expect_forward_error(
      [](Valid& v) {
        v.make_varlen();
        v.f.seqlen_q = INT32_MAX;
        static float probs[1];  // never written: the call is refused
        v.f.attn_probs = probs;
      },
      "seqlen_q");
}

TEST(Validation, Backward) {
  expect_backward_error([](Valid& v) { v.b.dout = nullptr; }, "dout");
  expect_backward_error([](Valid& v) { v.b.dq = nullptr; }, "dq");
  expect_backward_error([](Valid& v) { v.b.dk_head_stride = 1; }, "dk");
  expect_backward_error([](Valid& v) { v.b.dv = nullptr; }, "dv");
  expect_backward_error([](Valid& v) { v.b.fwd.num_heads_k = 3; }, "k");
  expect_backward_error([](Valid& v) { v.b.fwd.out = nullptr; }, "out");
  expect_backward_error([](Valid& v) { v.b.workspace_bytes = -1; }, "workspace");
  expect_backward_error([](Valid& v) { v.b.workspace = reinterpret_cast<char*>(v.b.dq) + 4; }, "workspace");
  Valid ok;
  int64_t bytes = -1;
  EXPECT_EQ(tileattn_backward_workspace_size(&ok.b, &bytes), TILEATTN_OK);
  EXPECT_EQ(bytes, 0);  // the CPU backend takes no workspace
}

// A backward without query rows writes zero dK and dV (poisoned first), and one without rows or keys
// allocates nothing however many heads it has (2^30 heads once listed 12 GB of tasks: "out of host
// memory").
TEST(Validation, BackwardWithoutRows) {
  Valid no_queries;
  no_queries.b.fwd.seqlen_q = 0;
  std::fill(no_queries.dk.begin(), no_queries.dk.end(), std::numeric_limits<float>::quiet_NaN());
  std::fill(no_queries.dv.begin(), no_queries.dv.end(), std::numeric_limits<float>::quiet_NaN());
  backward(no_queries.b);
  EXPECT_EQ(no_queries.dk, std::vector<float>(no_queries.dk.size(), 0.0f));
  EXPECT_EQ(no_queries.dv, std::vector<float>(no_queries.dv.size(), 0.0f));
  Valid empty;
  empty.b.fwd.seqlen_q = empty.b.fwd.seqlen_k = 0;
  empty.b.fwd.num_heads = empty.b.fwd.num_heads_k = 1 << 30;
  EXPECT_NO_THROW(backward(empty.b));
}

// A valid backward whose float32 scratch no host holds (2^30 heads x 2^16 query rows: delta alone is
// 256 TB, past a 47-bit address space) raises naming q and the sizes, not a bare "out of host
// memory".  The inputs are broadcast (stride 0); the gradients are address ranges no process maps
// (from 2^55), apart from every input so the overlap rules pass: the backend fails at its first
// allocation, before it touches an output.
TEST(Validation, BackwardScratchPastHostMemory) {
#ifdef __SANITIZE_ADDRESS__
  GTEST_SKIP() << "AddressSanitizer reports an allocation this large and stops instead of throwing";
#endif
  Valid v;
  BackwardParams& b = v.b;
  ForwardParams& f = b.fwd;
  const int64_t heads = int64_t{1} << 30, rows = int64_t{1} << 16;
  f.batch = 1, f.num_heads = f.num_heads_k = static_cast<int>(heads), f.seqlen_q = static_cast<int>(rows);
  f.q_batch_stride = f.q_row_stride = f.q_head_stride = 0;
  f.k_batch_stride = f.k_head_stride = 0, f.v_batch_stride = f.v_head_stride = 0;
  f.out_batch_stride = f.out_row_stride = f.out_head_stride = 0;
  f.lse_batch_stride = f.lse_head_stride = 0;
  b.dout_batch_stride = b.dout_row_stride = b.dout_head_stride = 0;
  b.dq_head_stride = 8, b.dq_row_stride = heads * 8, b.dq_batch_stride = rows * heads * 8;
  b.dk_head_stride = b.dv_head_stride = 8, b.dk_row_stride = b.dv_row_stride = heads * 8;
  b.dk_batch_stride = b.dv_batch_stride = 7 * heads * 8;
  b.dq = reinterpret_cast<void*>(uintptr_t{1} << 55);
  b.dk = reinterpret_cast<void*>(uintptr_t{1} << 56);
  b.dv = reinterpret_cast<void*>(uintptr_t{1} << 57);
  try {
    backward(b);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "q") << e.what();
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
    EXPECT_NE(std::string(e.what()).find("1073741824"), std::string::npos) << e.what();
  }
}

// A valid decode call: B=2, one query token, H=4 over Hk=2, D=8, a contiguous cache of 2 x 16.
struct KvValid {
  std::vector<float> q = std::vector<float>(2 * 4 * 8, 0.5f), out = q, lse = std::vector<float>(2 * 4);
  std::vector<float> cache = std::vector<float>(2 * 16 * 2 * 8, 0.5f), cache_v = cache;
  std::vector<float> rot = std::vector<float>(32 * 2, 0.5f);
  std::vector<int32_t> seqlens = {3, 16}, table = {0, 1}, leftpad = {1, 20}, batch_idx = {0, 2};
  KvCacheParams p = default_kvcache_params();
  KvValid() {
    ForwardParams& f = p.fwd;
    f.q = q.data(), f.out = out.data(), f.softmax_lse = lse.data(), f.k = cache.data(), f.v = cache_v.data();
    f.batch = 2, f.seqlen_q = 1, f.seqlen_k = 16, f.num_heads = 4, f.num_heads_k = 2, f.head_dim = 8;
    f.q_batch_stride = f.out_batch_stride = 32, f.q_row_stride = f.out_row_stride = 32;
    f.q_head_stride = f.out_head_stride = 8;
    f.k_batch_stride = f.v_batch_stride = 16 * 16, f.k_row_stride = f.v_row_stride = 16;
    f.k_head_stride = f.v_head_stride = 8;
    f.lse_batch_stride = 4, f.lse_head_stride = 1;
    f.dtype = TILEATTN_FLOAT32;
    p.cache_seqlens = seqlens.data();
    p.num_cache_entries = 2;
  }

  std::vector<float> k_new = std::vector<float>(2 * 2 * 8, 0.25f), v_new = k_new;
  void append_one_token() {
    p.k_new = k_new.data(), p.v_new = v_new.data(), p.seqlen_new = 1;
    p.k_new_batch_stride = p.v_new_batch_stride = 16;
    p.k_new_row_stride = p.v_new_row_stride = 16;
    p.k_new_head_stride = p.v_new_head_stride = 8;
  }
};

void expect_kvcache_error(const std::function<void(KvValid&)>& breaks, const std::string& argument,
                          const std::string& saying = "") {
  KvValid v;
  breaks(v);
  try {
    forward_kvcache(v.p);
    ADD_FAILURE() << "no error; expected one naming " << argument;
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
    EXPECT_NE(std::string(e.what()).find(saying), std::string::npos) << e.what();
  }
}

TEST(Validation, KvCache) {
  KvValid ok;
  EXPECT_NO_THROW(forward_kvcache(ok.p));
  expect_kvcache_error([](KvValid& v) { v.p.cache_seqlens = nullptr; }, "cache_seqlens");
  expect_kvcache_error([](KvValid& v) { v.seqlens = {3, 17}; }, "cache_seqlens");
  expect_kvcache_error([](KvValid& v) { v.seqlens = {-1, 2}; }, "cache_seqlens");
  expect_kvcache_error([](KvValid& v) { v.p.cache_leftpad = v.leftpad.data(); }, "cache_leftpad");
  expect_kvcache_error([](KvValid& v) { v.p.cache_seqlens = moved_bytes(v.seqlens.data(), 2); }, "cache_seqlens");
  // One length for every sequence (an int cache_seqlens), checked on the host on every backend.
  auto uniform = [](KvValid& v, int seqlen) {
    v.p.cache_seqlens = nullptr, v.p.uniform_cache_seqlen = 1, v.p.cache_seqlen = seqlen;
  };
  KvValid uniform_ok;
  uniform(uniform_ok, 16);
  EXPECT_NO_THROW(forward_kvcache(uniform_ok.p));
  expect_kvcache_error([&](KvValid& v) { uniform(v, 16), v.p.cache_seqlens = v.seqlens.data(); }, "cache_seqlens");
  expect_kvcache_error([&](KvValid& v) { uniform(v, -1); }, "cache_seqlens");
  expect_kvcache_error([&](KvValid& v) { uniform(v, 17); }, "cache_seqlens");
  expect_kvcache_error([&](KvValid& v) { uniform(v, 16), v.append_one_token(); }, "cache_seqlens");
  expect_kvcache_error([&](KvValid& v) { uniform(v, 3), v.p.cache_leftpad = v.leftpad.data(); }, "cache_leftpad");
  expect_kvcache_error(
      [&](KvValid& v) {
        uniform(v, 15), v.append_one_token();
        v.p.rotary_cos = v.rot.data(), v.p.rotary_sin = v.rot.data();
        v.p.rotary_dim = 4, v.p.rotary_seqlen = 15;
      },
      "rotary_cos");
  expect_kvcache_error([](KvValid& v) { v.p.fwd.k = moved_bytes(v.cache.data(), 2); }, "k_cache");
  expect_kvcache_error(
      [](KvValid& v) {
        v.p.rotary_cos = v.rot.data(), v.p.rotary_sin = moved_bytes(v.rot.data(), 2);
        v.p.rotary_dim = 4, v.p.rotary_seqlen = 32;
      },
      "rotary_sin");
  expect_kvcache_error([](KvValid& v) { v.p.fwd.dropout_p = 0.1f; }, "dropout_p");
  expect_kvcache_error([](KvValid& v) { v.p.fwd.attn_probs = v.rot.data(); }, "attn_probs");
  expect_kvcache_error([](KvValid& v) { v.p.num_splits = -1; }, "num_splits");
  expect_kvcache_error([](KvValid& v) { v.p.num_cache_entries = 0; }, "k_cache", "at least 1");
  expect_kvcache_error([](KvValid& v) { v.append_one_token(), v.p.seqlen_new = 0; }, "k", "0 new tokens");
  expect_kvcache_error(  // an empty table would be read out of bounds where only the kernels see the lengths
      [](KvValid& v) {
        v.p.rotary_cos = v.rot.data(), v.p.rotary_sin = v.rot.data();
        v.p.rotary_dim = 4, v.p.rotary_seqlen = 0;
      },
      "rotary_cos", "0 positions; it needs at least 1");
  expect_kvcache_error([](KvValid& v) { v.p.k_new = v.q.data(); }, "v");
  expect_kvcache_error([](KvValid& v) { v.p.rotary_cos = v.rot.data(); }, "rotary_sin");
  expect_kvcache_error(
      [](KvValid& v) {
        v.p.rotary_cos = v.rot.data(), v.p.rotary_sin = v.rot.data();
        v.p.rotary_dim = 3, v.p.rotary_seqlen = 32;
      },
      "rotary_cos");
  expect_kvcache_error(
      [](KvValid& v) {
        v.p.rotary_cos = v.rot.data(), v.p.rotary_sin = v.rot.data();
        v.p.rotary_dim = 4, v.p.rotary_seqlen = 10;
      },
      "rotary_cos");
  // Rotary positions read: cache_seqlens (16 at most) for the one non-causal query row, none for
  // new keys when k_new is NULL (a leftover seqlen_new counts for nothing): 17 positions suffice.
  auto rotary_table = [](KvValid& v, int positions) {
    v.p.rotary_cos = v.rot.data(), v.p.rotary_sin = v.rot.data();
    v.p.rotary_dim = 4, v.p.rotary_seqlen = positions, v.p.seqlen_new = 5;
  };
  KvValid exact_table;
  rotary_table(exact_table, 17);
  EXPECT_NO_THROW(forward_kvcache(exact_table.p));
  expect_kvcache_error([&](KvValid& v) { rotary_table(v, 16); }, "rotary_cos");
  auto paged = [](KvValid& v, int page_size) {
    v.p.block_table = v.table.data(), v.p.block_table_batch_stride = 1, v.p.max_blocks = 1;
    v.p.num_blocks = 2, v.p.page_size = page_size, v.p.fwd.seqlen_k = page_size;
  };
  expect_kvcache_error([&](KvValid& v) { paged(v, 8); }, "block_table");
  expect_kvcache_error(
      [&](KvValid& v) {
        paged(v, 16);
        v.table = {0, 5};
      },
      "block_table");
  expect_kvcache_error([](KvValid& v) { v.p.cache_batch_idx = v.batch_idx.data(); }, "cache_batch_idx");
  expect_kvcache_error([&](KvValid& v) { paged(v, 16), v.p.max_blocks = 0; }, "block_table", "columns over");
  expect_kvcache_error([&](KvValid& v) { paged(v, 16), v.p.fwd.seqlen_k = 32; }, "block_table",
                       "max_blocks x page_size");
  expect_kvcache_error([&](KvValid& v) { paged(v, 16), v.p.block_table_batch_stride = -1; }, "block_table",
                       "negative row stride");
  expect_kvcache_error(
      [&](KvValid& v) {
        paged(v, 16);
        v.p.num_cache_entries = 2, v.p.block_table_batch_stride = int64_t{1} << 61;  // row 1 2^63 bytes on
      },
      "block_table");
  expect_kvcache_error([](KvValid& v) { v.p.fwd.seqlen_k = -1; }, "k_cache");
  expect_kvcache_error(  // pages of 16 over 2^27 - 1 columns: 2^31 - 16 positions a sequence
      [&](KvValid& v) {
        paged(v, 16);
        v.p.max_blocks = v.p.block_table_batch_stride = (1 << 27) - 1;
        v.p.fwd.seqlen_k = v.p.max_blocks * 16;
      },
      "block_table");
  expect_kvcache_error([](KvValid& v) { v.p.fwd.seqlen_k = -1, v.p.fwd.batch = 0; }, "k_cache");
  expect_kvcache_error([](KvValid& v) { v.p.workspace_bytes = -1; }, "workspace");
  expect_kvcache_error([](KvValid& v) { v.p.workspace = reinterpret_cast<char*>(v.q.data()) + 4; }, "workspace");
}

// KvValid's two query rows packed (cu_seqlens_q {0, 1, 2}, max_seqlen_q 1): q and out (2, 4, 8),
// softmax_lse (4, 2).
std::vector<int32_t> cu_packed = {0, 1, 2};
void pack_rows(KvValid& v) {
  v.p.fwd.cu_seqlens_q = cu_packed.data();
  v.p.fwd.total_q = 2;
  v.p.fwd.lse_batch_stride = 0, v.p.fwd.lse_head_stride = 2;
}

TEST(Validation, KvCachePackedQueryRows) {
  KvValid ok;
  pack_rows(ok);
  EXPECT_NO_THROW(forward_kvcache(ok.p));
  expect_kvcache_error([](KvValid& v) { pack_rows(v), v.append_one_token(); }, "k");
  expect_kvcache_error(
      [](KvValid& v) {
        pack_rows(v);
        v.p.rotary_cos = v.rot.data(), v.p.rotary_sin = v.rot.data();
        v.p.rotary_dim = 4, v.p.rotary_seqlen = 32;
      },
      "rotary_cos");
  expect_kvcache_error([](KvValid& v) { pack_rows(v), v.p.fwd.cu_seqlens_k = cu_packed.data(); }, "cu_seqlens_k");
  expect_kvcache_error([](KvValid& v) { pack_rows(v), v.p.fwd.total_q = 1; }, "cu_seqlens_q");
  expect_kvcache_error([](KvValid& v) { pack_rows(v), v.p.fwd.cu_seqlens_q = v.seqlens.data(); }, "max_seqlen_q");
  expect_kvcache_error([](KvValid& v) { pack_rows(v), v.p.fwd.lse_head_stride = 1; }, "softmax_lse");
}

// max_seqlen_q is an upper bound the library lowers to total_q: 2^31 - 1 (past seqlen_q's own
// limit of 2^31 - 257) is accepted, takes no workspace query error, and gives the same bits as
// the tight bound.
TEST(Validation, KvCachePackedRowsLooseBound) {
  KvValid tight, loose;
  pack_rows(tight), pack_rows(loose);
  loose.p.fwd.seqlen_q = INT32_MAX;
  int64_t bytes = -1;
  EXPECT_EQ(tileattn_kvcache_workspace_size(&loose.p, &bytes), TILEATTN_OK);
  for (KvValid* v : {&tight, &loose}) {  // poisoned: NaN never compares equal, so unwritten outputs fail
    std::fill(v->out.begin(), v->out.end(), std::numeric_limits<float>::quiet_NaN());
    std::fill(v->lse.begin(), v->lse.end(), std::numeric_limits<float>::quiet_NaN());
    forward_kvcache(v->p);
  }
  EXPECT_EQ(loose.out, tight.out);
  EXPECT_EQ(loose.lse, tight.lse);
  // No row at all: nothing to write and nothing to allocate, however many heads (2^30 x 2
  // sequences x 8 dims of float32 is 64 GiB, once "out of host memory").
  KvValid no_rows;
  pack_rows(no_rows);
  std::vector<int32_t> cu_empty = {0, 0, 0};
  no_rows.p.fwd.cu_seqlens_q = cu_empty.data(), no_rows.p.fwd.total_q = 0, no_rows.p.fwd.num_heads = 1 << 30;
  EXPECT_NO_THROW(forward_kvcache(no_rows.p));
  // The bound is still checked against each sequence's rows.
  expect_kvcache_error([](KvValid& v) { pack_rows(v), v.p.fwd.seqlen_q = 0; }, "max_seqlen_q");
}

// Cache lengths as a paged varlen call gives them: cu_seqlens_k's counts (3 and 16 keys), bounded
// by max_seqlen_k, or seqused_k within them, in place of cache_seqlens.
std::vector<int32_t> cu_keys = {0, 3, 19};
void varlen_keys(KvValid& v) {
  pack_rows(v);
  v.p.cache_seqlens = nullptr;
  v.p.fwd.cu_seqlens_k = cu_keys.data();
  v.p.max_seqlen_k = 16;
}

TEST(Validation, KvCacheVarlenKeys) {
  KvValid ok;
  varlen_keys(ok);
  EXPECT_NO_THROW(forward_kvcache(ok.p));
  static std::vector<int32_t> used = {2, 9}, too_many = {4, 2};
  ok.p.fwd.seqused_k = used.data();
  EXPECT_NO_THROW(forward_kvcache(ok.p));
  expect_kvcache_error([](KvValid& v) { varlen_keys(v), v.p.cache_seqlens = v.seqlens.data(); }, "cu_seqlens_k");
  expect_kvcache_error(
      [](KvValid& v) {
        varlen_keys(v);
        v.p.fwd.cu_seqlens_q = nullptr, v.p.fwd.lse_batch_stride = 4, v.p.fwd.lse_head_stride = 1;
      },
      "cu_seqlens_k");
  expect_kvcache_error([](KvValid& v) { v.p.fwd.seqused_k = v.seqlens.data(); }, "seqused_k");
  expect_kvcache_error([](KvValid& v) { varlen_keys(v), v.p.max_seqlen_k = 17; }, "max_seqlen_k");
  expect_kvcache_error([](KvValid& v) { varlen_keys(v), v.p.max_seqlen_k = 15; }, "cu_seqlens_k");
  expect_kvcache_error([](KvValid& v) { varlen_keys(v), v.p.fwd.seqused_k = too_many.data(); }, "seqused_k");
  expect_kvcache_error([](KvValid& v) { varlen_keys(v), v.append_one_token(); }, "k");
}

// Two indices on one element matter only where the call writes: an empty output (no element)
// and the backward's out and softmax_lse (read only) may take zero strides; a forward's
// softmax_lse may not.
TEST(Validation, OverlapRulesOnlyWhereWritten) {
  Valid empty;
  empty.f.seqlen_q = 0;
  empty.f.out_batch_stride = empty.f.out_row_stride = empty.f.out_head_stride = 0;
  empty.f.lse_batch_stride = empty.f.lse_head_stride = 0;
  std::vector<float> probs(1);
  empty.f.attn_probs = probs.data();
  empty.f.probs_batch_stride = empty.f.probs_head_stride = empty.f.probs_row_stride = 0;
  EXPECT_NO_THROW(forward(empty.f));
  Valid broadcast;
  broadcast.b.fwd.lse_head_stride = 0, broadcast.b.fwd.out_head_stride = 0;
  EXPECT_NO_THROW(backward(broadcast.b));
  expect_forward_error([](Valid& v) { v.f.lse_head_stride = 0; }, "softmax_lse");
}

// The kernels read and write in no fixed order: an output sharing a byte with another argument
// is refused, naming the output, while views that interleave without sharing pass.
TEST(Validation, OutputsShareNoMemory) {
  expect_forward_error([](Valid& v) { v.f.out = v.q.data(); }, "out", ErrorCode::kInvalidArgument, "reads while");
  expect_forward_error([](Valid& v) { v.f.out = v.k.data() + 8; }, "out");
  expect_forward_error([](Valid& v) { v.f.softmax_lse = v.out.data() + 3; }, "out", ErrorCode::kInvalidArgument,
                       "writes both");
  expect_forward_error(
      [](Valid& v) {
        v.f.alibi_slopes = v.lse.data() + 2;
        v.f.alibi_batch_stride = 0;
      },
      "softmax_lse");
  expect_backward_error([](Valid& v) { v.b.dk = v.b.dq; }, "dq");
  expect_backward_error([](Valid& v) { v.b.dv = v.k.data(); }, "dv");
  expect_backward_error([](Valid& v) { v.b.dq = v.dout.data(); }, "dq");
  expect_backward_error(
      [](Valid& v) {
        alignas(256) static float scratch[2 * 7 * 2 * 8];  // dv's size, 256-byte aligned
        v.b.dv = scratch;
        v.b.workspace = scratch + 64;
        v.b.workspace_bytes = 256;
      },
      "dv");
  // dk and dv as the two halves of one (B, Sk, 2, Hk, D) gradient, k and v of one packed input.
  Valid packed;
  std::vector<float> dkv(2 * 7 * 2 * 2 * 8), kv(dkv.size(), 0.5f);
  packed.b.dk = dkv.data(), packed.b.dv = dkv.data() + 2 * 8;
  packed.b.fwd.k = kv.data(), packed.b.fwd.v = kv.data() + 2 * 8;
  packed.b.dk_batch_stride = packed.b.dv_batch_stride = 7 * 2 * 2 * 8;
  packed.b.dk_row_stride = packed.b.dv_row_stride = 2 * 2 * 8;
  packed.b.fwd.k_batch_stride = packed.b.fwd.v_batch_stride = 7 * 2 * 2 * 8;
  packed.b.fwd.k_row_stride = packed.b.fwd.v_row_stride = 2 * 2 * 8;
  EXPECT_NO_THROW(backward(packed.b));
  packed.b.dv = dkv.data() + 2 * 8 - 1;  // one element into dk's last head
  EXPECT_THROW(backward(packed.b), Error);
}

TEST(Validation, KvCacheOutputsShareNoMemory) {
  auto append = [](KvValid& v) {
    v.append_one_token();
    v.seqlens = {3, 15};
  };
  KvValid appends;
  append(appends);
  EXPECT_NO_THROW(forward_kvcache(appends.p));
  // Without an append both caches are read: one buffer may serve as both.
  KvValid shared;
  shared.p.fwd.v = shared.p.fwd.k;
  EXPECT_NO_THROW(forward_kvcache(shared.p));
  expect_kvcache_error(
      [&](KvValid& v) {
        append(v);
        v.p.fwd.v = v.p.fwd.k;
      },
      "k_cache");
  expect_kvcache_error(
      [&](KvValid& v) {
        append(v);
        v.p.k_new = v.cache.data() + 3 * 16;  // the slots the append writes
      },
      "k_cache");
  expect_kvcache_error([](KvValid& v) { v.p.fwd.out = v.cache.data(); }, "out");
  expect_kvcache_error([](KvValid& v) { v.p.fwd.softmax_lse = reinterpret_cast<float*>(v.seqlens.data()); },
                       "softmax_lse");
}

// An append's slots against every slot the call uses: a sequence may write only slots that no
// other sequence (and no other position of its own) uses; read-only sharing stays legal.
TEST(Validation, KvCacheAppendSlots) {
  // Pages of 16 rows, two columns a block-table row, four pages.
  auto paged = [&](KvValid& v, std::vector<int32_t> table, std::vector<int32_t> seqlens) {
    v.append_one_token();
    v.cache.assign(4 * 16 * 16, 0.5f), v.cache_v = v.cache;
    v.p.fwd.k = v.cache.data(), v.p.fwd.v = v.cache_v.data();
    v.table = std::move(table), v.seqlens = std::move(seqlens);
    v.p.cache_seqlens = v.seqlens.data();
    v.p.block_table = v.table.data(), v.p.block_table_batch_stride = 2, v.p.max_blocks = 2;
    v.p.num_blocks = 4, v.p.page_size = 16, v.p.fwd.seqlen_k = 32;
  };
  auto passes = [](KvValid& v) {
    EXPECT_NO_THROW(forward_kvcache(v.p));
  };
  // One cache entry for both sequences: refused with an append, fine without.
  KvValid shared_entry;
  shared_entry.batch_idx = {1, 1};
  shared_entry.p.cache_batch_idx = shared_entry.batch_idx.data();
  shared_entry.seqlens = {3, 9};
  passes(shared_entry);
  expect_kvcache_error(
      [&](KvValid& v) {
        v.append_one_token();
        v.batch_idx = {1, 1}, v.seqlens = {3, 9};
        v.p.cache_batch_idx = v.batch_idx.data();
      },
      "cache_batch_idx");
  // A shared prefix page (page 0) with each append in a page of its own.
  KvValid prefix;
  paged(prefix, {0, 1, 0, 2}, {20, 25});
  passes(prefix);
  // The same tables with sequence 0 appending into the shared page.
  expect_kvcache_error([&](KvValid& v) { paged(v, {0, 1, 0, 2}, {5, 25}); }, "block_table");
  // Both append into page 1, row 4; then one appends into a row the other reads.
  expect_kvcache_error([&](KvValid& v) { paged(v, {0, 1, 2, 1}, {20, 20}); }, "block_table");
  expect_kvcache_error([&](KvValid& v) { paged(v, {0, 1, 2, 1}, {20, 18}); }, "block_table");
  // One sequence's table repeats page 1: its append at position 20 lands on its position 4.
  expect_kvcache_error([&](KvValid& v) { paged(v, {1, 1, 0, 2}, {20, 3}); }, "block_table");
}

TEST(Validation, KvCacheWorkspaceSize) {
  KvValid ok;
  int64_t bytes = -1;
  EXPECT_EQ(tileattn_kvcache_workspace_size(&ok.p, &bytes), TILEATTN_OK);
  EXPECT_EQ(bytes, 0);  // the CPU backend takes no workspace
  EXPECT_EQ(tileattn_kvcache_workspace_size(&ok.p, nullptr), TILEATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(tileattn_last_error_argument(), "bytes");
  KvValid bad;
  bad.p.cache_seqlens = nullptr;  // it validates like the call itself
  EXPECT_EQ(tileattn_kvcache_workspace_size(&bad.p, &bytes), TILEATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(tileattn_last_error_argument(), "cache_seqlens");
}

TEST(Validation, CAbiReportsCodeAndArgument) {
  Valid v;
  v.f.num_heads_k = 3;
  EXPECT_EQ(tileattn_forward(&v.f), TILEATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(tileattn_last_error_argument(), "k");
  EXPECT_NE(std::string(tileattn_last_error()).find("does not divide"), std::string::npos);
  EXPECT_EQ(tileattn_forward(nullptr), TILEATTN_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(tileattn_last_error_argument(), "params");
  Valid ok;
  EXPECT_EQ(tileattn_forward(&ok.f), TILEATTN_OK);
  EXPECT_STREQ(tileattn_last_error(), "");
  EXPECT_EQ(tileattn_fwd_params_size(), static_cast<int64_t>(sizeof(tileattn_fwd_params)));
}

TEST(Validation, CudaNotBuiltIsReported) {
  if (tileattn_has_cuda()) GTEST_SKIP() << "this build has the CUDA backend";
  Valid v;
  std::vector<uint16_t> half(v.q.size() * 2);
  v.f.dtype = TILEATTN_BFLOAT16;
  v.f.device = TILEATTN_DEVICE_CUDA;
  EXPECT_EQ(tileattn_forward(&v.f), TILEATTN_ERROR_NOT_BUILT);
  EXPECT_STREQ(tileattn_last_error_argument(), "device");
}

}  // namespace
}  // namespace tileattn::test
