#!/usr/bin/env bash
# Proof that one libtileattn build serves every torch: build the wheel once, then install that same
# wheel into one plain virtual environment per torch version and run the CPU half of the Python
# suite there.  The library never links libtorch, so nothing is rebuilt between versions.
#
#   scripts/check_torch_versions.sh                 # torch 2.4.1 and 2.11.0
#   scripts/check_torch_versions.sh 2.5.1 2.11.0    # any versions pip can install here
#
# Environment:
#   TILEATTN_VENV_ROOT  where the venvs live (kept between runs; default /tmp/tileattn-torch-venvs)
#   PYTHON              the interpreter the venvs are made from (default python3)
#   PYTEST_ARGS         extra pytest arguments (default: -q)
#
# Each venv downloads a full torch (several GB with its CUDA libraries): plain venvs, not
# --system-site-packages, so the torch under test is the only one importable.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
versions=("$@")
if [ ${#versions[@]} -eq 0 ]; then versions=(2.4.1 2.11.0); fi
venv_root="${TILEATTN_VENV_ROOT:-/tmp/tileattn-torch-venvs}"
python="${PYTHON:-python3}"
wheel_dir="$(mktemp -d)"
trap 'rm -rf "$wheel_dir"' EXIT

echo "== building the tileattn wheel once (CPU backend)"
"$python" -m pip wheel --no-deps --no-build-isolation -w "$wheel_dir" "$repo" >"$wheel_dir/build.log" 2>&1 ||
  { tail -n 40 "$wheel_dir/build.log"; exit 1; }
wheel="$(ls "$wheel_dir"/tileattn-*.whl)"
echo "   $(basename "$wheel")  sha256 $(sha256sum "$wheel" | cut -c1-16)"

declare -A result
for version in "${versions[@]}"; do
  venv="$venv_root/torch-$version"
  echo "== torch $version in $venv"
  if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
  fi
  installed="$("$venv/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)"
  if [ "$installed" != "$version" ]; then
    "$venv/bin/python" -m pip install -q "torch==$version" numpy pytest
  fi
  "$venv/bin/python" -m pip install -q --force-reinstall --no-deps "$wheel"
  # Run from outside the source tree so the installed package (and its bundled library) is used.
  set +e
  (cd "$venv" && TILEATTN_LIBRARY= TILEATTN_TEST_DEVICES=cpu "$venv/bin/python" -m pytest \
     -p no:cacheprovider ${PYTEST_ARGS:--q} "$repo/tests/python")
  rc=$?
  set -e
  if [ $rc -eq 0 ]; then result[$version]=passed; else result[$version]="FAILED (pytest exit $rc)"; fi
done

echo "== summary (one wheel: $(basename "$wheel"))"
status=0
for version in "${versions[@]}"; do
  echo "   torch $version: ${result[$version]}"
  [ "${result[$version]}" = passed ] || status=1
done
exit $status
