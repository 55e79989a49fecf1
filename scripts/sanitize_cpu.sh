#!/usr/bin/env bash
# The CPU library and its C++ suite built with AddressSanitizer and UndefinedBehaviorSanitizer, then
# the C++ suite and the Python suite run against it (libasan/libubsan preloaded into python, leak
# checks off: torch's allocations are not ours).  Any report stops the run.  ~10 min on 2 cores.
# Session 52's first run found two undefined behaviours, both fixed: an out-of-range dtype code
# loaded as the enum (validate.cpp) and a NaN score converted to int in the CPU's exp2.
# Usage (repo root): bash scripts/sanitize_cpu.sh [build dir, default build-sanitize]
set -eu -o pipefail
dir=${1:-build-sanitize}
flags="-fsanitize=address,undefined -fno-omit-frame-pointer"
cmake -S . -B "$dir" -G Ninja -DTILEATTN_CUDA=OFF -DTILEATTN_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" > /dev/null
cmake --build "$dir" -j "$(nproc)"
export ASAN_OPTIONS=detect_leaks=0:halt_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
"$dir/tests/cpp/tileattn_tests" --gtest_brief=1
LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)" \
  PYTHONPATH="$PWD/python" TILEATTN_LIBRARY="$(realpath "$dir")/src/libtileattn.so" \
  python3 -m pytest -q -p no:cacheprovider --capture=sys tests/python  # fd 2 uncaptured: reports show
