// Deterministic dQ close to the atomic path's speed: every key-block CTA still adds its dS K into the
// float32 dQ workspace, but the CTAs that touch one query block take turns, in ascending key
// block order, through a counter per (sequence, head, query block) in global memory.  Each
// address then receives the same additions in the same order on every run, so the float sums are
// bitwise reproducible.  The kernel walks query blocks from the last down, so under causal and
// window masks all key blocks of a head meet each query block in about the same step and the
// waits cost roughly one CTA's atomics (and their drain before the release) per step.
//
// Deadlock freedom: a CTA waits only for CTAs of lower key block in the same (sequence, head),
// which have lower linear block indices and are therefore already resident or finished (the
// hardware dispatches CTAs in linear order), and those never wait for higher ones.
#pragma once

namespace tileattn::cuda::bwd {

// One thread: spins until the counter reaches `turn` (the number of CTAs that add to this query
// block before us), with acquire loads; then releases the counter to the next CTA.
__device__ __forceinline__ void poll_for_turn(const int* counter, int turn) {
  int seen;
  while (true) {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
    if (seen == turn) break;
    __nanosleep(32);
  }
}
__device__ __forceinline__ void release_turn(int* counter) {
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;" : : "l"(counter) : "memory");
}

// The whole CTA: thread 0 polls, the barrier then releases the others.
__device__ __forceinline__ void wait_for_turn(const int* counter, int turn) {
  if (threadIdx.x == 0) poll_for_turn(counter, turn);
  __syncthreads();
}

// Hands the query block to the next CTA once every thread's atomics are issued: the barrier
// orders them before thread 0's release increment (CUTLASS's generic-barrier pattern).
__device__ __forceinline__ void pass_turn(int* counter) {
  __syncthreads();
  if (threadIdx.x == 0) release_turn(counter);
}

}  // namespace tileattn::cuda::bwd
