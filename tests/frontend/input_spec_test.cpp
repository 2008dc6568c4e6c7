//===- tests/frontend/input_spec_test.cpp - --input parsing ----------------===//
#include <gtest/gtest.h>

#include "apc/frontend/input_spec.h"

namespace apc::frontend {
namespace {

TEST(InputSpec, ParsesStaticAndSymbolicDims) {
  auto s = parseInputSpec("tokens:i64[8,128]");
  ASSERT_TRUE(s.ok()) << s.error().message();
  EXPECT_EQ(s->name, "tokens");
  EXPECT_EQ(s->dtype, ir::DType::kI64);
  EXPECT_EQ(s->shape, ir::makeShape({8, 128}));
  auto d = parseInputSpec(" x:float32[B=8, 1024] ");
  ASSERT_TRUE(d.ok()) << d.error().message();
  EXPECT_EQ(d->shape[0], ir::Dim::symbolic("B", 8));
  EXPECT_EQ(toString(*d), "x:f32[B=8,1024]");
  auto scalar = parseInputSpec("t:f32[]");
  ASSERT_TRUE(scalar.ok());
  EXPECT_TRUE(scalar->shape.empty());
}

TEST(InputSpec, RejectsMalformedText) {
  for (const char* bad :
       {"tokens", "tokens:i64", "tokens:q64[8]", "tokens:i64[8,0]", "tokens:i64[8,x]", ":i64[8]",
        "tokens:i64[8", "a b:f32[1]", "x:f32[=4]"}) {
    auto s = parseInputSpec(bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.error().message().find(bad), std::string::npos) << s.error().message();
    EXPECT_EQ(s.error().code(), ErrorCode::kParse);
  }
}

}  // namespace
}  // namespace apc::frontend
