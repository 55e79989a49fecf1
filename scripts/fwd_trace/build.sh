#!/usr/bin/env bash
# Builds a library whose sm90 forward (one head dim, bf16) stamps clock64() at every step of its
# producer and consumers (trace.patch, src/cuda/sm90/fwd_trace_sm90.h there), for
# bench/gpu/fwd_trace.py to read on the GPU machine.  The patch is applied to a copy of this
# checkout's sources; only the one traced object is compiled (~60 s on 2 cores, with build.ninja's
# own command line) and linked with the rest of BUILD_DIR (default build-final2, built first).
# Session 18 found with it that ptxas waited for the PV product before the softmax (perf log).
# Usage (repo root): bash scripts/fwd_trace/build.sh [HEAD_DIM (64|128|256)]
#   -> scratch/carry/trace-dHEAD_DIM.so.xz   (on the device: TILEATTN_LIBRARY=... python3 bench/gpu/fwd_trace.py)
set -euo pipefail
cd "$(dirname "$0")/../.."
head_dim=${1:-128}
build=${BUILD_DIR:-build-final2}
object=fwd_sm90_bf16_hdim$head_dim.cu.o
[[ -f $build/build.ninja ]] || { echo "fwd_trace: build $build first" >&2; exit 1; }
source scripts/trace_build_lib.sh
trace_sources scripts/fwd_trace/trace.patch
trace_compile "$object" -DTILEATTN_FWD_TRACE
cp "$build/src/cuda/libtileattn_cuda_sm90.a" "$work/sm90.a"
ar r "$work/sm90.a" "$work/$object"
# The same link, with the traced archive and the trace's reader exported (--exclude-libs would hide it).
link=$(cd "$build" && ninja -t commands src/libtileattn.so | tail -1)
link=${link//src\/cuda\/libtileattn_cuda_sm90.a/$work\/sm90.a}
link=${link//-o src\/libtileattn.so/-o $work\/libtileattn.so}
link=${link//--exclude-libs,ALL/--exclude-libs,libtileattn_cuda.a:libcudart_static.a:libopenblas.a:libpthread.a:librt.a}
(cd "$build" && eval "$link")
nm -D "$work/libtileattn.so" | grep -q tileattn_fwd_trace_read || { echo "fwd_trace: reader not exported" >&2; exit 1; }
mkdir -p scratch/carry
xz -T2 -6 -c "$work/libtileattn.so" > "scratch/carry/trace-d$head_dim.so.xz"
ls -l "scratch/carry/trace-d$head_dim.so.xz"
