#!/usr/bin/env bash
# Builds a library whose decode kernels stamp a timeline of every call (trace.patch): each split
# CTA records globaltimer at its start and end and clock64 at its steps (the sequence's bounds
# known, Q built, warp 0's first TMA block landed, the loop done, the warps merged, the outputs
# stored), and the combine kernel's CTA 0 prints them, with its own wait and end, for a call made
# with TILEATTN_DECODE_TRACE set (bench/gpu/decode_trace.py).  The patch is applied to a copy of
# this checkout's sources; the three decode objects are compiled from it (~70 s on 2 cores, with
# build.ninja's own command lines: the patch adds a field to DecodeArgs, which the host side and
# the kernels must agree on) and linked with the rest of BUILD_DIR (default build-final2).
# Session 19 found with it that a 1 x 2k call's split CTAs spend 1.3 us on the sequence's bounds
# before their first request, and what the combine's 2 us are made of (perf log).
# Usage (repo root): bash scripts/decode_trace/build.sh
#   -> scratch/carry/trace-decode.so.xz   (on the device: TILEATTN_LIBRARY=... python3 bench/gpu/decode_trace.py)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD_DIR:-build-final2}
[[ -f $build/build.ninja ]] || { echo "decode_trace: build $build first" >&2; exit 1; }
source scripts/trace_build_lib.sh
trace_sources scripts/decode_trace/trace.patch
cp "$build/src/cuda/libtileattn_cuda.a" "$work/cuda.a"
for object in cuda_decode.cu.o decode_bf16.cu.o decode_fp16.cu.o; do
  trace_compile "$object"
  ar r "$work/cuda.a" "$work/$object"
done
link=$(cd "$build" && ninja -t commands src/libtileattn.so | tail -1)
link=${link//src\/cuda\/libtileattn_cuda.a/$work\/cuda.a}
link=${link//-o src\/libtileattn.so/-o $work\/libtileattn.so}
(cd "$build" && eval "$link")
mkdir -p scratch/carry
xz -T2 -6 -c "$work/libtileattn.so" > scratch/carry/trace-decode.so.xz
ls -l scratch/carry/trace-decode.so.xz
