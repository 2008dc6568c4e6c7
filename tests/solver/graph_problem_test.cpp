//===- tests/solver/graph_problem_test.cpp - Graph -> Problem -> plan ------===//
//
// Builds the problem for hand-made graphs and checks the optimizer's choices against what first
// principles say (FSDP on a 1-d mesh under the default budget, DDP with high = 1, FSDP+TP on 2x4).
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include "../ir/test_graphs.h"
#include "apc/solver/graph_problem.h"
#include "apc/solver/ilp.h"

namespace apc::solver {
namespace {

using mesh::Placement;
using mesh::PlacementTuple;

struct Planned {
  GraphProblem gp;
  Solution solution;
  /// The chosen output placement of the graph node named `name` (input/parameter name).
  PlacementTuple placementOf(const ir::Graph& g, const std::string& name) const {
    for (size_t i = 0; i < gp.graph_nodes.size(); ++i)
      if (gp.graph_nodes[i].valid() && g.node(gp.graph_nodes[i]).name == name)
        return *gp.strategies[i][solution.choice[i]].outputs[0];
    return {};
  }
};

Planned plan(const ir::Graph& g, const mesh::Spec& spec) {
  auto strategies = strategy::enumerate(g, spec.mesh);
  auto gp = buildGraphProblem(g, strategies, spec);
  EXPECT_TRUE(gp.ok()) << gp.error().message();
  auto s = solve(gp.value().problem);
  EXPECT_TRUE(s.ok()) << s.error().message();
  return {std::move(gp).value(), std::move(s).value()};
}

mesh::Spec specFor(std::vector<int64_t> shape, std::vector<std::string> names) {
  mesh::Spec s;
  s.mesh = *mesh::DeviceMesh::create(std::move(shape), std::move(names));
  return s;
}

TEST(GraphProblem, LeafPlacementsPruneSmallDims) {
  ir::TensorMeta t{ir::makeShape({3, 16}), ir::DType::kF32, true};
  auto m = *mesh::DeviceMesh::create({4});
  auto p = leafPlacements(t, m);
  // R, S(1); S(0) is dropped (3 < 4).
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0], PlacementTuple{Placement::replicate()});
  EXPECT_EQ(p[1], PlacementTuple{Placement::shard(1)});
}

TEST(GraphProblem, GradientOfReplicatedInputOfShardedOpIsPartial) {
  strategy::Strategy s;  // linear: x S(0), W R -> out S(0)
  s.inputs = {PlacementTuple{Placement::shard(0)}, PlacementTuple{Placement::replicate()},
              std::nullopt};
  s.outputs = {PlacementTuple{Placement::shard(0)}};
  EXPECT_EQ(gradientPlacement(s, 1), PlacementTuple{Placement::partial()});
  EXPECT_EQ(gradientPlacement(s, 0), PlacementTuple{Placement::shard(0)});
  strategy::Strategy r;  // everything replicated: gradients stay replicated
  r.inputs = {PlacementTuple{Placement::replicate()}, PlacementTuple{Placement::replicate()}};
  r.outputs = {PlacementTuple{Placement::replicate()}};
  EXPECT_EQ(gradientPlacement(r, 1), PlacementTuple{Placement::replicate()});
}

TEST(GraphProblem, DefaultBudgetShardsParametersFsdpLike) {
  // 1-d mesh of 8, large batch-sharded input: with high = 1/8 every parameter byte must be sharded.
  ir::Graph g = ir::testing_graphs::toyBlock(512);
  mesh::Spec spec = specFor({8}, {"dp"});
  spec.inputs["x"] = {Placement::shard(0)};
  Planned p = plan(g, spec);
  for (const char* w : {"up.weight", "down.weight"}) {
    PlacementTuple t = p.placementOf(g, w);
    ASSERT_EQ(t.size(), 1u);
    EXPECT_TRUE(t[0].isShard()) << w << " " << mesh::toString(t);
  }
  EXPECT_LE(memoryOf(p.gp.problem, p.solution.choice), p.gp.total_param_bytes / 8 + 1);
}

TEST(GraphProblem, FullBudgetWithLargeBatchReplicatesDdpLike) {
  // high = 1 allows replication. With a large batch (512 x 128 tokens: activations 16x the
  // weights) moving activations (TP) is dearer than moving weights, and replicated weights need
  // only the gradient all-reduce (2 transfers of the weight) while sharded ones pay all-gather
  // forward, re-gather backward and reduce-scatter (3 transfers): DDP wins.
  ir::Graph g = ir::testing_graphs::toyBlock(512);
  mesh::Spec spec = specFor({8}, {"dp"});
  spec.inputs["x"] = {Placement::shard(0)};
  spec.memory_budget.high = 1.0;
  Planned p = plan(g, spec);
  for (const char* w : {"up.weight", "down.weight"})
    EXPECT_EQ(p.placementOf(g, w), PlacementTuple{Placement::replicate()}) << w;
}

TEST(GraphProblem, ToyBlockOn2x4IsFsdpPlusTp) {
  // dp x tp = 2 x 4, input batch-sharded on dp. Megatron TP on tp: up column-parallel (weight
  // [4096,1024] sharded on its output-feature dim 0), down row-parallel (weight [1024,4096] sharded
  // on its input-feature dim 1), so the 4096-wide activation never moves and only down's output is
  // reduced. The default budget (1/8) then forces the dp dim to shard the weights too (FSDP).
  ir::Graph g = ir::testing_graphs::toyBlock();
  mesh::Spec spec = specFor({2, 4}, {"dp", "tp"});
  spec.inputs["x"] = {Placement::shard(0), Placement::replicate()};
  Planned p = plan(g, spec);
  PlacementTuple up = p.placementOf(g, "up.weight");
  PlacementTuple down = p.placementOf(g, "down.weight");
  ASSERT_EQ(up.size(), 2u);
  ASSERT_EQ(down.size(), 2u);
  EXPECT_EQ(up[1], Placement::shard(0)) << mesh::toString(up);
  EXPECT_EQ(down[1], Placement::shard(1)) << mesh::toString(down);
  EXPECT_TRUE(up[0].isShard()) << mesh::toString(up);
  EXPECT_TRUE(down[0].isShard()) << mesh::toString(down);
}

TEST(GraphProblem, OutputConstraintAddsAPricedSink) {
  ir::Graph g = ir::testing_graphs::toyBlock();
  mesh::Spec spec = specFor({2, 4}, {"dp", "tp"});
  spec.inputs["x"] = {Placement::shard(0), Placement::replicate()};
  Planned free_out = plan(g, spec);
  spec.outputs =
      mesh::OutputPlacementTree::makeLeaf({Placement::replicate(), Placement::replicate()});
  Planned replicated_out = plan(g, spec);
  // Gathering the batch at the end costs something: the constrained plan is never cheaper.
  EXPECT_GE(replicated_out.solution.objective, free_out.solution.objective);
  EXPECT_EQ(replicated_out.gp.problem.nodes.back().pin_group, "outputs");
}

}  // namespace
}  // namespace apc::solver
