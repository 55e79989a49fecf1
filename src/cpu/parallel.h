// Work distribution for the CPU backend: a list of independent tasks spread over OpenMP threads,
// each thread holding its own scratch buffers for the whole run.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace tileattn::cpu {

// A request above the CPUs this process may use gains nothing and, far above, starts thousands of
// threads (libgomp exits the process when it cannot create one), so it is clamped to them.
inline int resolve_threads(int requested) {
  return requested > 0 ? std::min(requested, std::max(1, omp_get_num_procs())) : omp_get_max_threads();
}

// Calls work(task, scratch) for task in [0, count), with one Scratch per thread.  Dynamic
// scheduling: causal and varlen tasks differ in cost by up to the sequence length.
template <typename Scratch, typename MakeScratch, typename Work>
void parallel_tasks(int64_t count, int num_threads, MakeScratch make_scratch, Work work) {
  if (count <= 0) return;
  const int threads = static_cast<int>(std::min<int64_t>(resolve_threads(num_threads), count));
#pragma omp parallel num_threads(threads)
  {
    // Every worker's tile products run on its own thread alone.  A team of one thread is an
    // inactive region, in which OpenBLAS would split each product over all the cores; the
    // Haswell kernels it picks on Zen 5 then round differently with the split, and
    // AttentionEdges.ForwardIndependentOfThreadCount failed there.  The setting is this implicit
    // task's own, so the caller's thread count is unchanged.
    omp_set_num_threads(1);
    Scratch scratch = make_scratch();
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < count; ++task) work(task, scratch);
  }
}

}  // namespace tileattn::cpu
