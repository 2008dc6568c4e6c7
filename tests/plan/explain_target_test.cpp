//===- tests/plan/explain_target_test.cpp - --target and --matrix ----------===//
//
// Issue 35: explainTarget (`apc explain PLAN --target`, the API's explain_placement(target)) on a
// hand-made problem with an exact answer and on the toy block's plans (current costs reconcile
// with the plan's, a target equal to a node's chosen output costs it nothing more), and
// redistributionMatrix (`--matrix`, print_costs_for_node(node, input)): the plan's pair holds
// exactly the cost the plan charged on that edge, for every edge of the plan.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <set>

#include "apc/report/explain.h"
#include "plan_fixtures.h"

namespace apc::plan {
namespace {

using mesh::Placement;
using mesh::PlacementTuple;

/// u (3 strategies, outputs R, S(0), S(0)) -> v (2 strategies, R -> R and S(0) -> S(0), pinned
/// to the first). Chosen: u = 0, v = 0. Edge costs u -> v: from R: (0, 4), from S(0): (10, 0),
/// (2, 0).
struct TargetHandMade {
  solver::GraphProblem gp;
  Plan plan;
};

TargetHandMade targetHandMade() {
  TargetHandMade h;
  PlacementTuple R = {Placement::replicate()}, S0 = {Placement::shard(0)};
  solver::ProblemNode u;
  u.name = "u";
  u.costs = {5, 1, 3};
  solver::ProblemNode v;
  v.name = "v";
  v.costs = {3, 1};
  v.pinned = 0;
  v.pin_group = "pins";
  h.gp.problem.nodes = {u, v};
  solver::ProblemEdge e;
  e.src = 0;
  e.dst = 1;
  e.costs = {0, 4, 10, 0, 2, 0};
  h.gp.problem.edges = {e};
  h.gp.graph_nodes = {ir::NodeId(0), ir::NodeId(1)};
  auto leafOf = [](PlacementTuple t) {
    strategy::Strategy s;
    s.outputs = {std::move(t)};
    return s;
  };
  auto unaryOf = [](PlacementTuple in, PlacementTuple out) {
    strategy::Strategy s;
    s.inputs = {std::move(in)};
    s.outputs = {std::move(out)};
    return s;
  };
  h.gp.strategies = {{leafOf(R), leafOf(S0), leafOf(S0)}, {unaryOf(R, R), unaryOf(S0, S0)}};
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
  h.plan.nodes[0].strategy = "-> R";
  h.plan.nodes[1].strategy = "R -> R";
  h.plan.nodes[1].in_edges = {PlanEdge{0, 0, 0.0}};
  return h;
}

TEST(ExplainTarget, HandMadeProblemGivesTheExactAnswer) {
  TargetHandMade h = targetHandMade();
  auto t = explainTarget(h.plan, h.gp, {Placement::shard(0)});
  ASSERT_TRUE(t.ok()) << t.error().message();
  ASSERT_EQ(t->rows.size(), 2u);
  // u: the cheapest S(0) strategy here is 1 (compute 1; 3 for strategy 2), against 5 chosen.
  const TargetRow& u = t->rows[0];
  EXPECT_EQ(u.current_us, 5);
  ASSERT_TRUE(u.target_index.has_value());
  EXPECT_EQ(*u.target_index, 1u);
  EXPECT_EQ(u.target_us, 1);
  EXPECT_EQ(u.delta_us, -4);
  EXPECT_FALSE(u.already);
  // v: its S(0) strategy is pinned away.
  const TargetRow& v = t->rows[1];
  EXPECT_EQ(v.current_us, 3);  // compute 3 + edge 0
  EXPECT_FALSE(v.target_index.has_value());
  EXPECT_NE(v.why.find("pinned by the 'pins' constraints"), std::string::npos) << v.why;
  EXPECT_EQ(t->can, 1u);
  EXPECT_EQ(t->already, 0u);
  EXPECT_EQ(t->total_delta_us, -4);
  EXPECT_EQ(t->current_us, 8);
  // Replicated: both already are, at no delta.
  auto r = explainTarget(h.plan, h.gp, {Placement::replicate()});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->already, 2u);
  EXPECT_EQ(r->total_delta_us, 0);
  // A target of the wrong length is refused.
  auto bad = explainTarget(h.plan, h.gp, {Placement::replicate(), Placement::replicate()});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.error().message().find("has 2 entries but the mesh"), std::string::npos)
      << bad.error().message();
  const std::string text = targetText(*t);
  EXPECT_NE(text.find("target S(0): 1 of 2 nodes can output it"), std::string::npos) << text;
  EXPECT_NE(text.find("node-local"), std::string::npos) << text;
  nlohmann::json j = targetJson(h.plan, *t);
  EXPECT_EQ(j["target"], "S(0)");
  EXPECT_TRUE(j["node_local"].get<bool>());
  EXPECT_EQ(j["total_delta_us"].get<double>(), -4);
  EXPECT_TRUE(j["nodes"][1]["target_strategy"].is_null());
}

TEST(ExplainTarget, ToyBlockCostsReconcileAndTheChosenPlacementCostsNothing) {
  for (const spec::Spec& spec : {testing::toySpec2x4(), testing::toySpec8()}) {
    ir::Graph g = ir::testing_graphs::toyBlock(spec.mesh.ndim() == 1 ? 512 : 8);
    auto planned = testing::planOf(g, spec);
    const Plan& p = planned.result.plan;
    ASSERT_EQ(p.solver.status, PlanStatus::kOptimal);
    std::set<PlacementTuple> chosen_outputs;
    for (const PlanNode& n : p.nodes)
      if (!n.outputPlacements().empty()) chosen_outputs.insert(n.outputPlacements());
    ASSERT_FALSE(chosen_outputs.empty());
    if (spec.mesh.ndim() == 2) {
      EXPECT_GT(chosen_outputs.size(), 1u);
    }
    for (const PlacementTuple& target : chosen_outputs) {
      auto t = explainTarget(p, planned.built.gp, target);
      ASSERT_TRUE(t.ok()) << t.error().message();
      ASSERT_EQ(t->rows.size(), p.nodes.size());
      EXPECT_NEAR(t->current_us, p.totals.total_us, 1e-6 * std::max(1.0, p.totals.total_us));
      size_t already = 0;
      double sum = 0;
      for (const TargetRow& r : t->rows) {
        const PlanNode& n = p.nodes[r.node];
        EXPECT_NEAR(r.current_us, n.cost_us, 1e-6 * std::max(1.0, n.cost_us)) << n.name;
        if (r.target_index) sum += r.delta_us;
        if (n.outputPlacements() != target) continue;
        ++already;
        // The chosen strategy outputs the target: the cheapest one that does is no cheaper in an
        // optimal plan (same output, so the same consumers' cost), and the chosen one is there.
        EXPECT_TRUE(r.already) << n.name;
        ASSERT_TRUE(r.target_index.has_value()) << n.name << " " << r.why;
        EXPECT_NEAR(r.delta_us, 0, 1e-9 * std::max(1.0, n.cost_us)) << n.name;
      }
      EXPECT_EQ(t->already, already);
      EXPECT_GT(already, 0u);
      EXPECT_NEAR(t->total_delta_us, sum, 1e-9 * std::max(1.0, std::abs(sum)));
    }
  }
}

TEST(RedistributionMatrix, ThePlansPairHoldsWhatThePlanChargedOnEveryEdge) {
  for (const spec::Spec& spec : {testing::toySpec2x4(), testing::toySpec8()}) {
    ir::Graph g = ir::testing_graphs::toyBlock(spec.mesh.ndim() == 1 ? 512 : 8);
    auto planned = testing::planOf(g, spec);
    const Plan& p = planned.result.plan;
    size_t edges = 0, paying = 0;
    for (uint32_t v = 0; v < p.nodes.size(); ++v) {
      for (const PlanEdge& e : p.nodes[v].in_edges) {
        auto m = redistributionMatrix(p, planned.built.gp, v, e.input, &g);
        ASSERT_TRUE(m.ok()) << p.nodes[v].name << " input " << e.input << ": "
                            << m.error().message();
        ++edges;
        paying += e.cost_us > 0;
        EXPECT_EQ(m->producer, e.from);
        ASSERT_EQ(m->us.size(), m->rows.size());
        ASSERT_LT(m->chosen_row, m->rows.size());
        ASSERT_LT(m->chosen_column, m->columns.size());
        // The same number up to the rounding of summing forward and backward in another order.
        EXPECT_NEAR(m->us[m->chosen_row][m->chosen_column], e.cost_us, 1e-9 * (1 + e.cost_us))
            << p.nodes[v].name << " input " << e.input;
        EXPECT_EQ(m->charged_us, e.cost_us);
        // The marked pair is the plan's placements: the producer's output, the input needed.
        EXPECT_EQ(m->rows[m->chosen_row], p.nodes[e.from].outputPlacements());
        if (p.nodes[v].kind == "op") {  // sinks keep no input placements
          ASSERT_LT(e.input, p.nodes[v].input_placements.size());
          ASSERT_TRUE(p.nodes[v].input_placements[e.input].has_value());
          EXPECT_EQ(m->columns[m->chosen_column], *p.nodes[v].input_placements[e.input]);
        }
        // Distinct placements per row and column.
        EXPECT_EQ(std::set<PlacementTuple>(m->rows.begin(), m->rows.end()).size(), m->rows.size());
        const std::string text = matrixText(p, *m);
        EXPECT_NE(text.find("*"), std::string::npos) << text;
      }
    }
    EXPECT_GT(edges, 3u);
    if (spec.mesh.ndim() == 2) {
      EXPECT_GT(paying, 0u);  // some edge communicates on 2x4
    }
  }
}

TEST(RedistributionMatrix, AnInputWithoutAProducerIsNamed) {
  ir::Graph g = ir::testing_graphs::toyBlock();
  auto planned = testing::planOf(g, testing::toySpec2x4());
  const Plan& p = planned.result.plan;
  auto w = findNode(p, "up.weight");
  ASSERT_TRUE(w.ok());
  auto m = redistributionMatrix(p, planned.built.gp, *w, 0, &g);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().code(), ErrorCode::kNotFound);
  EXPECT_NE(m.error().message().find("has no tensor inputs"), std::string::npos)
      << m.error().message();
  auto h = findNode(p, "h");
  ASSERT_TRUE(h.ok());
  auto past = redistributionMatrix(p, planned.built.gp, *h, 7, &g);
  ASSERT_FALSE(past.ok());
  EXPECT_NE(past.error().message().find("inputs with one: 0"), std::string::npos)
      << past.error().message();
}

}  // namespace
}  // namespace apc::plan
