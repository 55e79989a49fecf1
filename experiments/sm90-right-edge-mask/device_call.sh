#!/usr/bin/env bash
# The right-edge mask's device call (README.md beside this file), from the repository root of a
# checkout with kernel.patch applied and a library built from it (LIB), main's library as BASE:
#   OUT=$OUT bash experiments/sm90-right-edge-mask/device_call.sh LIB BASE   (~4 min)
# The window tests first (left windows now run the plain kernel's twin; causal and right windows
# the one-compare mask), the forward check, then 2 s back-to-back windows for BASE and LIB
# alternating (clock, energy a call) and the causal A/B.  The GPU suite (scripts/gpu_suite.sh LIB
# tests-forward, then tests-rest) is two more calls before it lands.
set -u -o pipefail
source scripts/unpack_library.sh
LIB=$(unpack_library "$1"); BASE=$(unpack_library "$2")
OUT=${OUT:-right-edge-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/python:$PWD/tests/python PYTHONUNBUFFERED=1
PYTEST="python3 -m pytest -q -p no:cacheprovider -o faulthandler_timeout=90"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
TILEATTN_LIBRARY=$LIB TILEATTN_TEST_DEVICES=cuda timeout 200 $PYTEST tests/python/test_attention.py \
  tests/python/test_varlen.py tests/python/test_bad_input.py -k "window or causal or short_walk" 2>&1 | tail -3
timeout 180 python3 tests/cuda/check_forward.py "$LIB" 2>&1 | tail -2
for round in 1 2; do
  for side in BASE LIB; do
    echo "== back to back, $side, round $round"
    TILEATTN_LIBRARY=${!side} timeout 100 python3 bench/gpu/clocks_and_l2.py --headdims 64 128 256 \
      --seqlens 512 1024 8192 --causal both --seconds 2 --runs 5 2>&1 | grep -v "^#" | tail -12
  done
done
OUT=$OUT/ab AB_RUNS=3 timeout 200 bash scripts/gpu_ab.sh "$BASE" "$LIB" --shapes fa --causal both \
  --headdims 64 128 256 --seqlens 512 1024 2048 8192 --direction fwd --queue 10 2>&1 | tail -26
