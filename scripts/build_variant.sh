#!/usr/bin/env bash
# Builds the library of another revision (a branch, a commit, or the working tree of a worktree)
# for an A/B against this checkout's, without a full rebuild: the revision is checked out as a
# git worktree in ${TILEATTN_VARIANTS:-$(dirname repo)/variants}/NAME and configured like BUILD_DIR
# (default build-final2), and ccache, with base_dir set to the folder both trees live in, hashes
# their sources by relative path, so translation units the change leaves alone can be cache hits
# (session 13: a change to the warp-specialized backward rebuilt 4 of 39 units, 6 min instead of
# the full build's 31; but a worktree of an unchanged HEAD missed on all 12 sm_90a units and took
# 6.5 min, cause not found).  The library is then packed with xz into scratch/carry/NAME.so.xz (a full
# build is ~66 MB, over the GPU machine's 64 MiB carry limit), which gpu_ab.sh and gpu_suite.sh
# take as they are.
# Usage (repo root): bash scripts/build_variant.sh NAME [REV]   (REV default: NAME as a branch;
#   with an existing worktree of that name its working tree is built as it stands)
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1
rev=${2:-$1}
build=${BUILD_DIR:-build-final2}
root=$(realpath ..)
variants=${TILEATTN_VARIANTS:-$root/variants}
tree=$variants/$name
[[ -f $build/CMakeCache.txt ]] || { echo "build_variant: configure and build $build first" >&2; exit 1; }
command -v ccache >/dev/null || { echo "build_variant: needs ccache (scripts/install_deps.sh)" >&2; exit 1; }
# ccache rewrites absolute paths under base_dir to relative ones before hashing.  Written to
# ccache's own configuration, not the environment: the entries this checkout's later builds store
# must be hashed the same way for a variant to find them.
ccache -o base_dir="$root" -o compiler_check=content
[[ -d $tree ]] || git worktree add --detach "$tree" "$rev"
# The same cache entries: every -D of this build's cache that the project defines.
mapfile -t defines < <(grep -E '^(TILEATTN_[A-Z0-9_]+|CMAKE_BUILD_TYPE):' "$build/CMakeCache.txt" | sed -E 's/^([^:]+):[^=]*=(.*)$/-D\1=\2/')
cmake -S "$tree" -B "$tree/$build" -G Ninja "${defines[@]}" >/dev/null
cmake --build "$tree/$build" -j "$(nproc)"
mkdir -p scratch/carry
python3 -c "import lzma, sys; open(sys.argv[2], 'wb').write(lzma.compress(open(sys.argv[1], 'rb').read(), preset=1))" \
  "$tree/$build/src/libtileattn.so" "scratch/carry/$name.so.xz"
ls -l "scratch/carry/$name.so.xz"
