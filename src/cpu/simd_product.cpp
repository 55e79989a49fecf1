#include "cpu/simd_product.h"

#include "common/env_choice.h"
#include "tileattn/tileattn.hpp"

namespace tileattn::cpu::simd {

const Kernels* kernels() {
  switch (env_choice("TILEATTN_CPU_SIMD", {"auto", "avx2", "off"})) {
    case 0: {
      const Kernels* wide = avx512_kernels();
      return wide != nullptr ? wide : avx2_kernels();
    }
    case 1:
      if (avx2_kernels() == nullptr) {
        throw Error(ErrorCode::kUnsupported, "TILEATTN_CPU_SIMD",
                    "TILEATTN_CPU_SIMD=avx2, but this CPU has no AVX2 with FMA; unset it or set it to off");
      }
      return avx2_kernels();
    default:
      return nullptr;
  }
}

}  // namespace tileattn::cpu::simd
