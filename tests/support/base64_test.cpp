//===- tests/support/base64_test.cpp - base64 ------------------------------===//
#include "apc/support/base64.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

namespace apc {
namespace {

TEST(Base64, KnownVectors) {
  // RFC 4648, section 10.
  const char* cases[][2] = {{"", ""},
                            {"f", "Zg=="},
                            {"fo", "Zm8="},
                            {"foo", "Zm9v"},
                            {"foob", "Zm9vYg=="},
                            {"fooba", "Zm9vYmE="},
                            {"foobar", "Zm9vYmFy"}};
  for (const auto& c : cases) {
    EXPECT_EQ(base64Encode(c[0]), c[1]);
    auto d = base64Decode(c[1]);
    ASSERT_TRUE(d.ok()) << c[1];
    EXPECT_EQ(*d, c[0]);
  }
}

TEST(Base64, RoundTripsBinaryBytes) {
  std::mt19937 rng(7);
  for (size_t n : {1u, 2u, 3u, 255u, 256u, 1000u}) {
    std::string bytes(n, '\0');
    for (char& c : bytes) c = static_cast<char>(rng() & 0xff);
    auto d = base64Decode(base64Encode(bytes));
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(*d, bytes) << n;
  }
}

TEST(Base64, RejectsMalformedText) {
  for (const char* bad : {"Zm9", "Zm9v\n", "Zm=v", "Z===", "Zm9*", "=m9v", "Zg==Zg=="}) {
    auto d = base64Decode(bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_EQ(d.error().code(), ErrorCode::kParse);
  }
}

}  // namespace
}  // namespace apc
