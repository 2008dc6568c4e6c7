//===- tests/strategy/opinfo_test.cpp - One OpInfo per op in the registry --===//
//
// What the registry's entries say beyond the sharding rule (apc/strategy/strategy.h, OpInfo): the
// ops that draw random numbers, the Megatron roles' operands, the local rewrites, the collective
// an op runs inside itself, the sample invocations it gives the validator; and that a new op with a
// random variant or an internal collective is one registry entry (the examples of docs/DESIGN.md,
// "Placements and strategies").
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include "apc/cost/cost_model.h"
#include "apc/ir/op_collective.h"
#include "apc/strategy/local_rewrite.h"
#include "apc/strategy/rules.h"
#include "apc/strategy/strategy.h"
#include "apc/strategy/sync_norm.h"
#include "builder.h"

namespace apc::strategy::testing {
namespace {

const ir::Node& opinfoNode(const Builder& b) {
  return b.g.node(b.last());
}

/// A training-mode batch_norm over x [8, 64, 4, 4] with its weight, bias and running stats.
void addTrainingBatchNorm(Builder& b) {
  ValueId x = b.input("x", {8, 64, 4, 4});
  ValueId w = b.param("w", {64}), bias = b.param("b", {64});
  ValueId rm = b.buffer("rm", {64}), rv = b.buffer("rv", {64});
  b.op("aten::batch_norm", {x, w, bias, rm, rv, b.b(true), b.f(0.1), b.f(1e-5), b.b(true)},
       {8, 64, 4, 4});
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
        "aten::unflatten", "aten::arange", "aten::narrow", "aten::embedding", "aten::repeat",
        "aten::sort", "aten::argsort.stable", "aten::index.Tensor", "aten::index_put",
        "aten::linear", "aten::addmm", "aten::baddbmm"}) {
    ASSERT_NE(entry(op), nullptr) << op;
    EXPECT_NE(entry(op)->local_rewrite, nullptr) << op;
  }
  for (const char* op : {"aten::relu", "aten::view_", "aten::split", "aten::mm"}) {
    ASSERT_NE(entry(op), nullptr) << op;
    EXPECT_EQ(entry(op)->local_rewrite, nullptr) << op;
  }
}

TEST(OpInfo, TrainingBatchNormDeclaresItsStatisticsAllReduce) {
  Builder b;
  addTrainingBatchNorm(b);
  const OpInfo* info = defaultRegistry().findEntry(opinfoNode(b));
  ASSERT_NE(info, nullptr);
  ASSERT_TRUE(info->collective);
  mesh::DeviceMesh m = *mesh::DeviceMesh::parse("2x2");
  cost::CostModel model(cost::DeviceSpec{}, m);
  RuleContext c{b.g, opinfoNode(b)};
  std::vector<std::optional<PlacementTuple>> inputs(9);
  inputs[0] = PlacementTuple{mesh::Placement::shard(0), mesh::Placement::shard(1)};
  OpCollective batch = info->collective(c, inputs, m, &model);
  EXPECT_EQ(batch.mesh_dims, (std::vector<size_t>{0}));  // the channel cut needs none
  EXPECT_NEAR(batch.us, syncNormUs(model, m, {0}, 32, 4, true), 1e-9);
  EXPECT_EQ(info->collective(c, inputs, m, nullptr).us, 0);  // lowering: the mesh dims only
  inputs[0] = PlacementTuple{mesh::Placement::shard(1), mesh::Placement::replicate()};
  EXPECT_TRUE(info->collective(c, inputs, m, &model).mesh_dims.empty());
}

// What lowering records for an op collective and the runtime runs: the entry's local graph
// (OpInfo::collective_local, apc/ir/op_collective.h). batch_norm's: one input node per argument,
// its one output, and the statistics' two all-reduces (sums with the count, then the squared
// deviations); the functional form's five outputs; group_norm's (a spatial cut) the same two.
TEST(OpInfo, CollectiveLocalGraphsAllReduceTheStatistics) {
  auto allReduces = [](const ir::Graph& g) {
    int n = 0;
    for (const ir::Node& node : g.nodes()) n += node.op == ir::kOpAllReduce;
    return n;
  };
  auto inputNodes = [](const ir::Graph& g) { return g.nodesOfKind(ir::NodeKind::kInput).size(); };
  std::vector<std::optional<PlacementTuple>> inputs(9);
  inputs[0] = PlacementTuple{mesh::Placement::shard(0)};
  {
    Builder b;
    addTrainingBatchNorm(b);
    const OpInfo* info = defaultRegistry().findEntry(opinfoNode(b));
    ASSERT_NE(info, nullptr);
    ASSERT_TRUE(info->collective_local);
    Expected<ir::Graph> local = info->collective_local(RuleContext{b.g, opinfoNode(b)}, inputs);
    ASSERT_TRUE(local.ok()) << local.error().message();
    EXPECT_EQ(inputNodes(*local), 9u);
    EXPECT_EQ(local->outputs().leaves().size(), 1u);
    EXPECT_EQ(allReduces(*local), 2);
    EXPECT_TRUE(ir::checkLocalGraph(*local, 9, 1).ok());
    EXPECT_FALSE(ir::checkLocalGraph(*local, 9, 5).ok());  // a reader checks the node's counts
  }
  {
    Builder b;
    ValueId x = b.input("x", {8, 64, 4, 4});
    ValueId w = b.param("w", {64}), bias = b.param("b", {64});
    ValueId rm = b.buffer("rm", {64}), rv = b.buffer("rv", {64});
    b.multiOp("aten::_native_batch_norm_legit_functional",
              {x, w, bias, rm, rv, b.b(true), b.f(0.1), b.f(1e-5)},
              {{8, 64, 4, 4}, {64}, {64}, {64}, {64}});
    const OpInfo* info = defaultRegistry().findEntry(opinfoNode(b));
    ASSERT_NE(info, nullptr);
    Expected<ir::Graph> local = info->collective_local(RuleContext{b.g, opinfoNode(b)}, inputs);
    ASSERT_TRUE(local.ok()) << local.error().message();
    EXPECT_EQ(inputNodes(*local), 8u);
    EXPECT_EQ(local->outputs().leaves().size(), 5u);
    EXPECT_EQ(allReduces(*local), 2);
  }
  {
    Builder b;
    ValueId x = b.input("x", {4, 8, 12, 6});
    ValueId w = b.param("w", {8}), bias = b.param("b", {8});
    b.op("aten::group_norm", {x, b.i(4), w, bias, b.f(1e-5), b.b(false)}, {4, 8, 12, 6});
    const OpInfo* info = defaultRegistry().findEntry(opinfoNode(b));
    ASSERT_NE(info, nullptr);
    ASSERT_TRUE(info->collective && info->collective_local);
    mesh::DeviceMesh m = *mesh::DeviceMesh::parse("2x2");
    const RuleContext c{b.g, opinfoNode(b)};
    std::vector<std::optional<PlacementTuple>> gn(6);
    gn[0] = PlacementTuple{mesh::Placement::shard(0), mesh::Placement::shard(2)};
    EXPECT_EQ(info->collective(c, gn, m, nullptr).mesh_dims, (std::vector<size_t>{1}));
    Expected<ir::Graph> local = info->collective_local(c, gn);
    ASSERT_TRUE(local.ok()) << local.error().message();
    EXPECT_EQ(inputNodes(*local), 6u);
    EXPECT_EQ(allReduces(*local), 2);
    gn[0] = PlacementTuple{mesh::Placement::shard(0), mesh::Placement::replicate()};
    EXPECT_TRUE(info->collective(c, gn, m, nullptr).mesh_dims.empty());  // a batch cut: none
  }
}

// (a) A new pointwise op with a random variant: the variant's entry is the op's rule with a
// RandomFn. (b) A new op with an internal collective: an entry with an OpCollectiveFn, priced by
// enumerate without it knowing the op.
// The samples an entry gives the strategy validator (OpInfo::samples; run by
// tests/strategy_validator/op_samples_test.cpp) are well-formed IR data: some per op, tensor
// arguments with a known dtype and metas, constants without, and only on ops with a rule.
TEST(OpInfo, SamplesAreWellFormedAndOnlyOnRuledOps) {
  const Registry& r = defaultRegistry();
  size_t with_samples = 0;
  for (const std::string& key : r.ops()) {
    ir::Node n;
    size_t dot = key.find('.', key.find("::"));
    n.op = key.substr(0, dot);
    n.overload = dot == std::string::npos ? "" : key.substr(dot + 1);
    const OpInfo* info = r.findEntry(n);
    ASSERT_NE(info, nullptr) << key;
    if (!info->samples) continue;
    ++with_samples;
    EXPECT_TRUE(info->rule) << key << ": samples without a rule";
    std::vector<OpSample> samples = info->samples();
    EXPECT_FALSE(samples.empty()) << key;
    for (const OpSample& s : samples) {
      for (const SampleArg& a : s.args) {
        bool tensor = a.type == ir::ValueType::kTensor || a.type == ir::ValueType::kTensorList;
        EXPECT_EQ(tensor, !a.tensors.empty()) << key;
        if (a.type == ir::ValueType::kTensor) {
          EXPECT_EQ(a.tensors.size(), 1u) << key;
        }
        for (const ir::TensorMeta& m : a.tensors) {
          EXPECT_NE(m.dtype, ir::DType::kUnknown) << key;
          for (const ir::Dim& d : m.shape) {
            EXPECT_GT(d.size, 0) << key << ": " << ir::toString(m);
          }
        }
      }
    }
  }
  EXPECT_GE(with_samples, 233u);
  // The sample of an entry is data: a bare key takes its overload from the sample.
  ir::Node add;
  add.op = "aten::add";
  std::vector<OpSample> s = r.findEntry(add)->samples();
  ASSERT_FALSE(s.empty());
  EXPECT_EQ(s[0].overload, "Tensor");
  ASSERT_EQ(s[0].args.size(), 2u);
  EXPECT_EQ(s[0].args[0].tensors.at(0).dtype, ir::DType::kF32);
}

TEST(OpInfo, NewOpsAreOneEntryEach) {
  ir::Node relu;
  relu.op = "aten::relu";
  const OpInfo& pointwise = *defaultRegistry().findEntry(relu);
  Registry r;
  r.add("test::noisy", pointwise);
  OpInfo noisy = pointwise;
  noisy.random = alwaysRandom;
  r.add("test::noisy_sample", noisy);
  OpInfo reducing = pointwise;
  reducing.collective = [](const RuleContext&,
                           const std::vector<std::optional<PlacementTuple>>& inputs,
                           const mesh::DeviceMesh&, const cost::CostModel* model) {
    OpCollective inside;
    for (size_t k = 0; inputs[0] && k < inputs[0]->size(); ++k)
      if ((*inputs[0])[k].isShard(0)) inside.mesh_dims.push_back(k);
    inside.us = model && !inside.mesh_dims.empty() ? 7.0 : 0.0;
    return inside;
  };
  r.add("test::reducing", reducing);

  Builder b;
  ValueId x = b.input("x", {8, 16});
  b.op("test::noisy", {x}, {8, 16});
  const NodeId plain = b.last();
  b.op("test::noisy_sample", {x}, {8, 16});
  const NodeId sample = b.last();
  b.op("test::reducing", {x}, {8, 16});
  const NodeId reduced = b.last();
  EXPECT_FALSE(r.drawsRandomNumbers(b.g, b.g.node(plain)));
  EXPECT_TRUE(r.drawsRandomNumbers(b.g, b.g.node(sample)));

  std::vector<NodeStrategies> all = enumerate(b.g, *mesh::DeviceMesh::parse("2"), r);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(strategyStrings(all, plain), strategyStrings(all, reduced));
  for (size_t k = 0; k < all[0].strategies.size(); ++k) {
    const Strategy& s = all[0].strategies[k];
    const double extra = (*s.inputs[0])[0].isShard(0) ? 7.0 : 0.0;
    EXPECT_NEAR(all[2].strategies[k].compute_us, s.compute_us + extra, 1e-9) << s.toString();
  }
}

}  // namespace
}  // namespace apc::strategy::testing
