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

python3 -m pip install -q --disable-pip-version-check --no-build-isolation .
python3 -m pytest tests/python
