#!/usr/bin/env bash
# A/B of decode builds (libtileattn.so or .so.xz, e.g. from object_variant.sh) in one device call:
# the decode tests on the last build with each streaming loop forced, then bench/gpu/decode.py on
# every build in turn, AB_RUNS rounds (default 2), each build's layouts graph-timed and
# interleaved.  Single runs of one build differ by 1-3% at batch 1 (session 21), so a change is
# judged by whether both of its runs beat both of the other's.
# Usage (repo root, on the GPU machine): bash scripts/decode_ab.sh NAME=LIB [NAME=LIB ...]
#   env BATCHES (default "1 8 32"), LENGTHS (default "2048 8192 32768"),
#   LAYOUTS (default "contiguous page16 page256"); CSVs and logs under ${OUT:-decode-ab-out}.
set -u -o pipefail
source "$(dirname "$0")/unpack_library.sh"
OUT=${OUT:-decode-ab-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/python:$PWD/tests/python:$PWD/bench/gpu PYTHONUNBUFFERED=1
names=() libs=()
for arg in "$@"; do names+=("${arg%%=*}"); libs+=("$(unpack_library "${arg#*=}")"); done
last=${libs[-1]}
for family in sm90 sm80; do
  echo "decode tests, ${names[-1]}, TILEATTN_DECODE_FAMILY=$family:"
  TILEATTN_LIBRARY=$last TILEATTN_DECODE_FAMILY=$family TILEATTN_TEST_DEVICES=cuda timeout 200 \
    python3 -m pytest -q -p no:cacheprovider tests/python/test_kvcache.py tests/python/test_kvcache_cuda_graph.py \
    2>&1 | tail -1
done
for run in $(seq 1 "${AB_RUNS:-2}"); do
  for i in "${!names[@]}"; do
    log=$OUT/${names[$i]}-$run
    TILEATTN_LIBRARY=${libs[$i]} timeout 200 python3 bench/gpu/decode.py --batches ${BATCHES:-1 8 32} \
      --lengths ${LENGTHS:-2048 8192 32768} --layouts ${LAYOUTS:-contiguous page16 page256} --out "$log.csv" \
      > "$log.log" 2>&1 || echo "run failed: $log.log"
    echo "== ${names[$i]}, run $run"
    grep -v "^#" "$log.log" | grep -v Warn
  done
done
