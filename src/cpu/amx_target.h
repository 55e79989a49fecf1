// Whether this build has the AMX path (x86-64 Linux, GCC), and the target attribute of the
// functions that run only where amx::enabled() is true.  Every CPU with AMX-BF16, and every one
// with AVX512-BF16 (the dot products' CPUs), has AVX-512F and BW with the BF16 conversions too
// (amx_bf16.cpp and bf16_dot_product.cpp check for all of them), so those functions use them.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define TILEATTN_AMX_BUILT 1
// GCC 12's AVX-512 headers build their "undefined" vectors from an uninitialized variable, which
// -Wall reports at every masked intrinsic; nothing here reads one.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#define TILEATTN_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512bf16")))
#else
#define TILEATTN_AMX_BUILT 0
#define TILEATTN_AMX_TARGET
#endif
