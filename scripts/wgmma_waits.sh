#!/usr/bin/env bash
# Per kernel in an object file or libtileattn.so: its HGMMA instructions and its warpgroup waits
# (WARPGROUP.DEPBAR), from scripts/sass.sh.  ptxas serializes every wgmma of a kernel (a wait after
# each) when it cannot track the groups in flight across a branch, and does not always say so
# (perf log, session 12: the own-keys branch had a wait after each of its 32 HGMMAs and no C7515 or
# C7518 warning, and ran at 0.64x).  A kernel with about as many waits as HGMMAs is marked.
# Usage: bash scripts/wgmma_waits.sh FILE [FUNCTION-REGEX]
set -euo pipefail
bash "$(dirname "$0")/sass.sh" "$@" | awk '
  function report() {
    if (name == "") return
    flag = (hgmma > 0 && waits * 2 >= hgmma) ? "  SERIALIZED?" : ""
    printf "%5d HGMMA %5d waits  %s%s\n", hgmma, waits, name, flag
  }
  /Function :/ { report(); name = $3; hgmma = 0; waits = 0; next }
  /HGMMA/ { hgmma++ }
  /WARPGROUP\.DEPBAR/ { waits++ }
  END { report() }'
