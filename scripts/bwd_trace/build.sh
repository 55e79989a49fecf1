#!/usr/bin/env bash
# Builds a library whose warp-specialized Hopper backward (d128, bf16) stamps clock64() at every
# query block of its roles' walks (trace.patch, src/cuda/sm90/bwd_trace_sm90.h there), for
# bench/gpu/bwd_trace.py to read on the GPU machine.  scripts/object_variant.sh compiles only the
# traced object from a patched copy of this checkout's sources and links it with the rest of
# BUILD_DIR (default build-final2), exporting the trace's reader.  Session 77 found with it the exp2 pass waiting for
# its LSE loads and the dS stores going out as generic stores, then the dQ writer as the next wait (perf log).
# Usage (repo root): [BUILD_DIR=build-cuda] bash scripts/bwd_trace/build.sh
#   -> scratch/carry/bwd-trace-d128.so.xz   (on the device: TILEATTN_LIBRARY=... python3 bench/gpu/bwd_trace.py)
set -euo pipefail
cd "$(dirname "$0")/../.."
EXPORT_SYMBOL=tileattn_bwd_trace_read bash scripts/object_variant.sh bwd-trace-d128 scripts/bwd_trace/trace.patch \
  bwd_sm90_bf16_hdim128.cu.o -DTILEATTN_BWD_TRACE
