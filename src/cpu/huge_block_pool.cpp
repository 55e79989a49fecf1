#include "cpu/huge_block_pool.h"

#include <sys/mman.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <new>

namespace tileattn::cpu::huge_block_pool {
namespace {

struct Pool {
  std::mutex mutex;
  std::multimap<size_t, void*> blocks;  // by size, so take() finds the smallest that fits
  size_t bytes = 0;
};

// Never destroyed: blocks given back while the process exits (a thread's scratch, another
// static's destructor) must still find it.
Pool& pool() {
  static Pool* const instance = new Pool;
  return *instance;
}

}  // namespace

Block take(size_t bytes) {
  Pool& p = pool();
  {
    const std::lock_guard<std::mutex> lock(p.mutex);
    const auto fit = p.blocks.lower_bound(bytes);
    if (fit != p.blocks.end() && fit->first <= 2 * bytes) {
      const Block block{fit->second, fit->first};
      p.bytes -= block.bytes;
      p.blocks.erase(fit);
      return block;
    }
  }
  bytes = (bytes + kHugePage - 1) / kHugePage * kHugePage;  // aligned_alloc takes whole alignments
  void* data = std::aligned_alloc(kHugePage, bytes);
  if (data == nullptr) throw std::bad_alloc();
  madvise(data, bytes, MADV_HUGEPAGE);  // advice: its failure changes nothing
  return {data, bytes};
}

void give_back(Block block) {
  Pool& p = pool();
  {
    const std::lock_guard<std::mutex> lock(p.mutex);
    if (p.bytes + block.bytes <= kMaxKeptBytes) {
      try {
        p.blocks.emplace(block.bytes, block.data);
        p.bytes += block.bytes;
        return;
      } catch (const std::bad_alloc&) {  // no room for the map's node: free the block instead
      }
    }
  }
  std::free(block.data);
}

size_t kept_bytes() {
  Pool& p = pool();
  const std::lock_guard<std::mutex> lock(p.mutex);
  return p.bytes;
}

void free_kept() {
  Pool& p = pool();
  const std::lock_guard<std::mutex> lock(p.mutex);
  for (const auto& [bytes, data] : p.blocks) std::free(data);
  p.blocks.clear();
  p.bytes = 0;
}

}  // namespace tileattn::cpu::huge_block_pool
