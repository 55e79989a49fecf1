/*
 * tileattn — exact softmax attention (FlashAttention-2 and beyond).
 *
 * The C ABI: plain structs and functions, no C++ types, so the Python binding (ctypes) and other
 * languages can call the library without linking a C++ runtime or a framework.  The C++ API in
 * tileattn.hpp wraps the same structs and turns error codes into exceptions.
 *
 * Conventions shared by every entry point
 *   - Shapes follow flash-attn 2.x: q (B, Sq, H, D), k/v (B, Sk, Hk, D); or, for variable-length
 *     batches, the packed form q (total_q, H, D), k/v (total_k, Hk, D) with cu_seqlens_q/k.
 *   - Strides are int64 element counts for the batch, row (sequence position) and head dims; the
 *     head dim D is always contiguous.  Packed QKV, GQA and non-contiguous views come from strides.
 *     In varlen mode the batch strides are ignored (rows are addressed through cu_seqlens).
 *   - H must be a multiple of Hk (GQA/MQA): query head h reads KV head h / (H / Hk).
 *   - The score of query row i and key column j is
 *         s = softmax_scale * <q_i, k_j>
 *         s = softcap * tanh(s / softcap)                  (when softcap > 0)
 *         s = s - slope_h * |i + Sk - Sq - j|               (when ALiBi slopes are given)
 *     and column j is visible from row i when (bottom-right aligned, as flash-attn >= 2.1)
 *         j <= i + Sk - Sq + window_right   (window_right >= 0; causal means window_right = 0)
 *         j >= i + Sk - Sq - window_left    (window_left >= 0)
 *     A row that sees no column gets output 0 and LSE +inf, never NaN.
 *   - Dropout keeps each probability with chance 1 - p and scales kept ones by 1 / (1 - p); the
 *     keep/drop mask is a pure function of (seed, offset, batch, head, row, column), written down
 *     in docs/dropout-rng.md, so every backend draws the same mask.
 */
#ifndef TILEATTN_TILEATTN_H
#define TILEATTN_TILEATTN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define TILEATTN_API __declspec(dllexport)
#else
#define TILEATTN_API __attribute__((visibility("default")))
#endif

/* Bumped whenever a struct below changes layout; bindings compare it with their own copy. */
#define TILEATTN_ABI_VERSION 4

typedef enum tileattn_dtype {
  TILEATTN_FLOAT16 = 0,
  TILEATTN_BFLOAT16 = 1,
  TILEATTN_FLOAT32 = 2 /* CPU backend only */
} tileattn_dtype;

typedef enum tileattn_device {
  TILEATTN_DEVICE_CPU = 0,
  TILEATTN_DEVICE_CUDA = 1
} tileattn_device;

typedef enum tileattn_status {
  TILEATTN_OK = 0,
  TILEATTN_ERROR_INVALID_ARGUMENT = 1, /* a value, shape, stride or option is wrong */
  TILEATTN_ERROR_DTYPE = 2,            /* a dtype is wrong or unsupported for this backend */
  TILEATTN_ERROR_UNSUPPORTED = 3,      /* valid, but not supported here (GPU arch, feature) */
  TILEATTN_ERROR_NOT_BUILT = 4,        /* the backend was not compiled into this library */
  TILEATTN_ERROR_INTERNAL = 5          /* a bug or a failed CUDA call */
} tileattn_status;

/* Forward: out = softmax(scores) @ v, plus the log-sum-exp of every score row. */
typedef struct tileattn_fwd_params {
  /* Inputs, all of `dtype`. */
  const void* q;
  const void* k;
  const void* v;
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;

  /* Outputs.  out has q's shape and `dtype`; softmax_lse is float32, (B, H, Sq) in batch mode
   * and (H, total_q) in varlen mode, addressed as lse[b * lse_batch_stride + h * lse_head_stride
   * + row] where, in varlen mode, row counts from cu_seqlens_q[b]. */
  void* out;
  int64_t out_batch_stride, out_row_stride, out_head_stride;
  float* softmax_lse;
  int64_t lse_batch_stride, lse_head_stride;

  /* Optional, for tests: float32 (B, H, Sq, Sk) (varlen: Sq = max_seqlen_q, Sk = max_seqlen_k)
   * probabilities after softmax; entries dropped by dropout are stored negated, masked and
   * out-of-range entries as 0.  NULL to skip (it costs a second pass). */
  float* attn_probs;
  int64_t probs_batch_stride, probs_head_stride, probs_row_stride;

  /* Sizes.  In varlen mode seqlen_q/seqlen_k are max_seqlen_q/max_seqlen_k.  seqlen_q and
   * seqlen_k at most 2^31 - 257; every tensor's byte span under 2^62. */
  int32_t batch, seqlen_q, seqlen_k, num_heads, num_heads_k, head_dim;

  /* Varlen (all NULL for the batch form).  cu_seqlens_q/k: int32 (B + 1) prefix sums into the
   * packed rows; total_q/total_k: rows in the packed q and k/v; seqused_k: optional int32 (B),
   * keys actually used per sequence (<= its cu_seqlens_k length).  seqused_k also works in batch
   * form.  On CUDA these point to device memory. */
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  const int32_t* seqused_k;
  int64_t total_q, total_k;

  /* Options. */
  float softmax_scale; /* 0 means 1/sqrt(head_dim) */
  int32_t window_left, window_right; /* -1 = unbounded on that side; causal = (-1, 0) */
  float softcap;                     /* 0 = off */
  const float* alibi_slopes;         /* NULL, or float32 (H) or (B, H) */
  int64_t alibi_batch_stride;        /* 0 for (H), H (or more) for (B, H) */
  float dropout_p;                   /* in [0, 1) */
  uint64_t philox_seed, philox_offset;

  tileattn_dtype dtype;
  tileattn_device device;
  void* stream;        /* cudaStream_t on CUDA, ignored on CPU */
  int32_t num_threads; /* CPU: worker threads, 0 = all cores; more than the CPUs are clamped to them */
} tileattn_fwd_params;

/* Backward: given dout, recompute the probabilities from lse and produce dq, dk, dv.
 * dk/dv have k/v's shape: the gradient is summed over the query heads that share a KV head. */
typedef struct tileattn_bwd_params {
  tileattn_fwd_params fwd; /* the forward's inputs, out and softmax_lse (read, not written);
                              attn_probs is ignored */
  const void* dout;
  int64_t dout_batch_stride, dout_row_stride, dout_head_stride;
  void* dq;
  int64_t dq_batch_stride, dq_row_stride, dq_head_stride;
  void* dk;
  int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
  void* dv;
  int64_t dv_batch_stride, dv_row_stride, dv_head_stride;
  int32_t deterministic; /* nonzero: bitwise-reproducible gradients (the CPU backend always is) */
  /* Scratch for the float32 accumulators (CUDA): NULL lets the library take it from its own
   * stream-ordered pool; otherwise at least tileattn_backward_workspace_size() bytes, on the
   * terms of tileattn_kvcache_params.workspace. */
  void* workspace;
  int64_t workspace_bytes;
} tileattn_bwd_params;

/* Decoding over a KV cache: flash-attn 2.x's flash_attn_with_kvcache.
 *
 * fwd holds q (B, Sq, H, D), out, softmax_lse (B, H, Sq) and the options (scale, window, softcap,
 * ALiBi; no dropout; of the varlen fields only cu_seqlens_q and total_q, below), and k/v point at
 * the caches:
 *   contiguous (block_table NULL): (num_cache_entries, Smax, Hk, D), fwd.seqlen_k = Smax, the
 *     batch strides step one cache entry; sequence b uses entry cache_batch_idx[b] (or b);
 *   paged: (num_blocks, page_size, Hk, D), the batch strides step one page, fwd.seqlen_k =
 *     max_blocks * page_size; cache position t of sequence b lives in page
 *     block_table[row * block_table_batch_stride + t / page_size], slot t % page_size, where row
 *     is cache_batch_idx[b] (or b) and num_cache_entries counts the table's rows.
 * With k_new/v_new (B, seqlen_new, Hk, D) the new tokens are first written into the cache at
 * positions cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1 (k after rotary).  Sequence b
 * then attends to cache positions cache_leftpad[b] (or 0) .. cache_seqlens[b] + seqlen_new - 1,
 * with causal/window masks bottom-right aligned over those keys.  Cache slots outside that range
 * are never read.
 * Rotary (rotary_cos/sin: (rotary_seqlen, rotary_dim / 2), q's dtype, contiguous) rotates the
 * first rotary_dim dims of the new k at positions cache_seqlens[b] + i, and of q at the same
 * positions when causal or windowed, else every query row at position cache_seqlens[b];
 * interleaved pairs (0,1),(2,3).. or, when rotary_interleaved is 0, halves (i, i + rotary_dim/2).
 * Positions are cache indices (cache_leftpad does not shift them).
 * Packed query rows (flash-attn 3's cu_seqlens_q): with fwd.cu_seqlens_q, int32 (B + 1) prefix sums,
 * q and out are (fwd.total_q, H, D) (batch strides ignored), softmax_lse is (H, total_q)
 * (lse_batch_stride ignored) and fwd.seqlen_q is max_seqlen_q, an upper bound on a sequence's rows
 * that the library lowers to total_q (so any bound up to 2^31 - 1 is accepted); sequence b's rows
 * cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 attend as a call with seqlen_q = their count would,
 * masks bottom-right aligned to that count.  Not combined with k_new or rotary.  On CUDA a
 * cu_seqlens_q that breaks the CPU's rules makes every output NaN.
 * Cache lengths as a paged varlen call gives them (flash_attn_varlen_func's decode step): with
 * cache_seqlens NULL, fwd.cu_seqlens_k (B + 1) gives sequence b's key count
 * cu_seqlens_k[b + 1] - cu_seqlens_k[b] (its entries give lengths only, no rows), which must lie in
 * [0, max_seqlen_k], and its cache length is fwd.seqused_k[b] when seqused_k is given (in [0, that
 * count]), else the count.  max_seqlen_k <= fwd.seqlen_k; fwd.total_k is unused.  Not combined
 * with k_new or rotary.  On CUDA a sequence whose entries break these rules gets NaN outputs, as
 * for a cache_seqlens out of range. */
typedef struct tileattn_kvcache_params {
  tileattn_fwd_params fwd;
  const int32_t* cache_seqlens;   /* (B): tokens in the cache before the append; required
                                   * unless fwd.cu_seqlens_k gives the lengths (above) or
                                   * uniform_cache_seqlen one length for all (below) */
  const int32_t* cache_batch_idx; /* (B) or NULL */
  const int32_t* cache_leftpad;   /* (B) or NULL */
  const int32_t* block_table;     /* (num_cache_entries, max_blocks) or NULL (contiguous cache) */
  int64_t block_table_batch_stride;
  int32_t num_cache_entries;      /* contiguous: cache entries; paged: block_table rows */
  int32_t num_blocks, page_size, max_blocks; /* paged only; page_size a multiple of 16 */
  const void* k_new;
  const void* v_new;
  int64_t k_new_batch_stride, k_new_row_stride, k_new_head_stride;
  int64_t v_new_batch_stride, v_new_row_stride, v_new_head_stride;
  int32_t seqlen_new;
  const void* rotary_cos;
  const void* rotary_sin;
  int32_t rotary_dim, rotary_seqlen, rotary_interleaved;
  int32_t num_splits; /* 0 = heuristic; a fixed value gives batch-invariant results */
  /* Scratch for the split-KV partial results (CUDA).  NULL: the library takes it from its own
   * stream-ordered pool.  Otherwise device memory of at least tileattn_kvcache_workspace_size()
   * bytes, 256-byte aligned, that nothing else touches until the call's work on fwd.stream is
   * done: what PyTorch's caching allocator hands out, and during CUDA-graph capture the graph's
   * own pool.  The Python package always passes one (see python/tileattn/_ops.py for why). */
  void* workspace;
  int64_t workspace_bytes;
  int32_t max_seqlen_k; /* with fwd.cu_seqlens_k in place of cache_seqlens (above) */
  /* flash-attn's int cache_seqlens: with uniform_cache_seqlen nonzero (and cache_seqlens and
   * fwd.cu_seqlens_k NULL) every sequence holds cache_seqlen tokens before the append.  No device
   * array is read, so a CUDA call needs no kernel to fill one, and the value is checked on the
   * host: cache_seqlen in [0, fwd.seqlen_k - seqlen_new]. */
  int32_t uniform_cache_seqlen;
  int32_t cache_seqlen;
} tileattn_kvcache_params;

/* Fills defaults: everything zero/NULL except window_left = window_right = -1. */
TILEATTN_API void tileattn_fwd_params_init(tileattn_fwd_params* params);
TILEATTN_API void tileattn_bwd_params_init(tileattn_bwd_params* params);
TILEATTN_API void tileattn_kvcache_params_init(tileattn_kvcache_params* params);

/* Validate, then run on params->device.  Returns TILEATTN_OK or an error code; on error
 * tileattn_last_error() tells what was wrong and tileattn_last_error_argument() names the
 * argument (both thread-local, valid until the next call on this thread).  What a call writes
 * (out, softmax_lse, attn_probs; dq, dk, dv; the workspace; the caches when k_new is given) may
 * share no byte with any other argument, or the call fails naming it: the kernels read and write
 * in no fixed order.  Views that interleave without sharing a byte are fine. */
TILEATTN_API int tileattn_forward(const tileattn_fwd_params* params);
TILEATTN_API int tileattn_backward(const tileattn_bwd_params* params);
/* Validates like tileattn_backward, then stores in *bytes the workspace those params may need (0
 * on the CPU): the most over the kernels the shapes allow, never depending on the pointers. */
TILEATTN_API int tileattn_backward_workspace_size(const tileattn_bwd_params* params, int64_t* bytes);
/* Appends to the cache (when k_new is given), then attends.  On CUDA the index arrays are not
 * read on the host: see src/api/dispatch.cpp for what happens when their contents are wrong.
 * With the environment variable TILEATTN_CHECK_CONTENTS=on, every CUDA call (this one,
 * tileattn_forward and tileattn_backward) copies its index arrays to the host first and fails as
 * a CPU call would, naming the argument (a stream sync per array; refused under graph capture). */
TILEATTN_API int tileattn_forward_kvcache(const tileattn_kvcache_params* params);
/* Validates like tileattn_forward_kvcache, then stores in *bytes the workspace those params may
 * need: 0 on the CPU and when no kernel the call could take splits.  It depends only on the
 * shapes, dtype, num_splits and device, never on the pointers, so one answer serves every call
 * with the same shapes. */
TILEATTN_API int tileattn_kvcache_workspace_size(const tileattn_kvcache_params* params, int64_t* bytes);

TILEATTN_API const char* tileattn_last_error(void);
TILEATTN_API const char* tileattn_last_error_argument(void);

TILEATTN_API int tileattn_abi_version(void);
/* 1 when the CUDA backend was compiled in. */
TILEATTN_API int tileattn_has_cuda(void);
/* Bytes of the compiled-in struct layouts, so a binding can check it mirrors them exactly. */
TILEATTN_API int64_t tileattn_fwd_params_size(void);
TILEATTN_API int64_t tileattn_bwd_params_size(void);
TILEATTN_API int64_t tileattn_kvcache_params_size(void);

#ifdef __cplusplus
}
#endif

#endif /* TILEATTN_TILEATTN_H */
