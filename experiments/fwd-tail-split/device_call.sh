#!/usr/bin/env bash
# The tail split's device calls (README.md beside this file), run from the repository root of a
# checkout with kernel.patch applied, with a library built from it:
#   OUT=$OUT bash experiments/fwd-tail-split/device_call.sh LIB tests   (~5 min)
#   OUT=$OUT bash experiments/fwd-tail-split/device_call.sh LIB bench   (~6 min)
# tests: the choice test (on/off agree, on is deterministic, auto's pick), then the forward check,
# the forward pytest and a memcheck with the split forced on every call it can serve, and the
# forward check with the cluster kernel forced too.  bench: A/B of off against on over the
# non-causal sweep (one library, the variable set per side), then tile_waves.py (rate against the
# last round's fill) with the split off and on.  Tables go to stdout; the A/B's files to $OUT.
set -u -o pipefail
source scripts/unpack_library.sh
LIB=$(unpack_library "$1")
WHAT=${2:-tests}
OUT=${OUT:-tail-split-out}
mkdir -p "$OUT"
export TILEATTN_LIBRARY=$LIB PYTHONPATH=$PWD/python:$PWD/tests/python PYTHONUNBUFFERED=1
PYTEST="python3 -m pytest -q -p no:cacheprovider -o faulthandler_timeout=90"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
if [[ $WHAT == tests ]]; then
  TILEATTN_TEST_DEVICES=cuda timeout 120 $PYTEST tests/python/test_bad_input.py -k "tail_split or kv_multicast" \
    2>&1 | tail -3
  TILEATTN_FORWARD_TAIL_SPLIT=on timeout 180 python3 tests/cuda/check_forward.py "$LIB" 2>&1 | tail -2
  TILEATTN_FORWARD_TAIL_SPLIT=on TILEATTN_FORWARD_KV_MULTICAST=on timeout 180 \
    python3 tests/cuda/check_forward.py "$LIB" 2>&1 | tail -2
  TILEATTN_FORWARD_TAIL_SPLIT=on TILEATTN_TEST_DEVICES=cuda timeout 300 $PYTEST tests/python \
    -k "not grad and not backward and not kvcache and not random" 2>&1 | tail -3
  TILEATTN_FORWARD_TAIL_SPLIT=on timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 \
    python3 tests/cuda/sanitize_forward.py 2>&1 | tail -2
fi
if [[ $WHAT == bench ]]; then
  AB_ENV_A=TILEATTN_FORWARD_TAIL_SPLIT=off AB_ENV_B=TILEATTN_FORWARD_TAIL_SPLIT=on OUT=$OUT \
    timeout 420 bash scripts/gpu_ab.sh "$LIB" "$LIB" --shapes fa lecture --causal no --headdims 64 128 256 \
    --seqlens 512 1024 2048 4096 8192 16384 --direction fwd --queue 10
  for split in off on; do
    echo "== tile_waves, TILEATTN_FORWARD_TAIL_SPLIT=$split"
    TILEATTN_FORWARD_TAIL_SPLIT=$split timeout 90 python3 bench/gpu/tile_waves.py --shapes 1x1 1x4 1x31 1x32 1x33 2x16
  done
fi
