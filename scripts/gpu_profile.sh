#!/usr/bin/env bash
# Nsight Compute summaries of the kernels whose speed targets are open (issues 5, 6, 8): one launch
# each, after warm-up calls, with the sections that say where the time goes (throughput, warp
# stalls, memory, occupancy).  Text only, to $OUT/ncu-*.txt.
# Usage (repo root, on the GPU machine): bash scripts/gpu_profile.sh [libtileattn.so]
set -u -o pipefail
LIB=$(realpath "${1:-build-final2/src/libtileattn.so}")
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export TILEATTN_LIBRARY=$LIB PYTHONPATH=$PWD/python
SECTIONS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
--section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats"
profile() {  # name kernel-regex workload-args...
  local name=$1 kernel=$2; shift 2
  timeout 120 ncu $SECTIONS -k "regex:$kernel" --launch-skip 2 --launch-count 1 \
    python3 scripts/profile_workload.py "$@" > "$OUT/ncu-$name.txt" 2>&1
  echo "$name rc=$? $(grep -m1 -E 'Duration' "$OUT/ncu-$name.txt")"
}
profile bwd-d128-8k fa2_bwd_kernel bwd --seqlen 8192 --headdim 128
profile fwd-sm90-d128-8k fwd_kernel_sm90 fwd --seqlen 8192 --headdim 128
profile decode-1x32k split_kernel decode --batch 1 --seqlen 32768 --calls 6
