// The softmax scale a call runs with (tileattn.h: 0 means 1/sqrt(head_dim)), for validation and
// dispatch alike.
#pragma once

#include <cmath>

#include "tileattn/tileattn.hpp"

namespace tileattn {

inline float resolved_softmax_scale(const ForwardParams& p) {
  return p.softmax_scale != 0.0f ? p.softmax_scale : 1.0f / std::sqrt(static_cast<float>(p.head_dim));
}

}  // namespace tileattn
