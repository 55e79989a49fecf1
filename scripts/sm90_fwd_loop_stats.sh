#!/usr/bin/env bash
# Compiles one sm90 forward kernel (plain scores, no dropout, bf16) from a source tree and prints
# what decides its speed before a GPU run: ptxas's registers, spills and wgmma serialization
# warnings (C75xx), the kernel's SASS length and its key-block loop's length and R2UR moves
# (scripts/sass_loop_stats.py).  About 35 s on 2 cores, against ~3-8 min for the six sm90 forward
# units of a variant build.  Session 14's chained tiles lost at every d128 size to two things this
# shows: wgmma descriptors out of the uniform registers (33 R2UR a loop iteration, main: 0) and a
# kernel 1.9x main's length (instruction-fetch stalls).
# Usage (repo root): bash scripts/sm90_fwd_loop_stats.sh [HEAD_DIM (64|128|256)] [SOURCE_TREE]
#   e.g. bash scripts/sm90_fwd_loop_stats.sh 128 ../variants/chain
set -euo pipefail
cd "$(dirname "$0")/.."
head_dim=${1:-128}
tree=$(realpath "${2:-.}")
# CUTLASS where the CUDA build found it (cmake/cutlass.cmake): its -DTILEATTN_CUTLASS_DIR, else
# the wheel it downloaded into the build folder.
build=${BUILD_DIR:-build-final2}
cutlass=${TILEATTN_CUTLASS_DIR:-$(sed -n 's/^TILEATTN_CUTLASS_DIR:PATH=//p' "$build/CMakeCache.txt" 2>/dev/null || true)}
cutlass=${cutlass:-$build/_deps/cutlass_library/source}
[[ -f $cutlass/include/cute/tensor.hpp ]] || { echo "sm90_fwd_loop_stats: no CUTLASS at '$cutlass' (configure $build first)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/one.cu" <<CU
#include "cuda/sm90/launch_sm90.h"
template bool tileattn::cuda::sm90::launch_fwd_sm90_variant<
    tileattn::cuda::sm90::Sm90Traits<$head_dim, cutlass::bfloat16_t>, tileattn::cuda::PlainScores,
    tileattn::cuda::NoDropout>(const tileattn::cuda::FwdKernelArgs&, cudaStream_t);
CU
nvcc -I"$tree/include" -I"$tree/src" -isystem="$cutlass/include" -isystem="$cutlass/tools/util/include" \
  -O3 -DNDEBUG --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -std=c++17 -Xptxas -v \
  -c "$work/one.cu" -o "$work/one.o" > "$work/ptxas.log" 2>&1 || { cat "$work/ptxas.log"; exit 1; }
grep -E "registers|spill" "$work/ptxas.log" | sed 's/^ptxas info *: *//' | grep -v "^Compiling"
echo "wgmma warnings (C75xx): $(grep -c 'C75[0-9][0-9]' "$work/ptxas.log" || true)"
bash scripts/sass.sh "$work/one.o" | python3 scripts/sass_loop_stats.py
