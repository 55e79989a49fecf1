#!/usr/bin/env bash
# The tail split's device calls (README.md beside this file), from the repository root of a checkout
# with tests.patch applied; MAIN is main's library, VARIANT the one object_variant.sh built with
# kernel.patch (.so or .so.xz):
#   OUT=$OUT bash experiments/fwd-tail-split/device_call.sh tests VARIANT        (~5 min)
#   OUT=$OUT bash experiments/fwd-tail-split/device_call.sh bench MAIN VARIANT   (~7 min)
#   OUT=$OUT bash experiments/fwd-tail-split/device_call.sh rule VARIANT         (~4 min)
# tests: the choice test (on/off agree, on is deterministic, auto's pick), the forward check, the
# forward pytest and a memcheck with the split forced on every call it can serve, and the forward
# check with the cluster kernel forced too.  bench: A/B of main against the variant under auto over
# the FA sweep, causal and not (causal calls run the variant's kernels too, split or not), then
# tile_waves.py (rate against the last round's fill) with the split off and on, and
# chunked_prefill.py (few query tiles over many keys).  rule: the variant
# with the split off against on at every non-causal point (fa and lecture shapes), for auto's rule.
# Tables go to stdout, the A/Bs' files to $OUT.
set -u -o pipefail
source scripts/unpack_library.sh
WHAT=$1
shift
OUT=${OUT:-tail-split-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/python:$PWD/tests/python PYTHONUNBUFFERED=1
PYTEST="python3 -m pytest -q -p no:cacheprovider -o faulthandler_timeout=90"
SWEEP=(--headdims 64 128 256 --seqlens 512 1024 2048 4096 8192 16384 --direction fwd --queue 10)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
case $WHAT in
  tests)
    LIB=$(unpack_library "$1")
    export TILEATTN_LIBRARY=$LIB
    TILEATTN_TEST_DEVICES=cuda timeout 120 $PYTEST tests/python/test_bad_input.py -k "tail_split or kv_multicast" \
      2>&1 | tail -3
    TILEATTN_FORWARD_TAIL_SPLIT=on timeout 180 python3 tests/cuda/check_forward.py "$LIB" 2>&1 | tail -2
    TILEATTN_FORWARD_TAIL_SPLIT=on TILEATTN_FORWARD_KV_MULTICAST=on timeout 180 \
      python3 tests/cuda/check_forward.py "$LIB" 2>&1 | tail -2
    TILEATTN_FORWARD_TAIL_SPLIT=on TILEATTN_TEST_DEVICES=cuda timeout 300 $PYTEST tests/python \
      -k "not grad and not backward and not kvcache and not random" 2>&1 | tail -3
    TILEATTN_FORWARD_TAIL_SPLIT=on timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 \
      python3 tests/cuda/sanitize_forward.py 2>&1 | tail -2
    ;;
  bench)
    MAIN=$(unpack_library "$1")
    VARIANT=$(unpack_library "$2")
    OUT=$OUT/main-vs-variant timeout 360 bash scripts/gpu_ab.sh "$MAIN" "$VARIANT" --shapes fa --causal both "${SWEEP[@]}"
    for split in off on; do
      echo "== tile_waves, variant, TILEATTN_FORWARD_TAIL_SPLIT=$split"
      TILEATTN_LIBRARY=$VARIANT TILEATTN_FORWARD_TAIL_SPLIT=$split timeout 90 \
        python3 bench/gpu/tile_waves.py --shapes 1x1 1x4 1x31 1x32 1x33 2x16
    done
    TILEATTN_LIBRARY=$VARIANT timeout 90 python3 experiments/fwd-tail-split/chunked_prefill.py
    ;;
  rule)
    VARIANT=$(unpack_library "$1")
    AB_ENV_A=TILEATTN_FORWARD_TAIL_SPLIT=off AB_ENV_B=TILEATTN_FORWARD_TAIL_SPLIT=on OUT=$OUT/off-vs-on \
      timeout 420 bash scripts/gpu_ab.sh "$VARIANT" "$VARIANT" --shapes fa lecture --causal no "${SWEEP[@]}"
    ;;
  *)
    echo "usage: device_call.sh tests VARIANT | bench MAIN VARIANT | rule VARIANT" >&2
    exit 2
    ;;
esac
