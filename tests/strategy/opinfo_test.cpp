//===- tests/strategy/opinfo_test.cpp - One OpInfo per op in the registry --===//
//
// What the registry's entries say beyond the sharding rule (apc/strategy/strategy.h, OpInfo): the
// ops that draw random numbers, the Megatron roles' operands, the local rewrites; and that a new
// op with a random variant is one registry entry.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include "apc/cost/cost_model.h"
#include "apc/strategy/rules.h"
#include "apc/strategy/strategy.h"
#include "builder.h"

namespace apc::strategy::testing {
namespace {

const ir::Node& opinfoNode(const Builder& b) {
  return b.g.node(b.last());
}

TEST(OpInfo, DropoutIsRandomOnlyInTrainingWithNonZeroP) {
  const Registry& r = defaultRegistry();
  auto dropout = [&](double p, std::optional<bool> train) {
    Builder b;
    ValueId x = b.input("x", {8, 16});
    b.op("aten::dropout", {x, b.f(p), train ? b.b(*train) : b.input("train", {})}, {8, 16});
    return r.drawsRandomNumbers(b.g, opinfoNode(b));
  };
  EXPECT_TRUE(dropout(0.1, true));
  EXPECT_TRUE(dropout(0.1, std::nullopt));  // train not known: random
  EXPECT_FALSE(dropout(0.1, false));
  EXPECT_FALSE(dropout(0.0, true));
}

TEST(OpInfo, SamplingOpsAreRandomWithoutAShardingRule) {
  const Registry& r = defaultRegistry();
  for (const char* op : {"aten::bernoulli", "aten::bernoulli_", "aten::rand", "aten::uniform_"}) {
    Builder b;
    ValueId x = b.input("x", {8, 16});
    b.op(op, {x}, {8, 16});
    EXPECT_TRUE(r.drawsRandomNumbers(b.g, opinfoNode(b))) << op;
    EXPECT_EQ(r.find(opinfoNode(b)), nullptr) << op;  // the Replicate-only fallback
    std::vector<NodeStrategies> all = enumerate(b.g, *mesh::DeviceMesh::parse("2"));
    ASSERT_EQ(all.size(), 1u);
    EXPECT_TRUE(all[0].fallback) << op;
  }
  Builder b;
  ValueId x = b.input("x", {8, 16});
  b.op("aten::relu", {x}, {8, 16});
  EXPECT_FALSE(r.drawsRandomNumbers(b.g, opinfoNode(b)));
}

TEST(OpInfo, MegatronOperandsAndLocalRewritesAreEntries) {
  const Registry& r = defaultRegistry();
  auto entry = [&](const std::string& op) {
    ir::Node n;
    n.op = op;
    return r.findEntry(n);
  };
  ASSERT_NE(entry("aten::linear"), nullptr);
  EXPECT_EQ(entry("aten::linear")->tp.kind, TpUse::Kind::kLinear);
  EXPECT_EQ(entry("aten::linear")->tp.weight, 1);
  EXPECT_EQ(entry("aten::linear")->tp.bias, 2);
  EXPECT_EQ(entry("aten::embedding")->tp.kind, TpUse::Kind::kVocab);
  EXPECT_EQ(entry("aten::to")->tp.kind, TpUse::Kind::kKeepsDims);
  EXPECT_EQ(entry("aten::relu")->tp.kind, TpUse::Kind::kNone);
  for (const char* op :
       {"aten::view", "aten::reshape", "aten::expand", "aten::zeros", "aten::new_zeros",
        "aten::unflatten", "aten::arange", "aten::narrow", "aten::embedding", "aten::repeat"}) {
    ASSERT_NE(entry(op), nullptr) << op;
    EXPECT_NE(entry(op)->local_rewrite, nullptr) << op;
  }
  for (const char* op : {"aten::relu", "aten::view_", "aten::split", "aten::linear"}) {
    ASSERT_NE(entry(op), nullptr) << op;
    EXPECT_EQ(entry(op)->local_rewrite, nullptr) << op;
  }
}

// A new pointwise op with a random variant: the variant's entry is the op's rule with a RandomFn.
TEST(OpInfo, NewOpsAreOneEntryEach) {
  ir::Node relu;
  relu.op = "aten::relu";
  const OpInfo& pointwise = *defaultRegistry().findEntry(relu);
  Registry r;
  r.add("test::noisy", pointwise);
  OpInfo noisy = pointwise;
  noisy.random = alwaysRandom;
  r.add("test::noisy_sample", noisy);

  Builder b;
  ValueId x = b.input("x", {8, 16});
  b.op("test::noisy", {x}, {8, 16});
  const NodeId plain = b.last();
  b.op("test::noisy_sample", {x}, {8, 16});
  const NodeId sample = b.last();
  EXPECT_FALSE(r.drawsRandomNumbers(b.g, b.g.node(plain)));
  EXPECT_TRUE(r.drawsRandomNumbers(b.g, b.g.node(sample)));
}

}  // namespace
}  // namespace apc::strategy::testing
