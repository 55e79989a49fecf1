#!/usr/bin/env bash
# Nsight Compute's per-instruction stall sampling of one benchmark call (bench/gpu/ncu_call.py), exported
# as the SASS source page (CSV) and summarized by bench/gpu/ncu_sass_stalls.py: which instructions
# the warps wait at, and why.  Usage (repo root, on the GPU machine):
#   bash scripts/ncu_sass.sh NAME BACKEND fwd|bwd [ncu_call.py options]   e.g.
#   bash scripts/ncu_sass.sh fwd-d128-8k tileattn fwd --headdim 128 --seqlen 8192
# Writes NAME.txt (the sections), NAME-sass.csv and NAME-top-stalls.txt under ${OUT:-ncu-out}.
# TILEATTN_LIBRARY picks the library as for the benchmark.
set -u
NAME=$1 BACKEND=$2 DIRECTION=$3; shift 3
OUT=${OUT:-ncu-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
# The backward runs on autograd's thread, outside the NVTX range: its main kernel is picked by name
# (the 4th launch, after three warm-up steps), as in scripts/ncu_compare.sh.
select=(--nvtx --nvtx-include "profile/")
[[ $DIRECTION == bwd ]] && select=(--kernel-name "regex:fa2_bwd_kernel|bwd_ws_kernel|flash_bwd_dq_dk_dv" --launch-skip 3 --launch-count 1)
timeout 150 ncu "${select[@]}" --section SourceCounters --section WarpStateStats --section SpeedOfLight \
  --section ComputeWorkloadAnalysis --import-source no -f -o "$OUT/$NAME" \
  python3 bench/gpu/ncu_call.py "$BACKEND" "$DIRECTION" "$@" < /dev/null > "$OUT/$NAME.log" 2>&1
echo "$NAME: ncu rc=$?"
ncu --import "$OUT/$NAME.ncu-rep" --page details > "$OUT/$NAME.txt" 2>&1
ncu --import "$OUT/$NAME.ncu-rep" --page source --csv --print-source sass > "$OUT/$NAME-sass.csv"
python3 bench/gpu/ncu_sass_stalls.py "$OUT/$NAME-sass.csv" --top 30 > "$OUT/$NAME-top-stalls.txt"
head -14 "$OUT/$NAME-top-stalls.txt"
