// Row kernels of the CPU backend that are not matrix products: the base-2 exponential, row max,
// scaling, and the 16-bit storage conversions.  Compiled for AVX-512, AVX2 and baseline x86-64,
// chosen at load time (target_clones; fp16 through F16C where the CPU has it, checked once), so one
// binary is fast on new CPUs and still runs on old ones.
#pragma once

#include <cstdint>

namespace tileattn::cpu {

// y[i] = 2^(scale x[i] - shift) (scale x[i] rounded as finish_scores rounds it; the baseline clone
// has no FMA), and the sum of the y[i].
// Exponents below -126 (and -inf) give exactly 0, so a masked score can never leak a denormal
// weight into a row.
float exp2_shifted_sum(const float* x, float scale, float shift, int count, float* y);

// The same, without the sum (the backward recomputes P from the saved LSE).
void exp2_shifted(const float* x, float shift, int count, float* y);

float row_max(const float* x, int count);

void scale_row(float* x, float factor, int count);

// Rows of 16-bit storage to float32 and back (round to nearest even, NaN stays NaN), for tiles
// converted as they are read and outputs written: 8 or 16 lanes where the CPU has the ISA for it.
void bf16_row_to_float(const uint16_t* src, int count, float* dst);
void float_row_to_bf16(const float* src, int count, uint16_t* dst);
void fp16_row_to_float(const uint16_t* src, int count, float* dst);
void float_row_to_fp16(const float* src, int count, uint16_t* dst);

}  // namespace tileattn::cpu
