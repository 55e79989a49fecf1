// Blocks of 2 MiB and more kept between calls, with their pages, for ScratchArray.  A fresh block
// from the allocator is fresh memory: every 2 MiB huge page (4 KiB page without them) faults on
// its first touch and the kernel zeroes it, and a call's buffers are new every call.  perf on a
// bf16 d128 S=2048 backward (B=1, H=8, Zen 5 VM): the kernel's clear_page 8.6% of the samples,
// after the products' 47% the largest entry.  Kept blocks come back faulted in.
#pragma once

#include <cstddef>

namespace tileattn::cpu::huge_block_pool {

// Blocks' size unit and alignment: one transparent huge page.
constexpr size_t kHugePage = size_t{2} << 20;

// The most bytes the pool keeps: a bf16 d128 S=4096 backward (B=1, H=8) asks for ~60 MB of
// scratch; a call that needs more keeps what fits and gives the rest back.
constexpr size_t kMaxKeptBytes = size_t{256} << 20;

struct Block {
  void* data;
  size_t bytes;  // its size, at least what was asked for
};

// A block of at least `bytes`, aligned to kHugePage and offered to transparent huge pages: a kept
// block of `bytes` to 2 `bytes` if there is one (its pages already in), else a fresh one of `bytes`
// rounded up to whole huge pages.  Throws std::bad_alloc.
Block take(size_t bytes);

// Returns a block from take: kept while the pool holds no more than kMaxKeptBytes with it, else
// freed.
void give_back(Block block);

// The bytes the pool keeps now, and a way to free them all (tests).
size_t kept_bytes();
void free_kept();

}  // namespace tileattn::cpu::huge_block_pool
