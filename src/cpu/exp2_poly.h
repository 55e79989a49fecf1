// The polynomials of the CPU backend's 2^x: x = n + f with n = round(x), |f| <= 1/2, then 2^f by a
// polynomial in f.  vector_math.cpp's generic loops (float32 P and its sums) take its Taylor series
// in f ln 2 to degree 7: the first dropped term is (ln2/2)^8 / 8! = 5e-9, below float's 6e-8 ulp
// (float32 Horner: 9.9e-8 relative at most).  The AMX path's row kernel (amx_pack.cpp), whose P is
// rounded to bf16 (2^-9 relative) for its product, takes a degree-4 fit instead: 2.9e-6 relative at
// most (float32 Horner over 200,001 points of [-1/2, 1/2]), 1/1300 of bf16's rounding, with three
// FMAs fewer: the row kernel 26.7 -> 20.8 ns a 128-key row (one core, L1-resident rows).
#pragma once

namespace tileattn::cpu {

// Coefficients from degree 7 down to 0, for Horner's rule.
constexpr float kExp2Poly[8] = {1.5252733804e-5f, 1.5403530393e-4f, 1.3333558146e-3f, 9.6181291076e-3f,
                                5.5504108665e-2f, 2.4022650696e-1f, 6.9314718056e-1f, 1.0f};

// Degree 4 down to 0: a relative-error fit (Lawson-weighted least squares on Chebyshev points) with
// the constant held at exactly 1, so that 2^f >= 1 for f >= 0: the clamped masked scores (x = -126,
// f = 0) then give 2^-126, a normal float.  A free constant (0.9999993) made them subnormal, a
// microcode assist each, and a causal d128 S = 1024 forward 0.76-0.83x as fast.
constexpr float kExp2PolyBf16[5] = {9.5828529447e-3f, 5.5906426162e-2f, 2.4024099112e-1f, 6.9312417507e-1f, 1.0f};

}  // namespace tileattn::cpu
