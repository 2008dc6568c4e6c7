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

TEST(RecordedInputs, ReadsEntriesByArgumentName) {
  auto r = parseRecordedInputs(
      R"({"inputs": [{"name": "y", "dtype": "i64", "shape": [4]},
                     {"name": "x", "dtype": "f32", "shape": ["B=8", 16]},
                     {"name": "z", "dtype": "q99", "shape": [1]},
                     {"name": "y", "dtype": "f32"}]})",
      {"x", "y", "z", "w"}, "m.pt");
  ASSERT_TRUE(r.ok()) << r.error().message();
  ASSERT_EQ(r->size(), 4u);
  ASSERT_TRUE((*r)[0]);
  EXPECT_EQ(toString(*(*r)[0]), "x:f32[B=8,16]");
  ASSERT_TRUE((*r)[1]);  // the entry without a shape does not replace the one with
  EXPECT_EQ(toString(*(*r)[1]), "y:i64[4]");
  EXPECT_FALSE((*r)[2]);  // unknown dtype: not recorded
  EXPECT_FALSE((*r)[3]);
  auto none = parseRecordedInputs("", {"x"}, "m.pt");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE((*none)[0]);
}

TEST(RecordedInputs, MalformedRecordIsOneParseError) {
  for (const char* bad : {"{", "[1]", R"({"inputs": 3})", R"({"inputs": [3]})",
                          R"({"inputs": [{"name": "x", "dtype": "f32", "shape": [0]}]})",
                          R"({"inputs": [{"name": "q", "dtype": "f32", "shape": [[2]]}]})"}) {
    auto r = parseRecordedInputs(bad, {"x"}, "m.pt");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code(), ErrorCode::kParse);
    EXPECT_EQ(r.error().message().rfind("'m.pt' has a malformed extra/apc_inputs.json (", 0), 0u)
        << r.error().message();
    EXPECT_EQ(r.error().message().find('\n'), std::string::npos);
  }
}

}  // namespace
}  // namespace apc::frontend
