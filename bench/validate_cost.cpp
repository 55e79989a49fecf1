// Host time of the library's argument checks for one decode call: tileattn_kvcache_workspace_size
// runs exactly the checks of tileattn_forward_kvcache and, on the CPU, returns 0 without running
// anything.  The call: B = 32, 32 query heads over 8 KV heads, d128, a contiguous cache of 2048
// positions, one appended token (float32 host buffers; only the pointers and strides matter).
//   g++ -O2 -Iinclude bench/validate_cost.cpp -Lbuild/src -ltileattn -Wl,-rpath,$PWD/build/src -o /tmp/validate_cost
#include <chrono>
#include <cstdio>
#include <vector>

#include "tileattn/tileattn.h"

int main() {
  constexpr int B = 32, H = 32, Hk = 8, D = 128, Smax = 2048;
  std::vector<float> q(B * H * D), out(q.size()), lse(B * H), k_new(B * Hk * D), v_new(k_new.size());
  std::vector<float> k_cache(static_cast<size_t>(B) * Smax * Hk * D), v_cache(k_cache.size());
  std::vector<int32_t> seqlens(B, 1000);
  tileattn_kvcache_params p;
  tileattn_kvcache_params_init(&p);
  tileattn_fwd_params& f = p.fwd;
  f.q = q.data(), f.out = out.data(), f.softmax_lse = lse.data(), f.k = k_cache.data(), f.v = v_cache.data();
  f.batch = B, f.seqlen_q = 1, f.seqlen_k = Smax, f.num_heads = H, f.num_heads_k = Hk, f.head_dim = D;
  f.q_batch_stride = f.out_batch_stride = f.q_row_stride = f.out_row_stride = H * D;
  f.q_head_stride = f.out_head_stride = D;
  f.k_batch_stride = f.v_batch_stride = static_cast<int64_t>(Smax) * Hk * D;
  f.k_row_stride = f.v_row_stride = Hk * D;
  f.k_head_stride = f.v_head_stride = D;
  f.lse_batch_stride = H, f.lse_head_stride = 1;
  f.dtype = TILEATTN_FLOAT32;
  p.cache_seqlens = seqlens.data(), p.num_cache_entries = B;
  p.k_new = k_new.data(), p.v_new = v_new.data(), p.seqlen_new = 1;
  p.k_new_batch_stride = p.v_new_batch_stride = p.k_new_row_stride = p.v_new_row_stride = Hk * D;
  p.k_new_head_stride = p.v_new_head_stride = D;
  for (int run = 0; run < 3; ++run) {
    constexpr int kCalls = 200000;
    int64_t bytes = 0;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) {
      if (tileattn_kvcache_workspace_size(&p, &bytes) != TILEATTN_OK) {
        std::printf("refused: %s\n", tileattn_last_error());
        return 1;
      }
    }
    const std::chrono::duration<double, std::nano> took = std::chrono::steady_clock::now() - start;
    std::printf("%.0f ns a call\n", took.count() / kCalls);
  }
}
