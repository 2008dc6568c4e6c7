//===- tests/ir/proto_test.cpp - Protobuf round-trip of graphs ------------===//
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sstream>

#include "apc/ir/printer.h"
#include "apc/ir/proto_io.h"
#include "test_graphs.h"

namespace apc::ir {
namespace {

std::string text(const Graph& g) {
  std::ostringstream os;
  printGraph(g, os);
  return os.str();
}

TEST(Proto, RoundTripPreservesEverything) {
  for (Graph g : {testing_graphs::toyBlock(), testing_graphs::withSizeArithmetic()}) {
    g.node(NodeId(0)).source = "model.py:12";
    g.value(ValueId(0)).tensor->shape[0] = Dim::symbolic("B", 8);
    std::string bytes = serializeGraph(g);
    auto back = deserializeGraph(bytes);
    ASSERT_TRUE(back.ok()) << back.error().message();
    EXPECT_EQ(text(*back), text(g));
    EXPECT_EQ(graphToJson(*back), graphToJson(g));
    EXPECT_EQ(back->node(NodeId(0)).source, "model.py:12");
    EXPECT_EQ(back->value(ValueId(0)).tensor->shape[0], Dim::symbolic("B", 8));
    // Deterministic bytes.
    EXPECT_EQ(serializeGraph(*back), bytes);
  }
}

TEST(Proto, TruncatedBytesAreAnError) {
  std::string bytes = serializeGraph(testing_graphs::toyBlock());
  int failures = 0;
  for (size_t cut = 1; cut < bytes.size(); cut += 7) {
    auto g = deserializeGraph(bytes.substr(0, bytes.size() - cut));
    failures += !g.ok();
  }
  // Protobuf may parse some prefixes as valid messages; verify() must still reject them all.
  EXPECT_EQ(failures, static_cast<int>((bytes.size() - 1 + 6) / 7));
}

TEST(Proto, WrongFormatVersionIsAnError) {
  std::string bytes = serializeGraph(testing_graphs::toyBlock());
  // Field 1 (format_version) is written first as varint: 0x08 0x01.
  ASSERT_EQ(bytes[0], 0x08);
  ASSERT_EQ(bytes[1], 0x01);
  bytes[1] = 0x07;
  auto g = deserializeGraph(bytes);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.error().message().find("format version 7"), std::string::npos) << g.error().message();
}

TEST(Proto, GarbageIsAnError) {
  auto g = deserializeGraph("this is not a protobuf");
  EXPECT_FALSE(g.ok());
}

}  // namespace
}  // namespace apc::ir
