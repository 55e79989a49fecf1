// bfloat16 products on AVX512-BF16's dot-product instruction, for CPUs without AMX (AMD Zen 4 and
// later, Intel Cooper Lake).  The operands are AMX's (amx_bf16.h): A as bf16 rows, B in pairs
// layout, whose 64-byte pair row holds 16 columns of two consecutive depth rows, exactly one zmm
// register.  So one vdpbf16ps takes a pair row of B and one (A[i][2t], A[i][2t + 1]) broadcast to
// every lane, and adds A[i][2t] B[2t][j] + A[i][2t + 1] B[2t + 1][j] into 16 float32 sums: 32
// multiply-adds an instruction against float32 FMA's 16, on operands half the bytes.  The AMX
// path's packing, exp2 and backward operands are AVX-512 code and run here unchanged.
#pragma once

#include "cpu/amx_bf16.h"

namespace tileattn::cpu::bf16_dot {

// Whether the CPU (and OS, for the zmm state) offers AVX-512F, AVX-512BW and AVX512-BF16.
bool hardware_ready();

// amx::product's contract: C (m x n float32, rows ldc apart) = A B, or C + A B with `accumulate`;
// m and n multiples of 16, depth of 32.  Each C entry sums its depth pairs in order, t = 0, 1, ...
// (two products and two float32 roundings a pair, subnormals flushed to zero as the instruction
// does), so results do not depend on threads or on the register block.
void product(int m, int n, int depth, const amx::RowsOperand& a, const amx::PairsOperand& b, float* c, int ldc,
             bool accumulate);

}  // namespace tileattn::cpu::bf16_dot
