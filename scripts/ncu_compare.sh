#!/usr/bin/env bash
# Nsight Compute on the calls where tileattn trails a baseline (docs/perf-log.md, session 11):
# each (backend, direction, shape) of the list below profiled alone through bench/gpu/ncu_call.py
# (ONLY=regex keeps the runs whose name matches),
# the sections that say where a kernel's time goes, one text report per run under ${OUT:-ncu-out}.
# Usage (repo root, on the GPU machine): bash scripts/ncu_compare.sh [libtileattn.so]
set -u
LIB=$(realpath "${1:-build-final2/src/libtileattn.so}")
OUT=${OUT:-ncu-out}
mkdir -p "$OUT"
export TILEATTN_LIBRARY=$LIB PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
# The sections say how busy each unit was; the stall metrics (cycles a warp spent stalled per issued
# instruction, by reason) say what the warps waited for, which the sections only summarize.
SECTIONS=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
  --section WarpStateStats --section SchedulerStats --section InstructionStats --section Occupancy
  --section LaunchStats --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio')
# The forward's call is found by its NVTX range; the backward runs on autograd's own thread, where
# the main thread's range does not reach, so its main kernel is picked by name: the 4th launch (after
# three warm-up steps) of tileattn's two backward kernels or flash-attn 2's.
BWD_KERNELS='regex:fa2_bwd_kernel|bwd_ws_kernel|flash_bwd_dq_dk_dv'
while read -r name backend direction options; do
  [[ -z $name || $name == \#* ]] && continue
  [[ -n ${ONLY:-} && ! $name =~ $ONLY ]] && continue
  select=(--nvtx --nvtx-include "profile/")
  [[ $direction == bwd ]] && select=(--kernel-name "$BWD_KERNELS" --launch-skip 3 --launch-count 1)
  timeout 90 ncu "${select[@]}" "${SECTIONS[@]}" \
    python3 bench/gpu/ncu_call.py "$backend" "$direction" $options < /dev/null > "$OUT/$name.txt" 2>&1
  echo "$name: rc=$? $(grep -c 'Duration' "$OUT/$name.txt") kernels"
done <<'LIST'
# name                        backend                 direction  options
bwd-d256-8k-tileattn          tileattn                bwd        --headdim 256 --seqlen 8192
bwd-d256-8k-flash             sdpa-flash              bwd        --headdim 256 --seqlen 8192
bwd-d128-8k-tileattn          tileattn                bwd        --headdim 128 --seqlen 8192
bwd-d128-8k-deterministic     tileattn-deterministic  bwd        --headdim 128 --seqlen 8192
fwd-d128-512-causal-tileattn  tileattn                fwd        --headdim 128 --seqlen 512 --causal
fwd-d128-512-causal-cudnn     sdpa-cudnn              fwd        --headdim 128 --seqlen 512 --causal
fwd-d64-512-causal-tileattn   tileattn                fwd        --headdim 64 --seqlen 512 --causal
fwd-d64-512-causal-cudnn      sdpa-cudnn              fwd        --headdim 64 --seqlen 512 --causal
fwd-d128-8k-tileattn          tileattn                fwd        --headdim 128 --seqlen 8192
fwd-d128-8k-cudnn             sdpa-cudnn              fwd        --headdim 128 --seqlen 8192
LIST
