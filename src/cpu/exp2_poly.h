// The polynomial of the CPU backend's 2^x (vector_math.cpp's generic loops and the AMX path's
// AVX-512 row kernel share it, so both paths compute the same P).  x = n + f with n = round(x),
// |f| <= 1/2, then 2^f by its Taylor series in f ln 2 to degree 7: the first dropped term is
// (ln2/2)^8 / 8! = 5e-9, below float's 6e-8 ulp.
#pragma once

namespace tileattn::cpu {

// Coefficients from degree 7 down to 0, for Horner's rule.
constexpr float kExp2Poly[8] = {1.5252733804e-5f, 1.5403530393e-4f, 1.3333558146e-3f, 9.6181291076e-3f,
                                5.5504108665e-2f, 2.4022650696e-1f, 6.9314718056e-1f, 1.0f};

}  // namespace tileattn::cpu
