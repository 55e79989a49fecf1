// A KV group's query heads packed into a tile's rows (flash-attn 3's pack_gqa), on the KV-cache
// route's calls only (kvcache_forward_route.h).  A chunk of 16 query rows a sequence against a
// cache fills an eighth of a 128-row tile, and every query head's tile streams its KV head's
// whole cache: at 32 query heads over 8 a sequence's cache is read four times for work a quarter
// of the tiles could do.  The route therefore copies q so that KV head h's rows are its g = H / Hk
// query heads token by token,
//   packed row r = token t * g + query head j within the group,
// and runs the forward with Hk heads of Lq * g rows (the copies back to out and softmax_lse are the
// route's).  The rows are then not the tokens the masks count in: row r is token floor(r / g), so
// the causal and window masks and the key ranges they give read a row's token.  Everything else
// (the Q and O boxes, the row bounds, the epilogue) works on rows as before.
//
// Only the sequence-bounds kernels read KvIndex::query_heads_packed; for every other kernel
// rows_per_token is the constant 1 and the code below folds to the unpacked forms.
#pragma once

#include <cute/tensor.hpp>

#include "common/mask.h"
#include "cuda/launch_api.h"
#include "cuda/mask_policy.h"
#include "cuda/sm90/row_tokens.h"

namespace tileattn::cuda::sm90 {

// The rows a token has: the route's packed query heads in the sequence-bounds kernels, else the
// constant 1, where RowTokens folds to the unpacked code.
template <typename Traits>
__device__ __forceinline__ RowTokens rows_per_token(FwdKernelArgs const& args) {
  if constexpr (Traits::kSeqBounds) {
    return {static_cast<int>(args.kv.query_heads_packed.divisor), args.kv.query_heads_packed};
  } else {
    return {1, FastDivisor{}};
  }
}

// key_block_range for the rows [m0, m0 + block_m) of a sequence of seqlen_q rows, g rows a token:
// the range of the tokens those rows hold (every row of a token sees the token's columns).
__device__ __forceinline__ KeyBlockRange rows_key_block_range(int m0, int block_m, int block_n, int seqlen_q,
                                                              int seqlen_k, int window_left, int window_right,
                                                              RowTokens const& rows) {
  const int first = rows.token(m0), last = rows.token(m0 + block_m - 1);
  return key_block_range(first, last - first + 1, block_n, rows.tokens(seqlen_q), seqlen_k, window_left,
                         window_right);
}

}  // namespace tileattn::cuda::sm90
