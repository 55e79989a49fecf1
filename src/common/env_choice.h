// Kernel choices set by environment variables (TILEATTN_FORWARD_FAMILY, TILEATTN_FORWARD_KV_MULTICAST,
// TILEATTN_FORWARD_SHORT_WALK, TILEATTN_BACKWARD_WS, ...), read on every call so that one process
// (a test, a benchmark, an A/B) can switch kernels between calls.  Host only.
#pragma once

#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>

#include "tileattn/tileattn.hpp"

namespace tileattn {

// The index in `choices` of `variable`'s value; unset or empty means choices[0], the default.  Any
// other value raises an Error naming the variable: "<variable> must be a, b or c, got '<value>'".
inline int env_choice(const char* variable, std::initializer_list<const char*> choices) {
  const char* value = std::getenv(variable);
  if (value == nullptr || value[0] == '\0') return 0;
  const int count = static_cast<int>(choices.size());
  int index = 0;
  std::string listed;
  for (const char* choice : choices) {
    if (std::strcmp(value, choice) == 0) return index;
    if (index > 0) listed += index + 1 == count ? " or " : ", ";
    listed += choice;
    ++index;
  }
  throw Error(ErrorCode::kInvalidArgument, variable,
              std::string(variable) + " must be " + listed + ", got '" + value + "'");
}

}  // namespace tileattn
