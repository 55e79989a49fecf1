// The ordinary forward when no sequence has more than one query row (a decode step through
// flash_attn_func or flash_attn_varlen_func): K and V read in place once per KV group.
#pragma once

#include "tileattn/tileattn.hpp"

namespace tileattn::cpu {

// Whether p (validated, as cpu_forward takes it) can run as forward_one_query_row: at most one
// query row a sequence, and no option that tells a KV group's query heads apart beyond their q
// (no left window, ALiBi or dropout) nor asks for the probabilities.
bool one_query_row_applies(const ForwardParams& p);

// cpu_forward's contract for such a p.
void forward_one_query_row(const ForwardParams& p);

}  // namespace tileattn::cpu
