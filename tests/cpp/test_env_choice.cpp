// env_choice (src/common/env_choice.h) reads every kernel-choice variable: unset or empty is the
// default, each listed value its index, anything else an error naming the variable.
#include <gtest/gtest.h>

#include <cstdlib>

#include "common/env_choice.h"

namespace {

constexpr const char* kVariable = "TILEATTN_TEST_ENV_CHOICE";

TEST(EnvChoice, UnsetOrEmptyIsTheDefault) {
  unsetenv(kVariable);
  EXPECT_EQ(tileattn::env_choice(kVariable, {"auto", "on", "off"}), 0);
  setenv(kVariable, "", 1);
  EXPECT_EQ(tileattn::env_choice(kVariable, {"auto", "on", "off"}), 0);
  unsetenv(kVariable);
}

TEST(EnvChoice, EachValueIsItsIndex) {
  setenv(kVariable, "auto", 1);
  EXPECT_EQ(tileattn::env_choice(kVariable, {"auto", "on", "off"}), 0);
  setenv(kVariable, "on", 1);
  EXPECT_EQ(tileattn::env_choice(kVariable, {"auto", "on", "off"}), 1);
  setenv(kVariable, "off", 1);
  EXPECT_EQ(tileattn::env_choice(kVariable, {"auto", "on", "off"}), 2);
  setenv(kVariable, "1", 1);
  EXPECT_EQ(tileattn::env_choice(kVariable, {"auto", "0", "1"}), 2);
  unsetenv(kVariable);
}

TEST(EnvChoice, AnythingElseNamesTheVariableAndTheChoices) {
  for (const char* typo : {"yes", "ON", "auto ", "sm91"}) {
    setenv(kVariable, typo, 1);
    try {
      tileattn::env_choice(kVariable, {"auto", "sm90", "sm80"});
      ADD_FAILURE() << typo << " was accepted";
    } catch (const tileattn::Error& e) {
      EXPECT_EQ(e.code(), tileattn::ErrorCode::kInvalidArgument);
      EXPECT_EQ(e.argument(), kVariable);
      EXPECT_EQ(std::string(e.what()), std::string(kVariable) + " must be auto, sm90 or sm80, got '" + typo + "'");
    }
  }
  unsetenv(kVariable);
}

}  // namespace
