//===- tests/support/strings_test.cpp - String helpers and Expected --------===//
#include <gtest/gtest.h>

#include "apc/support/error.h"
#include "apc/support/strings.h"

namespace apc {
namespace {

TEST(Strings, SplitKeepsEmptyPieces) {
  EXPECT_EQ(split("a,,b", ','), (std::vector<std::string>{"a", "", "b"}));
  EXPECT_EQ(split("", ','), (std::vector<std::string>{""}));
}

TEST(Strings, ParseIntRejectsGarbage) {
  EXPECT_EQ(parseInt(" 42 "), 42);
  EXPECT_EQ(parseInt("-7"), -7);
  EXPECT_FALSE(parseInt("4x").has_value());
  EXPECT_FALSE(parseInt("").has_value());
  EXPECT_FALSE(parseDouble("1.5e").has_value());
  EXPECT_DOUBLE_EQ(*parseDouble("2.5e3"), 2500.0);
}

TEST(Strings, HumanFormats) {
  EXPECT_EQ(withCommas(8030261248), "8,030,261,248");
  EXPECT_EQ(withCommas(-1000), "-1,000");
  EXPECT_EQ(withCommas(999), "999");
  EXPECT_EQ(humanBytes(1536), "1.50 KiB");
  EXPECT_EQ(humanBytes(12), "12 B");
}

Expected<int> half(int x) {
  if (x % 2) return invalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

Expected<int> quarter(int x) {
  APC_ASSIGN_OR_RETURN(int h, half(x));
  return half(h);
}

TEST(Expected, PropagatesErrors) {
  EXPECT_EQ(*quarter(8), 2);
  auto e = quarter(6);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().message(), "odd: 3");
  EXPECT_EQ(e.error().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace apc
