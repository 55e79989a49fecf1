// OpenBLAS picks its sgemm kernels by CPU model when it loads (its DYNAMIC_ARCH build), from a
// table fixed at its release.  Debian 12's 0.3.21 does not know Emerald Rapids (family 6 model
// 207) and falls back to its baseline "Prescott" kernels (SSE3): the float32 products, and on CPUs
// without AMX the bf16 and fp16 ones, ran 3.7x slower there (fp32 d128 S=1024 forward 64 against
// 237 GFLOP/s with the SkylakeX kernels; session 70).
#pragma once

namespace tileattn::cpu {

// Once a process, before the first sgemm: where OpenBLAS fell back to Prescott on a CPU with
// AVX-512 (F, CD, BW, DQ, VL) or AVX2 and FMA, reloads it with its SkylakeX or Haswell kernels.
// A user's OPENBLAS_CORETYPE is left as it is.  Returns the kernels' name ("SkylakeX", ...).
const char* openblas_kernels();

}  // namespace tileattn::cpu
