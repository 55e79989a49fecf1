// Which sm90 forward kernels test a left edge in their masks.  Only calls with a left window
// (window_left >= 0: local attention) have one; causal masks, right windows and the seqlen_k edge
// hide only the columns past a row's last visible one, which takes one compare a score instead of
// two (mask_policy.h; session 43: causal d128 512 +2.6%, d64 512 +2.2% back to back on the H200,
// where at the power cap a call's instructions are its clock).  To keep the kernel count, the
// transformed-score and dropout kernels serve every call and keep both edges; the plain-score
// kernel without dropout, the one the common calls run, has a twin for left windows
// (LeftWindowTraits, chosen by run_fwd_sm90), and the short-walk kernel never serves a left window.
// The K/V-multicast kernel (cluster_sm90.h) keeps both edges too, though it serves no left window
// either: it runs the non-causal calls, whose blocks are unmasked, yet with the one-compare mask
// non-causal d128 512 ran 3% slower in the A/B (ptxas reordered the code around the masked branch;
// session 44, perf log), for +1% at causal d128 8k, its only causal calls being long ones.
#pragma once

namespace tileattn::cuda::sm90 {

template <typename Base>
struct LeftWindowTraits : Base {
  static constexpr bool kLeftWindow = true;
};

template <typename Traits, typename ScorePolicy, typename DropoutPolicy>
constexpr bool masks_left_edge() {
  return Traits::kLeftWindow || Traits::kClusterSize > 1 || ScorePolicy::kTransforms || DropoutPolicy::kEnabled;
}

}  // namespace tileattn::cuda::sm90
