#!/usr/bin/env bash
# The benchmark CLI's device calls, one command each (results to $OUT, packed into one tarball
# because the device tool returns at most 8 files).
#   bash bench/run_on_device.sh smoke   every subcommand at tiny sizes, the FA1 kernel's tests, ncu
#   bash bench/run_on_device.sh full    what fit this session's share: forward sweeps, the mask-split
#                                       pair, memory, varlen (profile came from the smoke run)
#   bash bench/run_on_device.sh complete  every sweep at full size, forward and backward (under 10 device minutes)
# Libraries: build-bench/carry/{final,maskall}.so.xz (xz keeps the carried tree under 64 MiB),
# or TILEATTN_LIBRARY / MASKALL_LIBRARY pointing at .so files.
set -u -o pipefail
MODE=${1:-smoke}
OUT=${OUT:-bench-out}
RES=$OUT/results
mkdir -p "$RES"
for name in final maskall; do
  if [[ -f build-bench/carry/$name.so.xz && ! -f build-bench/carry/$name.so ]]; then
    python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
      build-bench/carry/$name.so.xz build-bench/carry/$name.so
  fi
done
export TILEATTN_LIBRARY=${TILEATTN_LIBRARY:-$PWD/build-bench/carry/final.so}
MASKALL_LIBRARY=${MASKALL_LIBRARY:-$PWD/build-bench/carry/maskall.so}
export PYTHONPATH=$PWD/python:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=$PWD/build-bench/triton-cache
export TILEATTN_COMMIT=${TILEATTN_COMMIT:-commit}  # the coordinator fills in the commit
DAY=$(date +%F)
B="python3 -m bench"
step() { echo "=== $* ($(date +%T))"; }
{
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
python3 -c "import tqdm, matplotlib; print('tqdm', tqdm.__version__, 'matplotlib', matplotlib.__version__)"
if [[ $MODE == smoke ]]; then
  step pytest; python3 -m pytest -q -p no:cacheprovider bench/tests -k "bfloat16 or bad_input" 2>&1 | tail -3
  step sweep; $B sweep --shapes lecture fa --seqlens 512 --headdims 64 256 --direction fwd bwd fwdbwd \
    --runs 3 --warmup 1 --out "$RES/smoke-sweep.csv"
  step fa1 speed; $B sweep --shapes lecture fa --seqlens 16384 --headdims 128 --causal no --runs 1 --warmup 0 \
    --backends fa1-triton fa1-triton-seqpar tileattn sdpa-math --max-case-s 20 --out "$RES/smoke-fa1.csv" --plot none
  step maskall; TILEATTN_LIBRARY=$MASKALL_LIBRARY $B sweep --shapes lecture --seqlens 512 4096 --headdims 128 \
    --backends tileattn --runs 3 --warmup 1 --out "$RES/smoke-maskall.csv" --plot none
  step memory; $B memory --seqlens 1024 4096 --out "$RES/smoke-memory.md"
  step varlen; $B varlen --sequences 6 --runs 3 --warmup 1 --out "$RES/smoke-varlen.md"
  step profile; timeout 240 $B profile --out "$RES/profile-h200-$DAY.md"
  step readme; cp README.md "$RES/README-smoke.md"
  $B readme --csv "$RES/smoke-sweep.csv" --readme "$RES/README-smoke.md" && grep -A12 "bench:begin" "$RES/README-smoke.md"
fi
if [[ $MODE == full ]]; then
  # Sized to the session's device share (about 80 s of running): deadlines stop a sweep between
  # cases, --max-case-s skips a (case, backend) whose 30 calls would take longer; both are logged.
  step sweep lecture fwd; timeout 40 $B sweep --shapes lecture --direction fwd --max-case-s 0.6 --deadline-s 30 \
    --out "$RES/lecture-sweep-h200-$DAY.csv"
  step sweep fa fwd; timeout 14 $B sweep --shapes fa --direction fwd --backends tileattn sdpa-flash sdpa-cudnn \
    --max-case-s 0.6 --deadline-s 7 --out "$RES/fa-sweep-h200-$DAY.csv"
  for lib in final maskall; do
    step mask split $lib; TILEATTN_LIBRARY=$PWD/build-bench/carry/$lib.so timeout 10 $B sweep --shapes lecture \
      --headdims 128 --backends tileattn --deadline-s 4 --plot none --out "$RES/masksplit-$lib-h200-$DAY.csv"
  done
  step memory; timeout 14 $B memory --out "$RES/memory-h200-$DAY.md"
  step varlen; timeout 14 $B varlen --out "$RES/varlen-h200-$DAY.md"
fi
if [[ $MODE == complete ]]; then
  # Every sweep at full size in one device call of under 10 minutes.  --deadline-s stops a sweep
  # between cases (the rows so far stay in the CSV, and the log says where it stopped);
  # --max-case-s skips a (case, backend) whose calls would take longer (FA1's grid at 8k-16k,
  # SDPA math at 16k).  The FA papers' shapes go first: they are the ones the README quotes.
  step sweep fwd; timeout 250 $B sweep --shapes fa lecture --direction fwd --max-case-s 3 --deadline-s 210 \
    --out "$RES/sweep-fwd-h200-$DAY.csv"
  step sweep bwd fwdbwd; timeout 250 $B sweep --shapes fa lecture --direction bwd fwdbwd --max-case-s 3 \
    --deadline-s 210 --backends tileattn tileattn-deterministic sdpa-flash sdpa-cudnn sdpa-efficient \
    --out "$RES/sweep-bwd-h200-$DAY.csv"
  step profile; timeout 60 $B profile --out "$RES/profile-h200-$DAY.md"
fi
step done
} 2>&1 | tee "$OUT/log.txt"
tar -czf "$OUT/results.tar.gz" -C "$OUT" results log.txt
rm -rf "$RES"
