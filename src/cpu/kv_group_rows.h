// The ordinary forward on calls of few query rows a sequence (a decode step, a few speculative
// tokens, through flash_attn_func or flash_attn_varlen_func): a KV group's query heads as rows of
// their KV head, K and V read in place once per group.
#pragma once

#include "tileattn/tileattn.hpp"

namespace tileattn::cpu {

// Whether p (validated, as cpu_forward takes it) runs as forward_kv_group_rows: at most
// kKvGroupMaxRows rows a KV group (the longest sequence's query rows x the group), and no option
// that tells a group's query heads apart beyond their q (ALiBi's slopes, dropout's masks) nor asks
// for the probabilities.
bool kv_group_rows_apply(const ForwardParams& p);

// cpu_forward's contract for such a p.
void forward_kv_group_rows(const ForwardParams& p);

}  // namespace tileattn::cpu
