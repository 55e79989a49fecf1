#!/usr/bin/env bash
# Sourced by gpu_suite.sh and gpu_ab.sh: `unpack_library PATH` prints a path to a libtileattn.so.
# A library ending in .xz (scripts/build_variant.sh packs them so: a full build is ~66 MB, over the
# GPU machine's 64 MiB carry limit, and ~8 MB compressed) is decompressed once into
# ${TILEATTN_UNPACK_DIR:-/tmp/tileattn-libs} with Python's lzma, which every machine here has.
unpack_library() {
  local lib=$1
  if [[ $lib != *.xz ]]; then
    realpath "$lib"
    return
  fi
  local dir=${TILEATTN_UNPACK_DIR:-/tmp/tileattn-libs}
  local out
  out="$dir/$(basename "$lib" .xz)"
  mkdir -p "$dir"
  if [[ ! -f $out || $lib -nt $out ]]; then
    python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
      "$lib" "$out.part" && mv "$out.part" "$out"
  fi
  realpath "$out"
}
