//===- tests/plan/explain_diff_test.cpp - explain, diff and dot ------------===//
//
// explainNode's statuses on a hand-built five-strategy problem with an exact answer per
// alternative, then on the toy block's plans (CHOSEN once per node, pins and the memory budget as
// UNAVAILABLE, no available alternative cheaper in context of an optimal plan); diffPlans of a plan
// with itself and of FSDP-like against DDP-like plans; node lookup; the Graphviz output.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <map>

#include "apc/report/diff.h"
#include "apc/report/explain.h"
#include "apc/report/report.h"
#include "plan_fixtures.h"

namespace apc::plan {
namespace {

using mesh::Placement;
using mesh::PlacementTuple;
using testing::planOf;
using testing::toySpec2x4;
using testing::toySpec8;

strategy::Strategy leaf(PlacementTuple t) {
  strategy::Strategy s;
  s.outputs = {std::move(t)};
  return s;
}

strategy::Strategy unary(PlacementTuple in, PlacementTuple out) {
  strategy::Strategy s;
  s.inputs = {std::move(in)};
  s.outputs = {std::move(out)};
  return s;
}

/// u (6 strategies) -> v (2 strategies, pinned to 0). Chosen: u = 0, v = 0. With v at 0, u's
/// alternatives cost (compute, out-edge):
///   0: (5, 0)  CHOSEN                  context 5
///   1: (1, 10) CHEAPER-HERE-BUT-COSTLIER-OVERALL  here 1 < 5, context 11
///   2: (5, 0)  TIE                     context 5
///   3: (5, inf) UNAVAILABLE            no redistribution into v
///   4: (7, 1)  COSTLIER                context 8
///   5: (0, 0)  UNAVAILABLE             its 100 bytes break the memory bound (high 50)
struct HandMade {
  solver::GraphProblem gp;
  Plan plan;
};

HandMade handMade() {
  HandMade h;
  using solver::kInfinity;
  PlacementTuple R = {Placement::replicate()}, S0 = {Placement::shard(0)},
                 S1 = {Placement::shard(1)};
  solver::ProblemNode u;
  u.name = "u";
  u.costs = {5, 1, 5, 5, 7, 0};
  u.memory = {10, 10, 10, 10, 10, 100};
  solver::ProblemNode v;
  v.name = "v";
  v.costs = {3, 1};
  v.pinned = 0;
  v.pin_group = "pins";
  h.gp.problem.nodes = {u, v};
  solver::ProblemEdge e;
  e.src = 0;
  e.dst = 1;
  //          v=0        v=1
  e.costs = {0, 4, 10, 0, 0, 9, kInfinity, 0, 1, 0, 0, 0};
  h.gp.problem.edges = {e};
  h.gp.problem.memory = solver::MemoryBound{0, 50};
  h.gp.graph_nodes = {ir::NodeId(0), ir::NodeId(1)};
  h.gp.strategies = {{leaf(R), leaf(S0), leaf(R), leaf(S1), leaf(S0), leaf(R)},
                     {unary(R, R), unary(S0, S0)}};
  h.gp.edge_input = {0};
  h.plan.spec = testing::specFor({4}, {"dp"});
  h.plan.solver.status = PlanStatus::kOptimal;
  for (const char* name : {"u", "v"}) {
    PlanNode n;
    n.name = name;
    n.kind = "op";
    n.op = "aten::test";
    n.strategy_index = 0;
    h.plan.nodes.push_back(n);
  }
  h.plan.nodes[0].num_strategies = 6;
  h.plan.nodes[1].num_strategies = 2;
  return h;
}

std::map<uint32_t, const Alternative*> byIndex(const NodeExplanation& e) {
  std::map<uint32_t, const Alternative*> m;
  for (const Alternative& a : e.alternatives) m[a.index] = &a;
  return m;
}

TEST(Explain, HandMadeProblemGivesEveryStatus) {
  HandMade h = handMade();
  auto e = explainNode(h.plan, h.gp, 0);
  ASSERT_TRUE(e.ok()) << e.error().message();
  ASSERT_EQ(e->alternatives.size(), 6u);
  EXPECT_EQ(e->alternatives[0].index, 0u);  // the chosen one first
  auto a = byIndex(*e);
  EXPECT_EQ(a[0]->status, AlternativeStatus::kChosen);
  EXPECT_EQ(a[1]->status, AlternativeStatus::kCheaperHereCostlierOverall);
  EXPECT_DOUBLE_EQ(a[1]->here_us, 1);
  EXPECT_DOUBLE_EQ(a[1]->context_us, 11);
  EXPECT_DOUBLE_EQ(a[1]->delta_us, 6);
  EXPECT_EQ(a[2]->status, AlternativeStatus::kTie);
  EXPECT_EQ(a[3]->status, AlternativeStatus::kUnavailable);
  EXPECT_NE(a[3]->why.find("%v (input 0) needs R"), std::string::npos) << a[3]->why;
  EXPECT_EQ(a[4]->status, AlternativeStatus::kCostlier);
  EXPECT_DOUBLE_EQ(a[4]->delta_us, 3);
  EXPECT_EQ(a[5]->status, AlternativeStatus::kUnavailable);
  EXPECT_NE(a[5]->why.find("parameter memory would be"), std::string::npos) << a[5]->why;
  EXPECT_EQ(a[5]->param_bytes_per_rank, 100);
  // Available ones by context cost, unavailable ones last.
  std::vector<uint32_t> order;
  for (const Alternative& x : e->alternatives) order.push_back(x.index);
  EXPECT_EQ(order, (std::vector<uint32_t>{0, 2, 4, 1, 3, 5}));

  auto ev = explainNode(h.plan, h.gp, 1);
  ASSERT_TRUE(ev.ok());
  auto b = byIndex(*ev);
  EXPECT_EQ(b[0]->status, AlternativeStatus::kChosen);
  EXPECT_NE(b[0]->why.find("pinned"), std::string::npos);
  EXPECT_EQ(b[1]->status, AlternativeStatus::kUnavailable);
  EXPECT_NE(b[1]->why.find("pinned to R -> R by the 'pins' constraints"), std::string::npos)
      << b[1]->why;
  EXPECT_DOUBLE_EQ(b[1]->in_comm_us, 4);

  std::string text = explanationText(h.plan, *e);
  for (const char* s :
       {"CHOSEN", "TIE", "CHEAPER-HERE-BUT-COSTLIER-OVERALL", "COSTLIER", "UNAVAILABLE"})
    EXPECT_NE(text.find(s), std::string::npos) << s;
}

TEST(Explain, CheaperInContextOnlyWithoutOptimality) {
  HandMade h = handMade();
  h.plan.nodes[0].strategy_index = 4;  // not the best for u
  h.plan.solver.status = PlanStatus::kTimeLimit;
  auto e = explainNode(h.plan, h.gp, 0);
  ASSERT_TRUE(e.ok());
  auto a = byIndex(*e);
  EXPECT_EQ(a[4]->status, AlternativeStatus::kChosen);
  EXPECT_EQ(a[0]->status, AlternativeStatus::kCheaperInContext);
  EXPECT_NE(a[0]->why.find("time_limit"), std::string::npos);
}

TEST(Explain, ToyBlockStatusesAreConsistent) {
  for (const spec::Spec& spec : {toySpec2x4(), toySpec8()}) {
    ir::Graph g = ir::testing_graphs::toyBlock(spec.mesh.ndim() == 1 ? 512 : 8);
    auto p = planOf(g, spec);
    const Plan& plan = p.result.plan;
    std::map<AlternativeStatus, int> seen;
    for (uint32_t v = 0; v < plan.nodes.size(); ++v) {
      auto e = explainNode(plan, p.built.gp, v, &g);
      ASSERT_TRUE(e.ok()) << e.error().message();
      int chosen = 0;
      const Alternative& c = e->alternatives[0];
      EXPECT_EQ(c.status, AlternativeStatus::kChosen);
      EXPECT_NEAR(c.here_us, plan.nodes[v].cost_us, 1e-6 * (1 + c.here_us)) << plan.nodes[v].name;
      for (const Alternative& a : e->alternatives) {
        ++seen[a.status];
        chosen += a.status == AlternativeStatus::kChosen;
        // An optimal plan has no available alternative that is cheaper in context.
        EXPECT_NE(a.status, AlternativeStatus::kCheaperInContext)
            << plan.nodes[v].name << " " << a.strategy << " " << a.why;
        if (a.status == AlternativeStatus::kCostlier ||
            a.status == AlternativeStatus::kCheaperHereCostlierOverall) {
          EXPECT_GT(a.context_us, c.context_us);
        }
        if (a.status == AlternativeStatus::kCheaperHereCostlierOverall) {
          EXPECT_LT(a.here_us, c.here_us);
        }
      }
      EXPECT_EQ(chosen, 1);
    }
    EXPECT_GT(seen[AlternativeStatus::kUnavailable], 0);  // the pinned input's other placements
    EXPECT_GT(seen[AlternativeStatus::kCostlier], 0);
  }
}

TEST(Explain, DefaultBudgetMakesReplicatedWeightsUnavailable) {
  ir::Graph g = ir::testing_graphs::toyBlock(512);
  auto p = planOf(g, toySpec8());
  auto w = findNode(p.result.plan, "up.weight");
  ASSERT_TRUE(w.ok());
  auto e = explainNode(p.result.plan, p.built.gp, *w, &g);
  ASSERT_TRUE(e.ok());
  bool found = false;
  for (const Alternative& a : e->alternatives)
    if (a.strategy == "-> R") {
      found = true;
      EXPECT_EQ(a.status, AlternativeStatus::kUnavailable);
      EXPECT_NE(a.why.find("outside the budget"), std::string::npos) << a.why;
    }
  EXPECT_TRUE(found);
}

TEST(Explain, FindNodesAndTopList) {
  ir::Graph g = ir::testing_graphs::toyBlock();
  auto p = planOf(g, toySpec2x4());
  const Plan& plan = p.result.plan;
  EXPECT_EQ(*findNode(plan, "h"), 3u);
  EXPECT_EQ(*findNode(plan, "%h"), 3u);
  auto missing = findNode(plan, "up.weigth");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code(), ErrorCode::kNotFound);
  EXPECT_NE(missing.error().message().find("did you mean up.weight"), std::string::npos)
      << missing.error().message();
  auto up = findModuleNode(plan, "up");
  ASSERT_TRUE(up.ok());
  EXPECT_EQ(plan.nodes[*up].name, "h");
  EXPECT_FALSE(findModuleNode(plan, "nowhere").ok());
  std::vector<uint32_t> top = costliestNodes(plan, 3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_GE(plan.nodes[top[0]].cost_us, plan.nodes[top[1]].cost_us);
  EXPECT_GE(plan.nodes[top[1]].cost_us, plan.nodes[top[2]].cost_us);
  std::string text = topNodesText(plan, 3);
  EXPECT_NE(text.find("costliest 3 of"), std::string::npos) << text;
  nlohmann::json j = explainJson(plan, 3, nullptr);
  EXPECT_EQ(j["top"].size(), 3u);
  EXPECT_FALSE(j.contains("node"));
}

TEST(Explain, DotGraphIsColouredByPlacement) {
  ir::Graph g = ir::testing_graphs::toyBlock();
  auto p = planOf(g, toySpec2x4());
  std::string dot = dotGraph(p.result.plan);
  EXPECT_EQ(dot.rfind("digraph plan {", 0), 0u);
  EXPECT_NE(dot.find("fillcolor="), std::string::npos);
  EXPECT_NE(dot.find("cluster_legend"), std::string::npos);
  EXPECT_NE(dot.find("n0 -> n3"), std::string::npos) << dot;  // x feeds the first linear
  // Issue 15 finding 4: parameters are drawn, modules are clusters, and a communicating edge
  // carries the label it is given.
  EXPECT_NE(dot.find("up.weight"), std::string::npos) << dot;
  EXPECT_NE(dot.find("label=\"up\""), std::string::npos) << dot;
  EXPECT_EQ(dot.substr(dot.size() - 2), "}\n");
  DotOptions options;
  options.parameters = false;
  const PlanNode& linear = p.result.plan.nodes[3];
  ASSERT_TRUE(linear.graph_node.has_value());
  options.edge_labels[{*linear.graph_node, 0}] = "AG(dp) 4 MiB";
  std::string plain = dotGraph(p.result.plan, options);
  EXPECT_EQ(plain.find("up.weight"), std::string::npos);
  EXPECT_NE(plain.find("n0 -> n3 [label=\"AG(dp) 4 MiB\""), std::string::npos) << plain;
}

TEST(Diff, PlanAgainstItselfIsEmpty) {
  ir::Graph g = ir::testing_graphs::toyBlock();
  Plan plan = planOf(g, toySpec2x4()).result.plan;
  PlanDiff d = diffPlans(plan, plan);
  EXPECT_TRUE(d.empty());
  EXPECT_TRUE(d.notes.empty());
  EXPECT_TRUE(d.cost_changes.empty());
  EXPECT_EQ(d.total_delta_us, 0);
  EXPECT_NE(diffText(d).find("no differences in placements"), std::string::npos);
  EXPECT_TRUE(toJson(d)["identical_placements"].get<bool>());
}

TEST(Diff, FsdpAgainstDdpListsTheWeights) {
  // 1-d mesh, large batch: the default budget shards the weights, high = 1 replicates them
  // (tests/solver/graph_problem_test.cpp derives both).
  ir::Graph g = ir::testing_graphs::toyBlock(512);
  spec::Spec fsdp = toySpec8();
  spec::Spec ddp = toySpec8();
  ddp.memory_budget.high = 1.0;
  Plan a = planOf(g, fsdp).result.plan;
  Plan b = planOf(g, ddp).result.plan;
  PlanDiff d = diffPlans(a, b);
  EXPECT_FALSE(d.empty());
  ASSERT_EQ(d.parameters.size(), 2u);
  for (const ParameterChange& c : d.parameters) {
    EXPECT_TRUE(c.placement_a[0].isShard()) << c.name;
    EXPECT_EQ(c.placement_b, PlacementTuple{mesh::Placement::replicate()}) << c.name;
    EXPECT_EQ(c.bytes_per_rank_b, 8 * c.bytes_per_rank_a) << c.name;
  }
  bool weight_listed = false;
  for (const NodeChange& c : d.nodes) weight_listed = weight_listed || c.name == "up.weight";
  EXPECT_TRUE(weight_listed);
  // The node deltas account for the whole difference.
  EXPECT_NEAR(d.changed_delta_us + d.cost_change_delta_us, d.total_delta_us,
              1e-6 * std::abs(a.totals.total_us));
  EXPECT_LT(d.total_delta_us, 0);  // DDP is cheaper when memory allows it
  ASSERT_EQ(d.notes.size(), 1u);
  EXPECT_NE(d.notes[0].find("memory budgets differ"), std::string::npos);
  std::string text = diffText(d);
  EXPECT_NE(text.find("up.weight"), std::string::npos) << text;
  EXPECT_NE(text.find("total delta"), std::string::npos) << text;
  // The totals come first, before the changes.
  EXPECT_LT(text.find("total delta"), text.find("with different placements")) << text;
}

// Issue 35: explain --by module sums every node into its module (a stack of repeated layers is
// one row), and the rows reconcile with the step the plan reports.
TEST(Explain, CostliestModulesReconcileWithTheStep) {
  ir::Graph g = ir::testing_graphs::toyBlock(512);
  Plan p = planOf(g, toySpec8()).result.plan;
  std::vector<ModuleCost> rows = costliestModules(p, 1000);
  ASSERT_FALSE(rows.empty());
  double sum = 0;
  int nodes = 0;
  for (const ModuleCost& r : rows) {
    sum += r.cost_us;
    nodes += r.nodes;
  }
  EXPECT_EQ(nodes, static_cast<int>(p.nodes.size()));
  EXPECT_NEAR(sum, p.totals.total_us, 1e-6 * std::max(1.0, p.totals.total_us));
  for (size_t i = 1; i < rows.size(); ++i) EXPECT_GE(rows[i - 1].cost_us, rows[i].cost_us);
  EXPECT_EQ(costliestModules(p, 1).size(), 1u);
  EXPECT_NE(topModulesText(p, 5).find("costliest"), std::string::npos);
}

// Issue 35: a deep model's diff opens with its totals and the changes per module, repeated
// layers that changed alike on one line, in text and JSON.
TEST(Diff, ChangesAreSummarizedPerModuleWithRepeatedLayersOnce) {
  PlanDiff d;
  auto change = [&](const std::string& module, double delta) {
    NodeChange c;
    c.name = module + ".op";
    c.module_path = module;
    c.delta_us = delta;
    d.nodes.push_back(c);
  };
  change("tok_embeddings", 5);
  for (int layer = 0; layer < 4; ++layer) {
    change("layers." + std::to_string(layer) + ".attention.wq", layer == 0 ? 7 : 2);
    change("layers." + std::to_string(layer) + ".feed_forward.w1", 1);
  }
  change("model.layers.0.mlp", 3);
  change("", 0);
  std::vector<ModuleChanges> m = changesByModule(d);
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[0].module, "tok_embeddings");
  EXPECT_EQ(m[1].module, "layers.0");  // differs from the others (delta 8 against 3)
  EXPECT_EQ(m[1].nodes, 2);
  EXPECT_DOUBLE_EQ(m[1].delta_us, 8);
  EXPECT_EQ(m[2].module, "layers.1-3");
  EXPECT_EQ(m[2].layers, 3);
  EXPECT_EQ(m[2].nodes, 2);
  EXPECT_DOUBLE_EQ(m[2].delta_us, 3);
  EXPECT_EQ(m[3].module, "model.layers.0");
  EXPECT_EQ(m[4].module, "-");
  const std::string text = diffText(d);
  EXPECT_LT(text.find("total delta"), text.find("changed placements by module:")) << text;
  EXPECT_LT(text.find("changed placements by module:"), text.find("with different placements"))
      << text;
  EXPECT_NE(text.find("layers.1-3 (3 alike, each)"), std::string::npos) << text;
  const nlohmann::json j = toJson(d);
  ASSERT_EQ(j["by_module"].size(), 5u);
  EXPECT_EQ(j["by_module"][2]["module"], "layers.1-3");
  EXPECT_EQ(j["by_module"][2]["layers"], 3);
}

}  // namespace
}  // namespace apc::plan

namespace apc::plan {
namespace {

/// dropout(x, p, train) nodes on one input: p as given, train a constant.
ir::Graph dropoutGraph(const std::vector<std::pair<double, bool>>& calls) {
  ir::Graph g;
  ir::Value x;
  x.type = ir::ValueType::kTensor;
  x.tensor = ir::TensorMeta{{ir::Dim::fixed(4), ir::Dim::fixed(8)}, ir::DType::kF32, false};
  ir::ValueId xv = g.addValue(x);
  ir::Node in;
  in.kind = ir::NodeKind::kInput;
  in.op = "input";
  in.name = "x";
  in.outputs = {xv};
  g.addNode(in);
  for (const auto& [p, train] : calls) {
    ir::Node n;
    n.op = "aten::dropout";
    n.module_path = "drop";
    n.inputs = {xv, g.addConstant(ir::ValueType::kFloat, p),
                g.addConstant(ir::ValueType::kBool, train)};
    n.outputs = {g.addValue(x)};
    g.addNode(n);
  }
  return g;
}

TEST(Randomness, DropoutInTrainingIsNamedAndSaidToMatchInDistributionOnly) {
  ir::Graph none = dropoutGraph({{0.0, true}, {0.5, false}});
  EXPECT_TRUE(randomNodes(none).empty());
  EXPECT_EQ(randomnessNote(none), "");
  ir::Graph some = dropoutGraph({{0.1, true}, {0.0, true}, {0.2, true}});
  EXPECT_EQ(randomNodes(some).size(), 2u);
  std::string note = randomnessNote(some);
  EXPECT_NE(note.find("random: 2 nodes draw random numbers (aten::dropout x2; first in drop)"),
            std::string::npos)
      << note;
  EXPECT_NE(note.find("in distribution only"), std::string::npos) << note;
}

TEST(Randomness, SamplingOpsAndTheirInPlaceFormsAreRandomLookalikesAreNot) {
  ir::Graph g = dropoutGraph({});
  const ir::ValueId x = g.node(ir::NodeId(0)).outputs[0];
  for (const char* op : {"aten::rand", "aten::bernoulli_", "aten::randn_like", "aten::uniform_",
                         "aten::randomize", "aten::add_", "aten::rand__", "aten::_", "aten::"}) {
    ir::Node n;
    n.op = op;
    n.inputs = {x};
    n.outputs = {g.addValue(g.value(x))};
    g.addNode(n);
  }
  std::vector<std::string> found;
  for (ir::NodeId id : randomNodes(g)) found.push_back(g.node(id).op);
  EXPECT_EQ(found, (std::vector<std::string>{"aten::rand", "aten::bernoulli_", "aten::randn_like",
                                             "aten::uniform_"}));
}

}  // namespace
}  // namespace apc::plan
