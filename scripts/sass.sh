#!/usr/bin/env bash
# The SASS of the kernels in an object file or libtileattn.so, to read a kernel's instructions
# without a GPU (how the Philox multiplies' extra adds were found, docs/perf-log.md).  The CUDA
# toolkit here has nvcc and ptxas but no cuobjdump; PyPI's nvidia-cuda-cuobjdump and
# nvidia-cuda-nvdisasm wheels have them (13.5.37, the oldest CUDA 13 release PyPI has for both
# on 2026-11-30; it reads nvcc 13.0's cubins), fetched once into ~/.cache/tileattn-tools.
# Usage: bash scripts/sass.sh FILE [FUNCTION-REGEX]
#   with a regex, only the functions whose mangled names match it, e.g.
#   bash scripts/sass.sh build-cuda/src/libtileattn.so 'bwd_ws_kernel.*ILi64'
set -euo pipefail
file=$1
pattern=${2:-}
tools=${TILEATTN_TOOLS_DIR:-$HOME/.cache/tileattn-tools}
cuobjdump=$tools/nvidia/cu13/bin/cuobjdump
if [[ ! -x $cuobjdump ]]; then
  mkdir -p "$tools"
  for package in cuobjdump nvdisasm; do
    python3 -m pip download --quiet --no-deps --dest "$tools" "nvidia-cuda-$package==13.5.37" >&2
    python3 -m zipfile -e "$(ls "$tools"/nvidia_cuda_${package}-*.whl | head -1)" "$tools"
    chmod +x "$tools/nvidia/cu13/bin/$package"
  done
fi
export PATH=$tools/nvidia/cu13/bin:$PATH  # cuobjdump runs nvdisasm to print SASS
if [[ -z $pattern ]]; then
  "$cuobjdump" -sass "$file"
else
  # Each function's listing starts at a "Function : NAME" line; keep the matching ones.
  "$cuobjdump" -sass "$file" | awk -v re="$pattern" '/Function :/ { keep = ($0 ~ re) } keep'
fi
