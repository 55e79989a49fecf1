// Row kernels compiled for AVX-512, AVX2 and baseline x86-64, the clone chosen at load time: the
// library's baseline build vectorizes only to SSE2's 4 lanes.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TILEATTN_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TILEATTN_CPU_CLONES
#endif
