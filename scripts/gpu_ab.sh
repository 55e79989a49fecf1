#!/usr/bin/env bash
# A/B of two libtileattn.so builds through the benchmark CLI, in one process per run and runs
# alternating A, B, A, B: on the H200 two runs of the same library differ by 5-10% (clocks,
# placement), so a change is judged by whether both of its runs beat both of the other's.
# Prints, per case and direction, tileattn's TFLOP/s of each run and the median ratio B/A.
# Usage (repo root): bash scripts/gpu_ab.sh LIB_A LIB_B [python3 -m bench sweep options...]
#   e.g. bash scripts/gpu_ab.sh /tmp/main.so /tmp/new.so --headdims 128 --seqlens 512 8192 --direction bwd
# AB_RUNS (default 2) sets how many runs each side gets.  Pass `--queue 10` to time calls back to
# back: runs of one library then agree within ~2% instead of 5-20% (session 13).
# Writes two files under ${OUT:-ab-out}: ab-summary.txt (the table it prints) and ab-runs.tgz (each
# run's ab-{a,b}N.csv and .log): the device returns at most 8 files a call, and session 25 lost a
# third library's runs to that limit.  AB_BACKEND=tileattn-deterministic times the
# deterministic backward instead of the default tileattn.  AB_ENV_A / AB_ENV_B add environment
# settings to one side only (e.g. AB_ENV_B=TILEATTN_BACKWARD_WS=1 with the same library twice).
set -u -o pipefail
source "$(dirname "$0")/unpack_library.sh"
A=$(unpack_library "$1"); B=$(unpack_library "$2"); shift 2  # .so, or .so.xz from build_variant.sh
OUT=${OUT:-ab-out}
BACKEND=${AB_BACKEND:-tileattn}
RUNS_DIR=$(mktemp -d)
mkdir -p "$OUT"
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
RUNS=${AB_RUNS:-2}
for run in $(seq 1 "$RUNS"); do
  for side in a b; do
    lib=$A; extra=${AB_ENV_A:-}
    [[ $side == b ]] && { lib=$B; extra=${AB_ENV_B:-}; }
    env $extra TILEATTN_LIBRARY=$lib python3 -m bench sweep --backends "$BACKEND" --plot none --out "$RUNS_DIR/ab-$side$run.csv" "$@" \
      > "$RUNS_DIR/ab-$side$run.log" 2>&1 || { echo "run $side$run failed: $RUNS_DIR/ab-$side$run.log"; tail -5 "$RUNS_DIR/ab-$side$run.log"; exit 1; }
  done
done
(python3 - "$RUNS_DIR" "$BACKEND" "$RUNS" <<'PY'
import csv, os, statistics, sys
out = sys.argv[1]
n = int(sys.argv[3])
runs = {}
for name in [f"{side}{i}" for i in range(1, n + 1) for side in "ab"]:
    for r in csv.DictReader(open(os.path.join(out, f"ab-{name}.csv"))):
        if r["backend"] != sys.argv[2]:
            continue
        key = (r["direction"], r["causal"], r["headdim"], r["seqlen"])
        runs.setdefault(key, {})[name] = float(r["tflops"])
a_names, b_names = [f"a{i}" for i in range(1, n + 1)], [f"b{i}" for i in range(1, n + 1)]
print(f"{'dir':6} {'causal':6} {'d':>4} {'seqlen':>6} | " + " ".join(f"{x.upper():>7}" for x in a_names) + " | "
      + " ".join(f"{x.upper():>7}" for x in b_names) + " | B/A")
for key in sorted(runs, key=lambda k: (k[0], k[1], int(k[2]), int(k[3]))):
    v = runs[key]
    a, b = [v.get(x) for x in a_names], [v.get(x) for x in b_names]
    if None in a or None in b:
        continue
    ratio = statistics.median(b) / statistics.median(a)
    clear = " (all B runs above all A runs)" if min(b) > max(a) else (" (all below)" if max(b) < min(a) else "")
    print(f"{key[0]:6} {key[1]:6} {key[2]:>4} {key[3]:>6} | " + " ".join(f"{x:7.1f}" for x in a) + " | "
          + " ".join(f"{x:7.1f}" for x in b) + f" | {ratio:.3f}{clear}")
PY
) | tee "$OUT/ab-summary.txt"
tar czf "$OUT/ab-runs.tgz" -C "$RUNS_DIR" .
