# Sourced by scripts/fwd_trace/build.sh and scripts/decode_trace/build.sh: objects of the CUDA build
# ($build) compiled from a copy of the sources with a measurement patch applied, each with
# build.ninja's own command line, so the traced kernels differ from the shipped ones only by the
# patch.
#   trace_sources PATCH           sets $work, a temporary folder (removed at exit) holding src/ and
#                                 include/ with PATCH applied
#   trace_compile OBJECT [FLAGS]  compiles the build's OBJECT (a file name, e.g. decode_bf16.cu.o)
#                                 from $work's sources into $work/OBJECT, with FLAGS added
trace_sources() {
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  cp -r src include "$work/"
  (cd "$work" && git apply "$OLDPWD/$1")
}

trace_compile() {
  local object=$1 flags=${2:-} root compile
  root=$(pwd)
  compile=$(cd "$build" && ninja -t commands src/libtileattn.so | grep -m1 -- "-o [^ ]*/$object")
  compile=${compile#/usr/bin/ccache }
  compile=${compile//-I$root\/include/-I$work\/include}
  compile=${compile//-I$root\/src /-I$work\/src }
  compile=${compile//$root\/src\//$work\/src\/}  # a source file under src/ (generated ones live in the build)
  # The object goes to $work; no depfile, which would overwrite the build's own.
  compile=$(sed -E "s@-o [^ ]*/$object@-o $work/$object $flags@; s@ -MD -MT [^ ]+ -MF [^ ]+@@" <<< "$compile")
  (cd "$build" && eval "$compile")
}
