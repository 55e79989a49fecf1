#!/usr/bin/env bash
# Builds a library whose sm90 forward (one head dim, bf16) stamps clock64() at every step of its
# producer and consumers (trace.patch, src/cuda/sm90/fwd_trace_sm90.h there), for
# bench/gpu/fwd_trace.py to read on the GPU machine.  scripts/object_variant.sh compiles only the
# one traced object from a copy of this checkout's sources with the patch applied (~60 s on 2
# cores) and links it with the rest of BUILD_DIR (default build-final2, built first), exporting the
# trace's reader.
# Session 18 found with it that ptxas waited for the PV product before the softmax (perf log).
# Usage (repo root): bash scripts/fwd_trace/build.sh [HEAD_DIM (64|128|256)]
#   -> scratch/carry/trace-dHEAD_DIM.so.xz   (on the device: TILEATTN_LIBRARY=... python3 bench/gpu/fwd_trace.py)
set -euo pipefail
cd "$(dirname "$0")/../.."
head_dim=${1:-128}
EXPORT_SYMBOL=tileattn_fwd_trace_read bash scripts/object_variant.sh "trace-d$head_dim" scripts/fwd_trace/trace.patch \
  "fwd_sm90_bf16_hdim$head_dim.cu.o" -DTILEATTN_FWD_TRACE
