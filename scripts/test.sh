#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds the C++ library and its GoogleTest suite
# (CPU backend; set TILEATTN_CUDA=ON to compile the CUDA backend too), runs it through CTest, then
# installs the Python package and runs the pytest suite (CPU always, CUDA when a GPU is present).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install_deps.sh

build_dir=${TILEATTN_BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja -DTILEATTN_CUDA="${TILEATTN_CUDA:-OFF}" -DTILEATTN_BUILD_TESTS=ON
cmake --build "$build_dir" -j "$(nproc)"
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)"

# Where nvcc exists (CI included), compile every CUDA kernel for sm80 and sm90 at d64 and d128
# (d128: the buckets of two consumer warpgroups, the only ones with the K/V-multicast forward),
# so CUDA code that does not compile cannot land.  No GPU is needed; the GPU suite itself is
# scripts/gpu_suite.sh, run on a GPU machine.
if command -v nvcc >/dev/null && [ "${TILEATTN_SKIP_CUDA_COMPILE:-0}" != 1 ]; then
  cmake -S . -B "$build_dir-cuda" -G Ninja -DTILEATTN_CUDA=ON -DTILEATTN_BUILD_TESTS=OFF \
    -DTILEATTN_CUDA_ARCHS="80;90" -DTILEATTN_CUDA_HEADDIMS="64;128" -DTILEATTN_CUDA_DTYPES=bf16
  cmake --build "$build_dir-cuda" -j "$(nproc)"
fi

python3 -m pip install -q --disable-pip-version-check --no-build-isolation .
python3 -m pytest tests/python
# On a CPU with AMX-BF16 and AVX-512 the run above took bf16 products on AMX and float32 ones on
# AVX-512 (test_cpu_simd.py runs AVX2's too); OpenBLAS's sgemm, the path of CPUs with none of them,
# gets the core numeric files again, on the CPU only (~30 s).
TILEATTN_CPU_AMX=off TILEATTN_CPU_SIMD=off TILEATTN_TEST_DEVICES=cpu python3 -m pytest -q tests/python/test_attention.py tests/python/test_varlen.py \
  tests/python/test_varlen_paged.py tests/python/test_kvcache.py tests/python/test_random_configs.py
# The benchmark CLI's own tests (CPU: dry runs, the FA1 Triton kernel in Triton's interpreter), in a
# separate run: both folders' tests import their own `conftest`.
python3 -m pytest -q bench/tests
