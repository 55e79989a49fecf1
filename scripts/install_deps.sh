#!/usr/bin/env bash
# Installs what building and testing tileattn needs on a fresh Debian machine: the C++ toolchain
# with GoogleTest and OpenBLAS (the CPU backend's tile products) from apt, and the Python
# packages of requirements-dev.txt from PyPI.  Safe to run again: it skips what is present.
set -euo pipefail
cd "$(dirname "$0")/.."

apt_packages=(build-essential cmake ninja-build ccache libgtest-dev libopenblas-openmp-dev)
missing=()
for pkg in "${apt_packages[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install_deps: apt-get install ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

python3 -m pip install -q --disable-pip-version-check -r requirements-dev.txt
