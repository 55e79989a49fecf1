#!/usr/bin/env bash
# Builds a library for an A/B in which a few objects of the CUDA build are compiled from a patched
# copy of the sources, the rest taken from BUILD_DIR (default build-final2) as they are: ~1 min for
# the d128 bf16 sm90 forward unit, against ~6 min for build_variant.sh's worktree build and
# ~3 min for ninja rebuilding the six sm90 forward units a shared header touches.  Each object is
# compiled with build.ninja's own command line (scripts/trace_build_lib.sh), plus FLAGS, so a
# variant can also be a macro switched on in one unit.  Sessions 19-20 measured their sm90 forward
# variants this way (poly-exp2, the rescale threshold, the row sums on the tensor core).
# Usage (repo root): bash scripts/object_variant.sh NAME PATCH "OBJECT..." ["FLAGS"]
#   e.g. bash scripts/object_variant.sh rs scratch/rs.patch fwd_sm90_bf16_hdim128.cu.o "-DTILEATTN_X=1"
#   -> scratch/carry/NAME.so.xz (gpu_suite.sh, gpu_ab.sh and unpack_library.sh take it as it is);
#      ptxas's messages of each object in /tmp/NAME.OBJECT.log (look for C75xx: wgmma serialized)
# The patch must leave every other object's view of shared types unchanged (a field added to a
# struct the host side also builds needs those objects in the list too).
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1 patch=$2 objects=$3 flags=${4:-}
build=${BUILD_DIR:-build-final2}
[[ -f $build/build.ninja ]] || { echo "object_variant: build $build first" >&2; exit 1; }
source scripts/trace_build_lib.sh
trace_sources "$patch"
declare -A archive_copy
for object in $objects; do
  trace_compile "$object" "$flags" 2> "/tmp/$name.$object.log" || { cat "/tmp/$name.$object.log" >&2; exit 1; }
  grep -h "C75[0-9][0-9]" "/tmp/$name.$object.log" | head -3 >&2 || true
  archive=""
  for candidate in "$build"/src/cuda/*.a; do
    if ar t "$candidate" | grep -qx "$object"; then archive=$candidate; fi
  done
  [[ -n $archive ]] || { echo "object_variant: $object is in no archive of $build/src/cuda" >&2; exit 1; }
  copy=$work/$(basename "$archive")
  [[ -f $copy ]] || cp "$archive" "$copy"
  archive_copy[$archive]=$copy
  ar r "$copy" "$work/$object"
done
link=$(cd "$build" && ninja -t commands src/libtileattn.so | tail -1)
for archive in "${!archive_copy[@]}"; do
  relative=${archive#"$build"/}
  link=${link//$relative/${archive_copy[$archive]}}
done
link=${link//-o src\/libtileattn.so/-o $work\/libtileattn.so}
(cd "$build" && eval "$link")
mkdir -p scratch/carry
xz -T2 -6 -c "$work/libtileattn.so" > "scratch/carry/$name.so.xz"
ls -l "scratch/carry/$name.so.xz"
