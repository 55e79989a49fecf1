#!/usr/bin/env bash
# The main job from a fresh clone: install what is needed, build and install the tileattn Python
# package (with the CUDA backend when nvcc and a GPU are both present), run examples/main_job.py.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
cuda=OFF
if command -v nvcc >/dev/null && command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  cuda=ON
fi
TILEATTN_CUDA=$cuda python3 -m pip install -q --disable-pip-version-check --no-build-isolation .
python3 examples/main_job.py "$@"
