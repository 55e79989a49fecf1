#!/usr/bin/env bash
# Builds a library whose decode kernels stamp a timeline of every call (trace.patch): each split
# CTA records globaltimer at its start and end and clock64 at its steps (the sequence's bounds
# known, Q built, warp 0's first TMA block landed, the loop done, the warps merged, the outputs
# stored), and the combine kernel's CTA 0 prints them, with its own wait and end, for a call made
# with TILEATTN_DECODE_TRACE set (bench/gpu/decode_trace.py).  scripts/object_variant.sh compiles
# the three decode objects from a copy of this checkout's sources with the patch applied (~70 s on
# 2 cores; all three, as the patch adds a field to DecodeArgs, which the host side and the kernels
# must agree on) and links them with the rest of BUILD_DIR (default build-final2).
# Calls whose splits merge in a cluster (no combine kernel) print nothing: trace with
# TILEATTN_DECODE_SPLIT_MERGE=combine.
# Session 19 found with it that a 1 x 2k call's split CTAs spend 1.3 us on the sequence's bounds
# before their first request, and what the combine's 2 us are made of (perf log).
# Usage (repo root): bash scripts/decode_trace/build.sh
#   -> scratch/carry/trace-decode.so.xz   (on the device: TILEATTN_LIBRARY=... python3 bench/gpu/decode_trace.py)
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/object_variant.sh trace-decode scripts/decode_trace/trace.patch \
  "cuda_decode.cu.o decode_bf16.cu.o decode_fp16.cu.o"
