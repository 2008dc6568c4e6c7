//===- tests/support/json_reader_test.cpp - apc's one JSON reader ---------===//
//
// The shared reader of apc/support/json_reader.h: paths, duplicate keys, key suggestions, the
// object and integer checks the plan and manifest readers rely on.
//
//===----------------------------------------------------------------------===//
#include "apc/support/json_reader.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace apc::json_reader {
namespace {

std::string messageOf(const Status& s) {
  return s.ok() ? std::string() : s.error().message();
}

TEST(JsonReader, PathsNameKeysAndIndices) {
  EXPECT_EQ(keyPath("$", "mesh"), "$.mesh");
  EXPECT_EQ(keyPath("$.inputs", "a.b"), "$.inputs[\"a.b\"]");
  EXPECT_EQ(indexPath("$.mesh.shape", 1), "$.mesh.shape[1]");
}

TEST(JsonReader, DuplicateKeysAreNamedByPath) {
  auto j = parseJsonText(R"({"mesh": {"shape": [2], "shape": [4]}})");
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.error().code(), ErrorCode::kParse);
  EXPECT_EQ(j.error().message(), "$.mesh.shape: key given twice in one object");
  auto deep = parseJsonText(std::string(65, '[') + std::string(65, ']'));
  ASSERT_FALSE(deep.ok());
  EXPECT_NE(deep.error().message().find("nested deeper than 64"), std::string::npos);
}

// The ordered tree (the runtime's safetensors headers and checkpoint manifests) keeps the keys in
// their order in the text, with the same checks.
TEST(JsonReader, TheOrderedTreeKeepsKeyOrderWithTheSameChecks) {
  auto j = parseOrderedJsonText(R"({"b": 1, "a": {"z": 2, "y": 3}})");
  ASSERT_TRUE(j.ok()) << j.error().message();
  std::vector<std::string> keys;
  for (const auto& [k, v] : j->items()) keys.push_back(k);
  for (const auto& [k, v] : (*j)["a"].items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"b", "a", "z", "y"}));
  auto twice = parseOrderedJsonText(R"({"w": {"dtype": "F32"}, "w": {"dtype": "F16"}})");
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.error().message(), "$.w: key given twice in one object");
  auto broken = parseOrderedJsonText(R"({"w": )");
  ASSERT_FALSE(broken.ok());
  EXPECT_EQ(broken.error().message().rfind("malformed JSON: parse error at line 1", 0), 0u)
      << broken.error().message();
  EXPECT_FALSE(parseOrderedJsonText(std::string(65, '[') + std::string(65, ']')).ok());
}

TEST(JsonReader, UnknownKeysSuggestTheClosest) {
  json j = {{"meshh", 1}};
  EXPECT_EQ(messageOf(checkKeys(j, "$", {"mesh", "device"})),
            "$.meshh: unknown key (did you mean 'mesh'?); allowed keys: mesh, device");
  EXPECT_EQ(messageOf(checkObject(json::object(), "$.solver", {"status"})),
            "$.solver: missing key 'status'");
  EXPECT_EQ(messageOf(checkObject(json::array(), "$.solver", {"status"})),
            "$.solver: expected an object, got array");
  EXPECT_TRUE(checkObject({{"status", 1}, {"gap", 2}}, "$", {"status"}, {"gap"}).ok());
  // A misspelt required key is named as unknown, with the suggestion, not as missing.
  EXPECT_EQ(messageOf(checkObject({{"stauts", 1}}, "$.solver", {"status"}, {"gap"})),
            "$.solver.stauts: unknown key (did you mean 'status'?); allowed keys: gap, status");
}

TEST(JsonReader, IntegersStrictOrNot) {
  EXPECT_EQ(*readInt(json(2.0), "$.n"), 2);
  auto strict = readInt(json(2.0), "$.n", /*strict=*/true);
  ASSERT_FALSE(strict.ok());
  EXPECT_EQ(strict.error().message(), "$.n: expected an integer, got number 2.0");
  auto negative = readIntAtLeast(json(-1), "$.n", 0);
  ASSERT_FALSE(negative.ok());
  EXPECT_EQ(negative.error().message(), "$.n: must be >= 0, got -1");
  auto huge = readInt(json(uint64_t{1} << 63), "$.n");
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.error().message().find("is too large"), std::string::npos);
}

}  // namespace
}  // namespace apc::json_reader
