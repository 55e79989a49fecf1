#include "cpu/openblas_core.h"

#include <cblas.h>

#include <cstdlib>
#include <cstring>

// OpenBLAS's own entry points of its DYNAMIC_ARCH build (driver/others/dynamic.c): quit forgets
// the chosen kernel table, init chooses again, reading OPENBLAS_CORETYPE first.  Weak, so that a
// build against an OpenBLAS of one fixed architecture (which has neither) still links.
extern "C" {
void gotoblas_dynamic_init(void) __attribute__((weak));
void gotoblas_dynamic_quit(void) __attribute__((weak));
}

namespace tileattn::cpu {
namespace {

const char* better_kernels() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    return "SkylakeX";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return nullptr;
}

const char* choose() {
  const char* chosen = openblas_get_corename();
  if (chosen == nullptr || std::strcmp(chosen, "Prescott") != 0) return chosen;
  const char* kernels = better_kernels();
  if (kernels == nullptr || std::getenv("OPENBLAS_CORETYPE") != nullptr || gotoblas_dynamic_init == nullptr ||
      gotoblas_dynamic_quit == nullptr) {
    return chosen;
  }
  // OPENBLAS_CORETYPE is the only way in to init's choice; it is set for that call alone.
  setenv("OPENBLAS_CORETYPE", kernels, 0);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  unsetenv("OPENBLAS_CORETYPE");
  return openblas_get_corename();
}

}  // namespace

const char* openblas_kernels() {
  static const char* const kernels = choose();
  return kernels;
}

}  // namespace tileattn::cpu
