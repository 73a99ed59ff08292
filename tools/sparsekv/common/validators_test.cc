#include "tools/sparsekv/common/validators.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace sparsekv::tools {
namespace {

// What CLI11 prints for `--opt VALUE` checked by `check`, or "" if accepted.
std::string Parse(const CLI::Validator& check, const std::string& value) {
  CLI::App app;
  std::string target;
  app.add_option("--opt", target)->check(check);
  try {
    app.parse(std::vector<std::string>{value, "--opt"});  // CLI11 reads the vector backwards
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "";
}

TEST(ValidatorsTest, BetweenSaysTheRange) {
  EXPECT_EQ(Parse(Between<int64_t>(1, 1000), "1"), "");
  EXPECT_EQ(Parse(Between<int64_t>(1, 1000), "1000"), "");
  EXPECT_EQ(Parse(Between<int64_t>(1, 1000), "0"), "--opt: must be in [1, 1000] (got 0)");
  EXPECT_EQ(Parse(Between<int64_t>(1, 1000), "1.5"), "--opt: must be a whole number (got '1.5')");
  EXPECT_EQ(Parse(Fraction(), "0.5"), "");
  EXPECT_EQ(Parse(Fraction(), "1.5"), "--opt: must be in [0, 1] (got 1.5)");
  EXPECT_EQ(Parse(Fraction(), "nan"), "--opt: must be in [0, 1] (got nan)");
}

TEST(ValidatorsTest, AtLeastAndPositiveSayTheBound) {
  EXPECT_EQ(Parse(AtLeast<int64_t>(1), "7"), "");
  EXPECT_EQ(Parse(AtLeast<int64_t>(1), "0"), "--opt: must be >= 1 (got 0)");
  EXPECT_EQ(Parse(AtLeast(0.0), "-0.5"), "--opt: must be >= 0 (got -0.5)");
  EXPECT_EQ(Parse(AtLeast(0.0), "x"), "--opt: must be a number (got 'x')");
  EXPECT_EQ(Parse(PositiveReal(), "0.1"), "");
  EXPECT_EQ(Parse(PositiveReal(), "0"), "--opt: must be a number > 0 (got 0)");
  EXPECT_EQ(Parse(PositiveReal(), "inf"), "--opt: must be a number > 0 (got inf)");
}

// A whole number beyond the field's type says the type's range, not "Could not convert".
TEST(ValidatorsTest, AWholeNumberBeyondTheTypeSaysItsRange) {
  EXPECT_EQ(Parse(AtLeast<int32_t>(1), "2147483647"), "");
  EXPECT_EQ(Parse(AtLeast<int32_t>(1), "99999999999"),
            "--opt: must be in [1, 2147483647] (got 99999999999)");
  EXPECT_EQ(Parse(AtLeast<int32_t>(0), "-99999999999"),
            "--opt: must be in [0, 2147483647] (got -99999999999)");
  EXPECT_EQ(Parse(Between<int64_t>(1, 1000), "99999999999999999999"),
            "--opt: must be in [1, 1000] (got 99999999999999999999)");
  EXPECT_EQ(Parse(AtLeast<int32_t>(1), "9x"), "--opt: must be a whole number (got '9x')");
}

TEST(ValidatorsTest, UnsignedRefusesASign) {
  EXPECT_EQ(Parse(Unsigned(), "0"), "");
  EXPECT_EQ(Parse(Unsigned(), "18446744073709551615"), "");
  EXPECT_EQ(Parse(Unsigned(), "-1"), "--opt: must be a whole number in [0, 2^64) (got '-1')");
  EXPECT_NE(Parse(Unsigned(), "18446744073709551616"), "");
  EXPECT_NE(Parse(Unsigned(), "+3"), "");
}

TEST(ValidatorsTest, NonEmptyRefusesAnEmptyString) {
  EXPECT_EQ(Parse(NonEmpty(), "a"), "");
  EXPECT_EQ(Parse(NonEmpty(), ""), "--opt: must not be empty");
}

}  // namespace
}  // namespace sparsekv::tools
