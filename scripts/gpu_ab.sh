#!/usr/bin/env bash
# A/B of two libtileattn.so builds through the benchmark CLI, in one process per run and runs
# alternating A, B, A, B: on the H200 two runs of the same library differ by 5-10% (clocks,
# placement), so a change is judged by whether both of its runs beat both of the other's.
# Prints, per case and direction, tileattn's TFLOP/s of each run and the median ratio B/A.
# Usage (repo root): bash scripts/gpu_ab.sh LIB_A LIB_B [python3 -m bench sweep options...]
#   e.g. bash scripts/gpu_ab.sh /tmp/main.so /tmp/new.so --headdims 128 --seqlens 512 8192 --direction bwd
# Writes ab-{a,b}{1,2}.csv under ${OUT:-ab-out}.  AB_BACKEND=tileattn-deterministic times the
# deterministic backward instead of the default tileattn.  AB_ENV_A / AB_ENV_B add environment
# settings to one side only (e.g. AB_ENV_B=TILEATTN_BACKWARD_WS=1 with the same library twice).
set -u -o pipefail
A=$(realpath "$1"); B=$(realpath "$2"); shift 2
OUT=${OUT:-ab-out}
BACKEND=${AB_BACKEND:-tileattn}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
for run in 1 2; do
  for side in a b; do
    lib=$A; extra=${AB_ENV_A:-}
    [[ $side == b ]] && { lib=$B; extra=${AB_ENV_B:-}; }
    env $extra TILEATTN_LIBRARY=$lib python3 -m bench sweep --backends "$BACKEND" --plot none --out "$OUT/ab-$side$run.csv" "$@" \
      > "$OUT/ab-$side$run.log" 2>&1 || { echo "run $side$run failed: $OUT/ab-$side$run.log"; exit 1; }
  done
done
python3 - "$OUT" "$BACKEND" <<'PY'
import csv, os, statistics, sys
out = sys.argv[1]
runs = {}
for name in ("a1", "b1", "a2", "b2"):
    for r in csv.DictReader(open(os.path.join(out, f"ab-{name}.csv"))):
        if r["backend"] != sys.argv[2]:
            continue
        key = (r["direction"], r["causal"], r["headdim"], r["seqlen"])
        runs.setdefault(key, {})[name] = float(r["tflops"])
print(f"{'dir':6} {'causal':6} {'d':>4} {'seqlen':>6} | {'A1':>7} {'A2':>7} | {'B1':>7} {'B2':>7} | B/A")
for key in sorted(runs, key=lambda k: (k[0], k[1], int(k[2]), int(k[3]))):
    v = runs[key]
    a, b = [v.get("a1"), v.get("a2")], [v.get("b1"), v.get("b2")]
    if None in a or None in b:
        continue
    ratio = statistics.median(b) / statistics.median(a)
    clear = " (both B runs above both A runs)" if min(b) > max(a) else (" (both below)" if max(b) < min(a) else "")
    print(f"{key[0]:6} {key[1]:6} {key[2]:>4} {key[3]:>6} | {a[0]:7.1f} {a[1]:7.1f} | {b[0]:7.1f} {b[1]:7.1f} | "
          f"{ratio:.3f}{clear}")
PY
