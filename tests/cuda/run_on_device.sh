#!/usr/bin/env bash
# One device call: GPU facts, kernel resource usage, the forward check, the benchmark sweep, and
# compute-sanitizer (memcheck, racecheck) on a few small shapes.  Logs go to $OUT (or ./device-out).
# Usage (repo root): bash tests/cuda/run_on_device.sh [lib] [check|sanitize|bench|all]
set -u -o pipefail
LIB=${1:-build-cuda/src/libtileattn.so}
WHAT=${2:-all}
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  cuobjdump -res-usage "$LIB" 2>&1 | awk '/Function/{n=substr($2,1,120)} /REG:/{print $1, $2, n}' | grep -i fwd
  # SASS of the d128 bf16 plain kernel: where local-memory spills (LDL/STL) sit.
  cuobjdump -sass "$LIB" 2>/dev/null | awk '/Function : /{p = /ILi128EN7cutlass10bfloat16_tEEENS0_11PlainScores/} p' > "$OUT/sass_d128.txt"
  echo "d128 plain SASS lines $(wc -l < "$OUT/sass_d128.txt"), LDL $(grep -c LDL "$OUT/sass_d128.txt"), STL $(grep -c STL "$OUT/sass_d128.txt")"
} > "$OUT/gpu.log" 2>&1
rc=0
if [[ $WHAT == all || $WHAT == check ]]; then
  python3 tests/cuda/check_forward.py "$LIB" 2>&1 | tee "$OUT/check.log" || rc=1
fi
if [[ $WHAT == all || $WHAT == bench ]]; then
  python3 bench/gpu/fwd_sweep.py --lib "$LIB" --out "$OUT/fwd_sweep.csv" 2>&1 | tee "$OUT/bench.log"
fi
if [[ $WHAT == all || $WHAT == sanitize ]]; then
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
    timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 python3 tests/cuda/check_forward.py "$LIB" --quick \
      "--cases=17x17,causal Sq>Sk,varlen (0-length,d72 127x1000,window (5, 3),dropout 0.17,d160" \
      > "$OUT/sanitize_$tool.log" 2>&1
    echo "compute-sanitizer $tool exit $?; reports naming a tileattn kernel:" \
      "$(grep -A1 -E 'Error|Race reported' "$OUT/sanitize_$tool.log" | grep -c tileattn)" | tee -a "$OUT/sanitize_$tool.log"
    tail -4 "$OUT/sanitize_$tool.log"
  done
fi
exit $rc
