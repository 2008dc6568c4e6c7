//===- tests/solver/graph_problem_test.cpp - Graph -> Problem -> plan ------===//
//
// Builds the problem for hand-made graphs and checks the optimizer's choices against what first
// principles say (FSDP on a 1-d mesh under the default budget, DDP with high = 1, FSDP+TP on 2x4),
// user pins (honoured, exact under reduction, infeasible ones named, pinned layers left untied),
// the final reduction of free Partial outputs, and mixed precision byte counts.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "../ir/test_graphs.h"
#include "../strategy/builder.h"
#include "apc/cost/edge.h"
#include "apc/cost/redistribute.h"
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

Planned plan(const ir::Graph& g, const spec::Spec& spec) {
  auto strategies = strategy::enumerate(g, spec.mesh);
  auto gp = buildGraphProblem(g, strategies, spec);
  EXPECT_TRUE(gp.ok()) << gp.error().message();
  auto s = solve(gp.value().problem);
  EXPECT_TRUE(s.ok()) << s.error().message();
  return {std::move(gp).value(), std::move(s).value()};
}

spec::Spec specFor(std::vector<int64_t> shape, std::vector<std::string> names) {
  spec::Spec s;
  s.mesh = *mesh::DeviceMesh::create(std::move(shape), std::move(names));
  return s;
}

TEST(GraphProblem, SharedStrategyListsBuildTheSameProblem) {
  // enumerate's cache gives the nodes of repeated layers one shared strategy list, and the builder
  // reuses the placement classes of the edges between shared lists. Without the cache every node
  // has a list of its own: the problem must be the same, cost for cost.
  ir::Graph g = strategy::testing::llamaModel(3, 8, 16, 64, 4, 2, 96, 256);
  spec::Spec spec = specFor({2, 2}, {"dp", "tp"});
  auto shared = strategy::enumerate(g, spec.mesh);
  strategy::EnumerateOptions own_lists;
  own_lists.use_cache = false;
  auto separate = strategy::enumerate(g, spec.mesh, strategy::defaultRegistry(), own_lists);
  auto a = buildGraphProblem(g, shared, spec);
  auto b = buildGraphProblem(g, separate, spec);
  ASSERT_TRUE(a.ok()) << a.error().message();
  ASSERT_TRUE(b.ok()) << b.error().message();
  std::set<const void*> lists_a, lists_b;
  for (const auto& l : a->strategies) lists_a.insert(l.identity());
  for (const auto& l : b->strategies) lists_b.insert(l.identity());
  EXPECT_LT(lists_a.size(), lists_b.size() / 2) << "the layers' nodes do not share lists";
  ASSERT_EQ(a->problem.nodes.size(), b->problem.nodes.size());
  for (size_t n = 0; n < a->problem.nodes.size(); ++n) {
    EXPECT_EQ(a->strategies[n], b->strategies[n]) << n;
    EXPECT_EQ(a->problem.nodes[n].costs, b->problem.nodes[n].costs) << n;
    EXPECT_EQ(a->problem.nodes[n].memory, b->problem.nodes[n].memory) << n;
  }
  ASSERT_EQ(a->problem.edges.size(), b->problem.edges.size());
  size_t pairs = 0;
  for (size_t k = 0; k < a->problem.edges.size(); ++k) {
    const ProblemEdge& ea = a->problem.edges[k];
    const ProblemEdge& eb = b->problem.edges[k];
    ASSERT_EQ(ea.src, eb.src);
    ASSERT_EQ(ea.dst, eb.dst);
    size_t ns = a->problem.nodes[ea.src].costs.size(), nd = a->problem.nodes[ea.dst].costs.size();
    for (size_t s = 0; s < ns; ++s)
      for (size_t t = 0; t < nd; ++t, ++pairs)
        ASSERT_EQ(ea.cost(s, t, nd), eb.cost(s, t, nd))
            << "edge " << k << " pair " << s << "," << t;
  }
  EXPECT_GT(pairs, 10000u);
}

TEST(GraphProblem, EdgeCostsArePairwiseRedistributionCosts) {
  // Construction prices rows of an edge's table with one search per source placement, on several
  // threads (EdgePricer::prefetch): every pair must still be the pairwise redistribution cost,
  // the forward from the producer's placement plus the gradient's way back (apc/cost/edge.h).
  ir::Graph g = strategy::testing::llamaModel(1, 8, 16, 64, 4, 2, 96, 256);
  spec::Spec spec = specFor({2, 2, 2}, {"a", "b", "c"});
  auto strategies = strategy::enumerate(g, spec.mesh);
  auto gp = buildGraphProblem(g, strategies, spec);
  ASSERT_TRUE(gp.ok()) << gp.error().message();
  size_t checked = 0, finite = 0;
  for (size_t k = 0; k < gp->problem.edges.size(); ++k) {
    const ProblemEdge& e = gp->problem.edges[k];
    if (!gp->graph_nodes[e.dst].valid() || !gp->graph_nodes[e.src].valid()) continue;  // sinks
    const ir::Node& consumer = g.node(gp->graph_nodes[e.dst]);
    const ir::Value& v = g.value(consumer.inputs.at(gp->edge_input[k]));
    if (!v.tensor || cost::regatheredInBackward(g.node(v.producer))) continue;
    const ir::TensorMeta& t = *v.tensor;
    size_t nd = gp->problem.nodes[e.dst].costs.size(), ns = gp->problem.nodes[e.src].costs.size();
    for (size_t s = 0; s < ns; s += 3) {
      for (size_t d = 0; d < nd; d += 5) {
        const auto& from = gp->strategies[e.src][s].outputs.at(v.producer_output);
        const auto& to = gp->strategies[e.dst][d].inputs.at(gp->edge_input[k]);
        ASSERT_TRUE(from && to);
        auto fwd = cost::redistributionCost(t, *from, *to, spec.mesh);
        ASSERT_TRUE(fwd.ok()) << fwd.error().message();
        double want = fwd->feasible ? fwd->forward_us : kInfinity;
        if (t.requires_grad && std::isfinite(want)) {
          PlacementTuple grad = gradientPlacement(gp->strategies[e.dst][d], gp->edge_input[k]);
          auto back = cost::redistributionCost(t, grad, cost::partialAsReplicate(*from), spec.mesh);
          want += back->feasible ? back->forward_us : kInfinity;
        }
        double got = e.cost(s, d, nd);
        finite += std::isfinite(want) ? 1 : 0;
        if (std::isinf(want))
          EXPECT_TRUE(std::isinf(got)) << "edge " << k << " pair " << s << "," << d;
        else
          EXPECT_DOUBLE_EQ(got, want) << "edge " << k << " pair " << s << "," << d;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 1000u);
  EXPECT_GT(finite, checked / 4);
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

TEST(GraphProblem, AnEmptyLeafIsReplicated) {
  // transformers' empty key/value caches: a buffer f32[0]. Replicate fits (no piece to cut);
  // no sharding does. (It used to get no placement at all: "has no strategies".)
  ir::TensorMeta t{ir::makeShape({0}), ir::DType::kF32, false};
  auto m = *mesh::DeviceMesh::create({2, 2});
  auto p = leafPlacements(t, m);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0], mesh::replicated(2));
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
  spec::Spec spec = specFor({8}, {"dp"});
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
  spec::Spec spec = specFor({8}, {"dp"});
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
  spec::Spec spec = specFor({2, 4}, {"dp", "tp"});
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
  spec::Spec spec = specFor({2, 4}, {"dp", "tp"});
  spec.inputs["x"] = {Placement::shard(0), Placement::replicate()};
  Planned free_out = plan(g, spec);
  spec.outputs =
      spec::OutputPlacementTree::makeLeaf({Placement::replicate(), Placement::replicate()});
  Planned replicated_out = plan(g, spec);
  // Gathering the batch at the end costs something: the constrained plan is never cheaper.
  EXPECT_GE(replicated_out.solution.objective, free_out.solution.objective);
  EXPECT_EQ(replicated_out.gp.problem.nodes.back().pin_group, "outputs");
}

// --- helpers for the tests below ----------------------------------------------------------------

/// The problem node standing for the graph node named `name` (an input/parameter name) or producing
/// the value named `name`; -1 when none.
int nodeOf(const GraphProblem& gp, const ir::Graph& g, const std::string& name) {
  for (size_t i = 0; i < gp.graph_nodes.size(); ++i) {
    if (!gp.graph_nodes[i].valid()) continue;
    const ir::Node& n = g.node(gp.graph_nodes[i]);
    if (n.name == name) return static_cast<int>(i);
    for (ir::ValueId v : n.outputs)
      if (n.kind == ir::NodeKind::kOp && g.value(v).debug_name == name) return static_cast<int>(i);
  }
  return -1;
}

int problemNodeNamed(const GraphProblem& gp, const std::string& name) {
  for (size_t i = 0; i < gp.problem.nodes.size(); ++i)
    if (gp.problem.nodes[i].name == name) return static_cast<int>(i);
  return -1;
}

const ProblemEdge* edgeBetween(const GraphProblem& gp, int src, int dst) {
  for (const ProblemEdge& e : gp.problem.edges)
    if (static_cast<int>(e.src) == src && static_cast<int>(e.dst) == dst) return &e;
  return nullptr;
}

spec::Pin nodePin(const std::string& name, PlacementTuple t) {
  return {spec::Pin::Target::kNode, name, std::move(t)};
}

Expected<GraphProblem> build(const ir::Graph& g, const spec::Spec& spec) {
  return buildGraphProblem(g, strategy::enumerate(g, spec.mesh), spec);
}

// --- pins ----------------------------------------------------------------------------------------

TEST(Pins, OpPinFixesTheOutputAndSurvivesReduction) {
  // DDP-like setting (high = 1, batch-sharded input): left alone, relu's output stays batch-sharded
  // (nothing needs it elsewhere). Pinned to R, it must come out R: the plan gathers it, so the
  // objective can only grow, and the reduced and the full problem agree on the optimum.
  ir::Graph g = ir::testing_graphs::toyBlock(64);
  spec::Spec spec = specFor({8}, {"dp"});
  spec.inputs["x"] = {Placement::shard(0)};
  spec.memory_budget.high = 1.0;
  auto free_gp = build(g, spec);
  ASSERT_TRUE(free_gp.ok()) << free_gp.error().message();
  auto free_sol = solveGraphProblem(*free_gp);
  ASSERT_TRUE(free_sol.ok());
  spec.pins = {nodePin("r", {Placement::replicate()})};
  auto gp = build(g, spec);
  ASSERT_TRUE(gp.ok()) << gp.error().message();
  int sink = problemNodeNamed(*gp, "pin %r");
  ASSERT_GE(sink, 0);
  EXPECT_EQ(gp->problem.nodes[sink].pin_group, "pins");
  auto reduced = solveGraphProblem(*gp);
  SolveGraphOptions no_reduce;
  no_reduce.reduce = false;
  auto full = solveGraphProblem(*gp, no_reduce);
  ASSERT_TRUE(reduced.ok() && full.ok());
  int relu = nodeOf(*gp, g, "r");
  ASSERT_GE(relu, 0);
  for (const Solution* s : {&*reduced, &*full})
    EXPECT_EQ(*gp->strategies[relu][s->choice[relu]].outputs[0],
              PlacementTuple{Placement::replicate()});
  EXPECT_NEAR(reduced->objective, full->objective, 1e-6 * full->objective);
  EXPECT_GT(reduced->objective, free_sol->objective);
}

TEST(Pins, ParameterPinIsHonoured) {
  // Under the default budget either dim of up.weight may be sharded; pinned to S(1), it is S(1).
  ir::Graph g = ir::testing_graphs::toyBlock(64);
  spec::Spec spec = specFor({8}, {"dp"});
  spec.inputs["x"] = {Placement::shard(0)};
  spec.pins = {nodePin("up.weight", {Placement::shard(1)})};
  auto gp = build(g, spec);
  ASSERT_TRUE(gp.ok()) << gp.error().message();
  auto s = solveGraphProblem(*gp);
  ASSERT_TRUE(s.ok()) << s.error().message();
  int w = nodeOf(*gp, g, "up.weight");
  EXPECT_EQ(*gp->strategies[w][s->choice[w]].outputs[0], PlacementTuple{Placement::shard(1)});
}

TEST(Pins, InputPinSetsTheInputPlacement) {
  // The spec does not place x: a pin on it replaces the default Replicate.
  ir::Graph g = ir::testing_graphs::toyBlock(64);
  spec::Spec spec = specFor({8}, {"dp"});
  spec.pins = {nodePin("x", {Placement::shard(0)})};
  auto gp = build(g, spec);
  ASSERT_TRUE(gp.ok()) << gp.error().message();
  int x = nodeOf(*gp, g, "x");
  const ProblemNode& n = gp->problem.nodes[x];
  ASSERT_TRUE(n.pinned.has_value());
  EXPECT_EQ(n.pin_group, "pins");
  EXPECT_EQ(*gp->strategies[x][*n.pinned].outputs[0], PlacementTuple{Placement::shard(0)});
}

TEST(Pins, ContradictoryPinsAreInfeasibleAndNamed) {
  ir::Graph g = ir::testing_graphs::toyBlock(64);
  spec::Spec spec = specFor({8}, {"dp"});
  spec.memory_budget.high = 1.0;
  spec.pins = {nodePin("h", {Placement::shard(0)}), nodePin("h", {Placement::replicate()})};
  auto gp = build(g, spec);
  ASSERT_TRUE(gp.ok()) << gp.error().message();
  for (bool reduce : {true, false}) {
    SolveGraphOptions o;
    o.reduce = reduce;
    auto s = solveGraphProblem(*gp, o);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().code(), ErrorCode::kInfeasible);
    EXPECT_NE(s.error().message().find("[pins]"), std::string::npos) << s.error().message();
  }
}

TEST(Pins, ModulePinPinsWhatLeavesTheModule) {
  // Module "up" makes h (used by relu, outside it): one sink for h, none for the weight it reads.
  ir::Graph g = ir::testing_graphs::toyBlock(64);
  spec::Spec spec = specFor({8}, {"dp"});
  spec.pins = {{spec::Pin::Target::kModule, "up", {Placement::shard(0)}}};
  auto gp = build(g, spec);
  ASSERT_TRUE(gp.ok()) << gp.error().message();
  EXPECT_GE(problemNodeNamed(*gp, "pin %h"), 0);
  size_t sinks = 0;
  for (const auto& n : gp->problem.nodes) sinks += n.pin_group == "pins";
  EXPECT_EQ(sinks, 1u);
  // A module whose values are all used inside it has nothing to pin; unknown names are errors.
  spec.pins = {nodePin("nope", {Placement::shard(0)})};
  auto bad = build(g, spec);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("$.pins[0].node"), std::string::npos);
}

/// Two identical layers: x -> layers.0.lin -> layers.1.lin.
ir::Graph twoLayers() {
  using namespace ir::testing_graphs;
  ir::Graph g;
  g.name = "two_layers";
  // x takes a gradient (as an embedding's output does): layer 0 then costs what layer 1 does.
  ir::ValueId x = tensorValue(g, "x", {64, 256}, ir::DType::kF32, true);
  leafNode(g, ir::NodeKind::kInput, "x", x);
  ir::ValueId none = g.addConstant(ir::ValueType::kNone, ir::None{});
  for (int i = 0; i < 2; ++i) {
    std::string m = "layers." + std::to_string(i) + ".lin";
    ir::ValueId w = tensorValue(g, m + ".weight", {256, 256}, ir::DType::kF32, true);
    leafNode(g, ir::NodeKind::kParameter, m + ".weight", w);
    ir::ValueId y = tensorValue(g, "y" + std::to_string(i), {64, 256}, ir::DType::kF32, true);
    opNode(g, "aten::linear", "", {x, w, none}, {y}, m);
    x = y;
  }
  g.setOutputs(ir::OutputTree::makeLeaf(x));
  return g;
}

TEST(Pins, PinnedLayerIsNotTiedToTheOthers) {
  ir::Graph g = twoLayers();
  spec::Spec spec = specFor({8}, {"dp"});
  auto gp = build(g, spec);
  ASSERT_TRUE(gp.ok());
  size_t clusters = 0;
  repeatedLayerRepresentatives(*gp, &clusters);
  EXPECT_EQ(clusters, 1u);
  spec.pins = {nodePin("y1", {Placement::shard(1)})};
  auto pinned = build(g, spec);
  ASSERT_TRUE(pinned.ok());
  std::vector<uint32_t> rep = repeatedLayerRepresentatives(*pinned, &clusters);
  EXPECT_EQ(clusters, 0u);
  // And the pin holds with clustering on (the default).
  auto s = solveGraphProblem(*pinned);
  ASSERT_TRUE(s.ok()) << s.error().message();
  int y1 = nodeOf(*pinned, g, "y1");
  EXPECT_EQ(*pinned->strategies[y1][s->choice[y1]].outputs[0], PlacementTuple{Placement::shard(1)});
}

// --- shared reads --------------------------------------------------------------------------------

/// x (taking a gradient, as an embedding's output does) read by three projections, summed:
/// attention's q, k and v reading one normalized hidden state.
ir::Graph threeReaders() {
  using namespace ir::testing_graphs;
  ir::Graph g;
  g.name = "three_readers";
  ir::ValueId x = tensorValue(g, "x", {64, 256}, ir::DType::kF32, true);
  leafNode(g, ir::NodeKind::kInput, "x", x);
  ir::ValueId none = g.addConstant(ir::ValueType::kNone, ir::None{});
  ir::ValueId one = g.addConstant(ir::ValueType::kInt, int64_t{1});
  std::vector<ir::ValueId> ys;
  for (const char* name : {"q", "k", "v"}) {
    std::string m = std::string("attn.") + name;
    ir::ValueId w = tensorValue(g, m + ".weight", {256, 256}, ir::DType::kF32, true);
    leafNode(g, ir::NodeKind::kParameter, m + ".weight", w);
    ys.push_back(tensorValue(g, name, {64, 256}, ir::DType::kF32, true));
    opNode(g, "aten::linear", "", {x, w, none}, {ys.back()}, m);
  }
  ir::ValueId qk = tensorValue(g, "qk", {64, 256}, ir::DType::kF32, true);
  opNode(g, "aten::add", "Tensor", {ys[0], ys[1], one}, {qk}, "attn");
  ir::ValueId out = tensorValue(g, "out", {64, 256}, ir::DType::kF32, true);
  opNode(g, "aten::add", "Tensor", {qk, ys[2], one}, {out}, "attn");
  g.setOutputs(ir::OutputTree::makeLeaf(out));
  return g;
}

TEST(SharedReads, ARedistributionThreeProjectionsReadIsPaidOnce) {
  // Column-parallel q, k and v read x replicated and leave its gradient Partial: lowering
  // all-reduces the sum of the three gradients once, so the plan must pay one all-reduce, not
  // three.
  ir::Graph g = threeReaders();
  spec::Spec spec = specFor({2}, {"tp"});
  spec.memory_budget.high = 1.0;
  auto each = build(g, spec);  // shared_reads off (the default): every read priced whole
  ASSERT_TRUE(each.ok()) << each.error().message();
  EXPECT_TRUE(each->shared_reads.empty());
  spec.shared_reads = true;
  auto gp = build(g, spec);
  ASSERT_TRUE(gp.ok()) << gp.error().message();
  const int x = nodeOf(*gp, g, "x");
  const SharedReads* reads = nullptr;
  for (const SharedReads& sr : gp->shared_reads)
    if (sr.src == static_cast<uint32_t>(x)) reads = &sr;
  ASSERT_NE(reads, nullptr);
  EXPECT_EQ(reads->edges.size(), 3u);
  EXPECT_GE(reads->num_keys, 1u);

  // The choice: every projection column-parallel (input R, weight S(0), output S(1)), the rest
  // at its cheapest given that.
  std::vector<uint32_t> choice(gp->problem.nodes.size(), 0);
  Problem pinned = gp->problem;
  for (const char* name : {"q", "k", "v"}) {
    const int n = nodeOf(*gp, g, name);
    std::optional<uint32_t> column;
    for (size_t s = 0; s < gp->strategies[n].size() && !column; ++s) {
      const strategy::Strategy& st = gp->strategies[n][s];
      if (*st.inputs[0] == PlacementTuple{Placement::replicate()} &&
          *st.inputs[1] == PlacementTuple{Placement::shard(0)} &&
          *st.outputs[0] == PlacementTuple{Placement::shard(1)})
        column = static_cast<uint32_t>(s);
    }
    ASSERT_TRUE(column.has_value()) << name;
    pinned.nodes[n].pinned = column;
  }
  auto fixed = solve(pinned);
  ASSERT_TRUE(fixed.ok()) << fixed.error().message();
  choice = fixed->choice;

  // The all-reduce of x's gradient, as the edges price it.
  const ir::TensorMeta& xt = *g.value(g.node(gp->graph_nodes[x]).outputs[0]).tensor;
  auto all_reduce =
      cost::redistributionCost(xt, {Placement::partial()}, {Placement::replicate()}, spec.mesh);
  ASSERT_TRUE(all_reduce.ok());
  ASSERT_GT(all_reduce->forward_us, 0);
  const std::vector<bool> paid = paidByAnEarlierReader(*gp, choice);
  size_t paid_earlier = 0;
  for (uint32_t k : reads->edges) {
    const ProblemEdge& e = gp->problem.edges[k];
    const double c = e.cost(choice[e.src], choice[e.dst], gp->problem.nodes[e.dst].numStrategies());
    EXPECT_NEAR(c, all_reduce->forward_us, 1e-9 * c) << "edge " << k;
    paid_earlier += paid[k] ? 1 : 0;
  }
  EXPECT_EQ(paid_earlier, 2u);
  EXPECT_FALSE(paid[reads->edges[0]]);
  const double whole = evaluate(gp->problem, choice);
  const double shared = evaluate(*gp, choice);
  EXPECT_NEAR(whole - shared, 2 * all_reduce->forward_us, 1e-9 * whole);

  // The split problem prices a choice in which all three read it alike, as one in which none
  // does, at its shared price; one in which only some read it, below it.
  GraphProblem split = withReadShares(*gp, evenReadShares(*gp));
  EXPECT_TRUE(split.shared_reads.empty());
  EXPECT_NEAR(evaluate(split.problem, choice), shared, 1e-9 * shared);
  std::vector<uint32_t> mixed = choice;
  {
    const int v = nodeOf(*gp, g, "v");
    Problem p = gp->problem;
    p.nodes[v].pinned.reset();
    for (const char* name : {"q", "k"})
      p.nodes[nodeOf(*gp, g, name)].pinned = choice[nodeOf(*gp, g, name)];
    // v reads x sharded: its gradient then needs no all-reduce of its own.
    std::optional<uint32_t> row;
    for (size_t s = 0; s < gp->strategies[v].size() && !row; ++s)
      if (*gp->strategies[v][s].inputs[0] == PlacementTuple{Placement::shard(0)})
        row = static_cast<uint32_t>(s);
    ASSERT_TRUE(row.has_value());
    p.nodes[v].pinned = row;
    auto m = solve(p);
    ASSERT_TRUE(m.ok()) << m.error().message();
    mixed = m->choice;
  }
  EXPECT_LT(evaluate(split.problem, mixed), evaluate(*gp, mixed));

  // The optimizer's plan is the optimum of evaluate(gp, .) over every choice (enumerated here).
  auto s = solveGraphProblem(*gp);
  ASSERT_TRUE(s.ok()) << s.error().message();
  EXPECT_EQ(s->choice.size(), gp->problem.nodes.size());
  EXPECT_DOUBLE_EQ(s->objective, evaluate(*gp, s->choice));
  const Problem& p = gp->problem;
  std::vector<uint32_t> at(p.nodes.size(), 0);
  for (size_t i = 0; i < p.nodes.size(); ++i)
    if (p.nodes[i].pinned) at[i] = *p.nodes[i].pinned;
  double best = kInfinity;
  size_t choices = 0;
  while (true) {
    best = std::min(best, evaluate(*gp, at));
    ++choices;
    size_t i = 0;
    for (; i < at.size(); ++i) {
      if (p.nodes[i].pinned) continue;
      if (++at[i] < p.nodes[i].numStrategies()) break;
      at[i] = 0;
    }
    if (i == at.size()) break;
  }
  EXPECT_GT(choices, 1000u);
  EXPECT_NEAR(s->objective, best, 1e-9 * best);
  EXPECT_EQ(s->status, SolveStatus::kOptimal);
  auto unshared = solve(gp->problem);
  ASSERT_TRUE(unshared.ok());
  EXPECT_LE(s->objective, unshared->objective * (1 + 1e-9));
}

TEST(SharedReads, ValuesReadOnceAreNotShared) {
  // twoLayers: every value has one reader, so the problem and its price are as before.
  ir::Graph g = twoLayers();
  spec::Spec spec = specFor({2}, {"dp"});
  spec.shared_reads = true;
  auto gp = build(g, spec);
  ASSERT_TRUE(gp.ok());
  EXPECT_TRUE(gp->shared_reads.empty());
  auto s = solveGraphProblem(*gp);
  ASSERT_TRUE(s.ok());
  EXPECT_DOUBLE_EQ(s->objective, evaluate(gp->problem, s->choice));
}

// --- free outputs --------------------------------------------------------------------------------

TEST(FreeOutputs, PartialFreeOutputPaysTheFinalReduction) {
  // down's row-parallel strategy (r sharded on its last dim, weight S(1)) leaves y Partial. The
  // lowering reduces a Partial output to Replicate, so the free output's sink charges exactly that
  // all-reduce for Partial producer strategies and nothing for Shard/Replicate ones.
  ir::Graph g = ir::testing_graphs::toyBlock(8);
  spec::Spec spec = specFor({8}, {"tp"});
  auto gp = build(g, spec);
  ASSERT_TRUE(gp.ok()) << gp.error().message();
  int sink = problemNodeNamed(*gp, "output %y");
  ASSERT_GE(sink, 0);
  EXPECT_FALSE(gp->problem.nodes[sink].pinned.has_value());
  int down = nodeOf(*gp, g, "y");
  const ProblemEdge* e = edgeBetween(*gp, down, sink);
  ASSERT_NE(e, nullptr);
  const ir::TensorMeta& y = *g.value(g.node(gp->graph_nodes[down]).outputs[0]).tensor;
  size_t partials = 0;
  for (size_t s = 0; s < gp->strategies[down].size(); ++s) {
    const PlacementTuple& out = *gp->strategies[down][s].outputs[0];
    if (out[0].isPartial()) {
      ++partials;
      auto c = cost::redistributionCost(y, out, {Placement::replicate()}, spec.mesh);
      ASSERT_TRUE(c.ok());
      EXPECT_GT(e->costs[s], 0);
      EXPECT_DOUBLE_EQ(e->costs[s], c->forward_us);
    } else {
      EXPECT_EQ(e->costs[s], 0) << mesh::toString(out);
    }
  }
  EXPECT_GE(partials, 1u);
}

// --- mixed precision -----------------------------------------------------------------------------

TEST(MixedPrecision, ComputeGraphCastsFloatingValues) {
  ir::Graph g = ir::testing_graphs::toyBlock(8);
  spec::MixedPrecision mp;
  mp.param_dtype = ir::DType::kBF16;
  ir::Graph c = computeGraph(g, mp);
  for (uint32_t i = 0; i < g.numValues(); ++i) {
    const ir::Value& a = g.value(ir::ValueId{i});
    const ir::Value& b = c.value(ir::ValueId{i});
    if (!a.tensor) continue;
    EXPECT_EQ(b.tensor->dtype,
              ir::isFloating(a.tensor->dtype) ? ir::DType::kBF16 : a.tensor->dtype);
    EXPECT_EQ(b.tensor->shape, a.tensor->shape);
  }
  EXPECT_EQ(computeGraph(g, {}).value(ir::ValueId{0}).tensor->dtype, ir::DType::kF32);
}

TEST(MixedPrecision, AllGatherInParamDtypeGradientReductionInReduceDtype) {
  // FSDP edge of up.weight: S(0) -> R all-gather forward, once more in backward (re-gather), and
  // the Partial gradient reduce-scattered back to S(0). With param bf16 / reduce f32 the two
  // gathers move half the bytes and the reduce-scatter the same bytes as in f32. The memory row
  // keeps the stored (f32) bytes.
  ir::Graph g = ir::testing_graphs::toyBlock(64);
  spec::Spec spec = specFor({8}, {"dp"});
  spec.inputs["x"] = {Placement::shard(0)};
  auto f32 = build(g, spec);
  spec.mixed_precision.param_dtype = ir::DType::kBF16;
  spec.mixed_precision.reduce_dtype = ir::DType::kF32;
  auto bf16 = build(g, spec);
  ASSERT_TRUE(f32.ok() && bf16.ok());
  int w = nodeOf(*bf16, g, "up.weight"), up = nodeOf(*bf16, g, "h");
  const PlacementTuple s0 = {Placement::shard(0)}, r = {Placement::replicate()};
  size_t ws = 0, us = 0;
  while (*bf16->strategies[w][ws].outputs[0] != s0) ++ws;
  for (; us < bf16->strategies[up].size(); ++us) {
    const auto& st = bf16->strategies[up][us];
    if (*st.inputs[0] == s0 && *st.inputs[1] == r) break;
  }
  ASSERT_LT(us, bf16->strategies[up].size());
  const ir::TensorMeta stored = *g.value(g.node(bf16->graph_nodes[w]).outputs[0]).tensor;
  ir::TensorMeta half = stored;
  half.dtype = ir::DType::kBF16;
  half.requires_grad = false;
  ir::TensorMeta full = stored;
  full.requires_grad = false;
  auto gather16 = cost::planRedistribution(half, s0, r, spec.mesh);
  auto gather32 = cost::planRedistribution(full, s0, r, spec.mesh);
  auto reduce32 = cost::planRedistribution(full, {Placement::partial()}, s0, spec.mesh);
  ASSERT_TRUE(gather16.ok() && gather32.ok() && reduce32.ok());
  ASSERT_EQ(gather16->steps.size(), 1u);
  EXPECT_EQ(gather16->steps[0].full_bytes * 2, gather32->steps[0].full_bytes);
  EXPECT_LT(gather16->forward_us, gather32->forward_us);
  size_t n = bf16->strategies[up].size();
  double want16 = 2 * gather16->forward_us + reduce32->forward_us;
  double want32 = 2 * gather32->forward_us + reduce32->forward_us;
  EXPECT_NEAR(edgeBetween(*bf16, w, up)->cost(ws, us, n), want16, 1e-9 * want16);
  EXPECT_NEAR(edgeBetween(*f32, w, up)->cost(ws, us, n), want32, 1e-9 * want32);
  EXPECT_EQ(bf16->problem.nodes[w].memory, f32->problem.nodes[w].memory);
  EXPECT_EQ(bf16->total_param_bytes, f32->total_param_bytes);
}

TEST(MixedPrecision, Bf16ParamsWithF32ReduceFlipFsdpToTp) {
  // toy_block on [8], batch-sharded input, default budget (every weight byte sharded). Two ways to
  // run it: FSDP (weights gathered twice, gradients reduce-scattered: 3 weight-sized transfers,
  // activations stay batch-sharded, h S(0)) or Megatron TP (up column-, down row-parallel: no
  // weight moves, the activations do, h S(2)). In f32 batch 64 is TP and batch 96 FSDP. With
  // param bf16 and reduce f32 (the usual FSDP2 policy) FSDP's cost falls to 2/3 (two of its three
  // transfers halve) while TP's falls to 1/2 (all its traffic is bf16 activations), so near the
  // crossover (batch 96) the plan flips to TP; with reduce bf16 too both halve and FSDP stays.
  ir::Graph g = ir::testing_graphs::toyBlock(96);
  auto hidden = [&](std::optional<ir::DType> param, std::optional<ir::DType> reduce) {
    spec::Spec spec = specFor({8}, {"dp"});
    spec.inputs["x"] = {Placement::shard(0)};
    spec.mixed_precision.param_dtype = param;
    spec.mixed_precision.reduce_dtype = reduce;
    auto gp = buildGraphProblem(
        g, strategy::enumerate(computeGraph(g, spec.mixed_precision), spec.mesh), spec);
    EXPECT_TRUE(gp.ok());
    auto s = solveGraphProblem(*gp);
    EXPECT_TRUE(s.ok());
    int h = nodeOf(*gp, g, "h");
    return *gp->strategies[h][s->choice[h]].outputs[0];
  };
  EXPECT_EQ(hidden(std::nullopt, std::nullopt), PlacementTuple{Placement::shard(0)});  // FSDP
  EXPECT_EQ(hidden(ir::DType::kBF16, ir::DType::kF32), PlacementTuple{Placement::shard(2)});  // TP
  EXPECT_EQ(hidden(ir::DType::kBF16, ir::DType::kBF16), PlacementTuple{Placement::shard(0)});
}

}  // namespace
}  // namespace apc::solver
