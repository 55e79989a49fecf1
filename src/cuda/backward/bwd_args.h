// The arguments every backward kernel shares: the validated parameters and the float32 workspace.
#pragma once

#include <cstdint>

#include "cuda/backward/bwd_walk_order.h"
#include "tileattn/tileattn.h"

namespace tileattn::cuda::bwd {

struct BwdArgs {
  tileattn_bwd_params p;  // validated, softmax_scale resolved
  float* delta;           // (H, q_rows): D = rowsum(dO o O)
  float* dq_accum;        // (H, q_rows, dq_pitch), zeroed by bwd_delta; null on the fallback's deterministic path
  int dq_pitch;           // floats per dq_accum row: the head-dim bucket (FA2 path), else head_dim
  int* dq_turns;          // (B, H, dq_turn_blocks), zeroed: deterministic dQ order (FA2 path only)
  int dq_turn_blocks;     // query blocks per (sequence, head) in dq_turns
  WalkOrder walk_order;   // how CTAs walk their query blocks and take dQ turns (bwd_walk_order.h)
  float* dk_expanded;     // (H, k_rows, head_dim) per query head; null without GQA
  float* dv_expanded;
  int64_t q_rows, k_rows;  // rows of every sequence, packed (see packed_q_row)
  bool deterministic;
  // TILEATTN_BACKWARD_WS: whether the warp-specialized Hopper kernel (sm90/bwd_ws_launch.cuh) may
  // serve the call: never (0), where it measured faster (auto, the default) or wherever it can (1).
  enum class WarpSpecialized { kNever, kAuto, kAlways } warp_specialized;
  bool vector_q, vector_k, vector_v, vector_dout;  // 16-byte loads are safe for that input
  bool vector_out, vector_dq, vector_dk, vector_dv;  // 16-byte accesses are safe for these outputs
};

}  // namespace tileattn::cuda::bwd
