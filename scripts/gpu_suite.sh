#!/usr/bin/env bash
# The GPU test suite and benchmark in one device call (see README, "CUDA"): the pytest suite on
# CUDA tensors, the standalone forward and backward checks, compute-sanitizer memcheck, then the
# FA sweep (forward and backward, tileattn next to SDPA flash and cuDNN) with its plot.
# Usage (repo root, on the GPU machine):
#   bash scripts/gpu_suite.sh [libtileattn.so] [tests|tests-forward|tests-rest|tests-parallel|bench|all]
# `tests` takes ~13 min in series, past one device call's limit: tests-forward (the pytest suite and
# the forward steps, 413 s in session 51) and tests-rest (the backward and decode steps, 388 s) split
# it in two calls. tests-parallel runs both halves at once as two processes, their console output
# in $OUT/forward.console and $OUT/rest.console and their logs in $OUT/forward/suite-logs.tgz and
# $OUT/rest/suite-logs.tgz; on the H100 of session 53 it did not fit one call (each step ran 2-3x
# slower beside the other half: the float64 references share the host's 16 cores), so it is for
# machines with more cores or a longer call.
# Every step has a time limit, so a kernel that hangs (a pipeline deadlock) fails its step and the
# rest still runs; a step's log ends where it hung.
set -u -o pipefail
source "$(dirname "$0")/unpack_library.sh"
LIB=$(unpack_library "${1:-build-final2/src/libtileattn.so}")  # a .so, or a .so.xz from build_variant.sh
WHAT=${2:-all}
OUT=${OUT:-gpu-out}
if [[ $WHAT == tests-parallel ]]; then
  mkdir -p "$OUT/forward" "$OUT/rest"
  OUT=$OUT/forward bash "$0" "$LIB" tests-forward > "$OUT/forward.console" 2>&1 &
  forward=$!
  OUT=$OUT/rest bash "$0" "$LIB" tests-rest > "$OUT/rest.console" 2>&1 &
  rest=$!
  wait $forward; forward_rc=$?
  wait $rest; rest_rc=$?
  for half in forward rest; do echo "== tests-$half"; cat "$OUT/$half.console"; done
  echo "tests-forward rc=$forward_rc, tests-rest rc=$rest_rc"
  exit $(( forward_rc || rest_rc ))
fi
# The test steps' logs go to LOGS and come back packed in $OUT/suite-logs.tgz: the device returns at
# most 8 files a call, and the steps write 21.
LOGS=$(mktemp -d)
mkdir -p "$OUT"
export TILEATTN_LIBRARY=$LIB PYTHONPATH=$PWD/python:$PWD/tests/python PYTHONUNBUFFERED=1
rc=0
# A test still running after 90 s dumps every thread's stack into its log (pytest's faulthandler),
# so a kernel that hangs names its test before the step's time limit kills it.
PYTEST="python3 -m pytest -q -p no:cacheprovider -o faulthandler_timeout=90"
# failed NAME: a step failed; its log's lines naming what failed and how to replay it (pytest's
# FAILED lines and TILEATTN_TEST_SEED) go to the console at once, because the full logs come back
# only in suite-logs.tgz, which a run cut short never writes (session 28 lost a failure's seed so).
failed() {
  rc=1
  grep -E "^(FAILED|ERROR) |to reproduce:|Error|FAIL" "$LOGS/$1.log" | tail -n 15
}
# forced_forward_steps NAME VARIABLE=VALUE: the forward check, the forward pytest (no gradients, no
# decode, no random configurations: most of their draws never reach the forced kernel, and the
# suite must fit one device call) and a memcheck of tests/cuda/sanitize_forward.py with one kernel
# choice forced on every call; logs check_forward_NAME, pytest_cuda_NAME and sanitize_forward_NAME.
forced_forward_steps() {
  local name=$1 setting=$2
  env "$setting" timeout 180 python3 tests/cuda/check_forward.py "$LIB" > "$LOGS/check_forward_$name.log" 2>&1 \
    || failed "check_forward_$name"
  tail -2 "$LOGS/check_forward_$name.log"
  env "$setting" TILEATTN_TEST_DEVICES=cuda timeout 300 $PYTEST tests/python -k "not grad and not backward and not kvcache and not random" \
    2>&1 | tee "$LOGS/pytest_cuda_$name.log" | tail -2 || failed "pytest_cuda_$name"
  env "$setting" timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tests/cuda/sanitize_forward.py \
    > "$LOGS/sanitize_forward_$name.log" 2>&1 || failed "sanitize_forward_$name"
  tail -2 "$LOGS/sanitize_forward_$name.log"
}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee "$LOGS/gpu.log"
if [[ $WHAT == all || $WHAT == tests || $WHAT == tests-forward ]]; then
  TILEATTN_TEST_DEVICES=cuda timeout 300 $PYTEST tests/python 2>&1 \
    | tee "$LOGS/pytest_cuda.log" | tail -4 || failed pytest_cuda
  if [[ ${SKIP_CHECK_FORWARD:-0} != 1 ]]; then
    timeout 180 python3 tests/cuda/check_forward.py "$LIB" > "$LOGS/check_forward.log" 2>&1 || failed check_forward
    tail -2 "$LOGS/check_forward.log"
  fi
  # Non-causal calls without a window or sequence bounds run the K/V-multicast kernel (two CTAs of a
  # cluster share each K/V load) where auto finds the query blocks pair up; forced on, every such
  # call runs it, the ones whose second CTA has no rows included.
  forced_forward_steps kv_multicast TILEATTN_FORWARD_KV_MULTICAST=on
  # At d64 causal calls of at most 1536 keys run the short-walk kernel (64-key blocks; short_walk.h)
  # and the rest the bucket's 128-key one: the forward steps again with the short-walk kernel forced
  # on every call it can serve, and the check with it off (the 128-key kernel on the short causal
  # calls too; ~40 s a pytest pass, and the suite must fit one call).
  forced_forward_steps short_walk TILEATTN_FORWARD_SHORT_WALK=on
  # Non-causal calls split the tiles of their last two rounds along the keys (the tail split,
  # src/cuda/sm90/tail_split.h) where auto's model gains: the forward steps again with the split
  # forced on every call it can serve, tiles cut into pieces of one key block included.
  forced_forward_steps tail_split TILEATTN_FORWARD_TAIL_SPLIT=on
  TILEATTN_FORWARD_SHORT_WALK=off timeout 180 python3 tests/cuda/check_forward.py "$LIB" \
    > "$LOGS/check_forward_no_short_walk.log" 2>&1 || failed check_forward_no_short_walk
  tail -2 "$LOGS/check_forward_no_short_walk.log"
  # On sm90 the runs above use the Hopper forward family (src/cuda/cuda_forward.cu); the forward
  # tests again with the sm80 family forced, which serves what the sm90 family does not (unaligned
  # or zero strides) and other GPUs.
  TILEATTN_FORWARD_FAMILY=sm80 timeout 180 python3 tests/cuda/check_forward.py "$LIB" > "$LOGS/check_forward_sm80.log" 2>&1 || failed check_forward_sm80
  tail -2 "$LOGS/check_forward_sm80.log"
  TILEATTN_TEST_DEVICES=cuda TILEATTN_FORWARD_FAMILY=sm80 timeout 300 $PYTEST \
    tests/python -k "not grad and not backward" 2>&1 | tee "$LOGS/pytest_cuda_sm80.log" | tail -2 || failed pytest_cuda_sm80
fi
if [[ $WHAT == all || $WHAT == tests || $WHAT == tests-rest ]]; then
  timeout 300 python3 tests/cuda/check_backward.py > "$LOGS/check_backward.log" 2>&1 || failed check_backward
  tail -1 "$LOGS/check_backward.log"
  # On sm90 the backward's products run on wgmma; the same checks with the mma.sync products.
  TILEATTN_BACKWARD_FAMILY=sm80 timeout 300 python3 tests/cuda/check_backward.py > "$LOGS/check_backward_sm80.log" 2>&1 || failed check_backward_sm80
  tail -1 "$LOGS/check_backward_sm80.log"
  TILEATTN_TEST_DEVICES=cuda TILEATTN_BACKWARD_FAMILY=sm80 timeout 300 $PYTEST \
    tests/python -k "grad or backward" 2>&1 | tee "$LOGS/pytest_cuda_bwd_sm80.log" | tail -2 || failed pytest_cuda_bwd_sm80
  timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tests/cuda/sanitize_backward.py \
    > "$LOGS/sanitize_backward.log" 2>&1 || failed sanitize_backward
  tail -2 "$LOGS/sanitize_backward.log"
  # The warp-specialized Hopper backward serves dense d65-128 calls from 1024 query rows under
  # auto (d <= 64 only when forced); the checks, gradient tests and memcheck again with it forced,
  # at every size it can serve.
  TILEATTN_BACKWARD_WS=1 timeout 300 python3 tests/cuda/check_backward.py > "$LOGS/check_backward_ws.log" 2>&1 || failed check_backward_ws
  tail -1 "$LOGS/check_backward_ws.log"
  TILEATTN_TEST_DEVICES=cuda TILEATTN_BACKWARD_WS=1 timeout 300 $PYTEST \
    tests/python -k "grad or backward" 2>&1 | tee "$LOGS/pytest_cuda_bwd_ws.log" | tail -2 || failed pytest_cuda_bwd_ws
  TILEATTN_BACKWARD_WS=1 timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 \
    python3 tests/cuda/sanitize_backward.py > "$LOGS/sanitize_backward_ws.log" 2>&1 || failed sanitize_backward_ws
  tail -2 "$LOGS/sanitize_backward_ws.log"
  timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tests/cuda/sanitize_decode.py \
    > "$LOGS/sanitize_decode.log" 2>&1 || failed sanitize_decode
  tail -2 "$LOGS/sanitize_decode.log"
  # Decode on sm90 runs the TMA loop for calls with the split heuristic on contiguous caches or
  # pages a multiple of its block, the register loop for a fixed num_splits and other page sizes
  # (cuda_decode.cu): the decode tests and memcheck again with each forced at every call.
  TILEATTN_TEST_DEVICES=cuda TILEATTN_DECODE_FAMILY=sm90 timeout 120 $PYTEST \
    tests/python/test_kvcache.py tests/python/test_kvcache_cuda_graph.py 2>&1 | tee "$LOGS/pytest_decode_tma.log" | tail -2 || failed pytest_decode_tma
  TILEATTN_DECODE_FAMILY=sm90 timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 \
    python3 tests/cuda/sanitize_decode.py > "$LOGS/sanitize_decode_tma.log" 2>&1 || failed sanitize_decode_tma
  tail -2 "$LOGS/sanitize_decode_tma.log"
  # The wide ring (32-key blocks at d128, one CTA an SM) serves only grids of at most one CTA an
  # SM under auto: the d128 cases again with it forced at every call.
  TILEATTN_TEST_DEVICES=cuda TILEATTN_DECODE_FAMILY=sm90 TILEATTN_DECODE_RING=wide timeout 120 $PYTEST \
    tests/python/test_kvcache.py tests/python/test_kvcache_cuda_graph.py 2>&1 | tee "$LOGS/pytest_decode_wide.log" | tail -2 || failed pytest_decode_wide
  TILEATTN_DECODE_FAMILY=sm90 TILEATTN_DECODE_RING=wide timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 \
    python3 tests/cuda/sanitize_decode.py > "$LOGS/sanitize_decode_wide.log" 2>&1 || failed sanitize_decode_wide
  tail -2 "$LOGS/sanitize_decode_wide.log"
  # The three-CTA ring (d128, at most 8 rows a CTA) serves only grids the other rings leave uneven
  # under auto: the d128 cases again with it forced.
  TILEATTN_TEST_DEVICES=cuda TILEATTN_DECODE_FAMILY=sm90 TILEATTN_DECODE_RING=three timeout 120 $PYTEST \
    tests/python/test_kvcache.py tests/python/test_kvcache_cuda_graph.py 2>&1 | tee "$LOGS/pytest_decode_three.log" | tail -2 || failed pytest_decode_three
  TILEATTN_DECODE_FAMILY=sm90 TILEATTN_DECODE_RING=three timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 \
    python3 tests/cuda/sanitize_decode.py > "$LOGS/sanitize_decode_three.log" 2>&1 || failed sanitize_decode_three
  tail -2 "$LOGS/sanitize_decode_three.log"
  TILEATTN_TEST_DEVICES=cuda TILEATTN_DECODE_FAMILY=sm80 timeout 120 $PYTEST \
    tests/python/test_kvcache.py tests/python/test_kvcache_cuda_graph.py 2>&1 | tee "$LOGS/pytest_decode_registers.log" | tail -2 || failed pytest_decode_registers
  TILEATTN_DECODE_FAMILY=sm80 timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 \
    python3 tests/cuda/sanitize_decode.py > "$LOGS/sanitize_decode_registers.log" 2>&1 || failed sanitize_decode_registers
  tail -2 "$LOGS/sanitize_decode_registers.log"
fi
if [[ $WHAT == all || $WHAT == bench ]]; then
  # The benchmark CLI (bench/__init__.py); one PNG (forward) keeps $OUT within the 8 files that
  # come back from the device.
  # The backward is measured atomic and deterministic (tileattn-deterministic); tileattn@sm80
  # runs both directions on the sm80 family.  fwdbwd (the training step) costs no extra calls:
  # the backward is already timed as forward + backward minus forward.
  python3 -m bench sweep --shapes fa --direction fwd bwd fwdbwd \
    --backends tileattn tileattn@sm80 tileattn-deterministic sdpa-flash sdpa-cudnn \
    --plot fwd --out "$OUT/sweep.csv" 2>&1 | tee "$OUT/sweep.log" | tail -40
fi
tar czf "$OUT/suite-logs.tgz" -C "$LOGS" .
exit $rc
