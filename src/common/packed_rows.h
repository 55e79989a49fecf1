// Whether one sequence's packed query rows lie where the kernels may read them, for the forms that
// check only the rows of q (the KV-cache call's packed rows: decode/decode_args.h's query_slots,
// sm90/sequence_bounds_sm90.h's view of them on the route).
#pragma once

#include <stdint.h>

#include "common/host_device.h"

namespace tileattn {

// Whether rows [cu_seqlens[b], cu_seqlens[b + 1]) are in order, inside a tensor of total_rows rows
// and at most max_rows long (max_seqlen_q): validate.cpp's rule for cu_seqlens, which the kernels
// apply themselves because the array is never read on the host.  common/sequence.h's
// sequence_in_bounds writes the same rule out for q and k together: expressed through this helper
// it changed the FA2 backward's code (up to +720 SASS instructions a kernel, session 65).
TILEATTN_HOST_DEVICE bool packed_rows_in_bounds(const int32_t* cu_seqlens, int b, int64_t total_rows,
                                                int64_t max_rows) {
  const int64_t first = cu_seqlens[b], end = cu_seqlens[b + 1];
  return first >= 0 && end >= first && end <= total_rows && end - first <= max_rows;
}

}  // namespace tileattn
