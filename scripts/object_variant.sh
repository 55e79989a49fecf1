#!/usr/bin/env bash
# Builds a library for an A/B or a measurement in which a few objects of the CUDA build are
# compiled from a patched copy of the sources, the rest taken from BUILD_DIR (default build-final2)
# as they are: ~1 min for the d128 bf16 sm90 forward unit, against ~6 min for build_variant.sh's
# worktree build and ~3 min for ninja rebuilding the six sm90 forward units a shared header
# touches.  Each object is compiled with build.ninja's own command line, plus FLAGS, so the
# variant differs from the shipped kernels only by the patch (and can be a macro switched on in
# one unit).  Sessions 19-20 measured their sm90 forward variants this way; the trace builds
# (scripts/fwd_trace, scripts/decode_trace) use it too.
# Usage (repo root): [EXPORT_SYMBOL=name] bash scripts/object_variant.sh NAME PATCH "OBJECT..." ["FLAGS"]
#   e.g. bash scripts/object_variant.sh rs scratch/rs.patch fwd_sm90_bf16_hdim128.cu.o "-DTILEATTN_X=1"
#   -> scratch/carry/NAME.so.xz (gpu_suite.sh, gpu_ab.sh and unpack_library.sh take it as it is);
#      ptxas's messages of each object in /tmp/NAME.OBJECT.log (C75xx: wgmma serialized)
# EXPORT_SYMBOL: the link exports the patched archives' symbols (--exclude-libs hides every
# archive's otherwise) and checks that `name` is among them (a trace's reader).
# The patch must leave every other object's view of shared types unchanged (a field added to a
# struct the host side also builds needs those objects in the list too).
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1 patch=$2 objects=$3 flags=${4:-}
build=${BUILD_DIR:-build-final2}
root=$(pwd)
[[ -f $build/build.ninja ]] || { echo "object_variant: build $build first" >&2; exit 1; }
commands=$(cd "$build" && ninja -t commands src/libtileattn.so)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r src include "$work/"
(cd "$work" && git apply "$root/$patch")

declare -A patched  # the build's archive -> its copy holding the patched objects
for object in $objects; do
  compile=$(grep -m1 -- "-o [^ ]*/$object" <<< "$commands")
  compile=${compile#/usr/bin/ccache }
  compile=${compile//-I$root\/include/-I$work\/include}
  compile=${compile//-I$root\/src /-I$work\/src }
  compile=${compile//$root\/src\//$work\/src\/}  # a source file under src/ (generated ones live in the build)
  # The object goes to $work; no depfile, which would overwrite the build's own.
  compile=$(sed -E "s@-o [^ ]*/$object@-o $work/$object $flags@; s@ -MD -MT [^ ]+ -MF [^ ]+@@" <<< "$compile")
  (cd "$build" && eval "$compile") 2> "/tmp/$name.$object.log" || { cat "/tmp/$name.$object.log" >&2; exit 1; }
  grep -h "C75[0-9][0-9]" "/tmp/$name.$object.log" | head -3 >&2 || true
  archive=""
  for candidate in "$build"/src/cuda/*.a; do
    if ar t "$candidate" | grep -qx "$object"; then archive=${candidate#"$build"/}; fi
  done
  [[ -n $archive ]] || { echo "object_variant: $object is in no archive of $build/src/cuda" >&2; exit 1; }
  copy=$work/$(basename "$archive")
  [[ -f $copy ]] || cp "$build/$archive" "$copy"
  patched[$archive]=$copy
  ar r "$copy" "$work/$object"
done

link=$(tail -1 <<< "$commands")
for archive in "${!patched[@]}"; do link=${link//$archive/${patched[$archive]}}; done
link=${link//-o src\/libtileattn.so/-o $work\/libtileattn.so}
if [[ -n ${EXPORT_SYMBOL:-} ]]; then
  hidden=$(tr ' ' '\n' <<< "$link" | grep '\.a$' | grep -v "^$work/" | xargs -n1 basename | paste -sd:)
  link=${link//--exclude-libs,ALL/--exclude-libs,$hidden}
fi
(cd "$build" && eval "$link")
if [[ -n ${EXPORT_SYMBOL:-} ]]; then
  nm -D "$work/libtileattn.so" | grep -qw "$EXPORT_SYMBOL" || { echo "object_variant: $EXPORT_SYMBOL not exported" >&2; exit 1; }
fi
mkdir -p scratch/carry
xz -T2 -6 -c "$work/libtileattn.so" > "scratch/carry/$name.so.xz"
ls -l "scratch/carry/$name.so.xz"
