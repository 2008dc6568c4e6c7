//===- tests/plan/plan_test.cpp - Plans: making, JSON round trip, hashes ---===//
//
// makePlan's per-node costs and totals against the solver's objective; the canonical JSON written,
// read back and written again gives the same bytes and the same Plan; reader errors name the JSON
// path; the content hash follows the spec; the memory budget flag and the effective budget.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <limits>

#include <nlohmann/json.hpp>

#include <cmath>

#include "apc/ir/proto_io.h"
#include "apc/mesh/placement_json.h"
#include "apc/plan/plan.h"
#include "apc/planner/pipeline.h"
#include "apc/planner/verify.h"
#include "apc/report/report.h"
#include "apc/solver/baselines.h"
#include "apc/support/hash.h"
#include "apc/support/json_reader.h"
#include "plan_fixtures.h"

namespace apc::plan {
namespace {

using testing::Planned;
using testing::planOf;
using testing::specFor;
using testing::toySource;
using testing::toySpec2x4;
using testing::toySpec8;

TEST(Hash, Sha256OfKnownStrings) {
  EXPECT_EQ(sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  auto missing = sha256File("/nonexistent/model.pt");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code(), ErrorCode::kNotFound);
}

TEST(CanonicalNumber, RoundsTo12DigitsAndIsIdempotent) {
  for (double x : {0.0, 1.0, 1.0 / 3.0, 123456.789012345678, 1e-7 / 3, 2.5e12 / 7, -0.0}) {
    double c = canonicalNumber(x);
    EXPECT_EQ(canonicalNumber(c), c) << x;
    EXPECT_NEAR(c, x, std::abs(x) * 1e-11) << x;
  }
  EXPECT_FALSE(std::signbit(canonicalNumber(-0.0)));
  EXPECT_TRUE(std::isinf(canonicalNumber(INFINITY)));
}

TEST(MakePlan, CostsAddUpToTheObjective) {
  ir::Graph g = ir::testing_graphs::toyBlock();
  auto p = planOf(g, toySpec2x4());
  const Plan& plan = p.result.plan;
  ASSERT_EQ(plan.nodes.size(), p.built.gp.problem.nodes.size());
  double compute = 0, comm = 0;
  for (const PlanNode& n : plan.nodes) {
    double in = 0;
    for (const PlanEdge& e : n.in_edges) in += e.cost_us;
    EXPECT_NEAR(n.comm_us, in, 1e-9 * (1 + in)) << n.name;
    EXPECT_NEAR(n.cost_us, n.compute_us + n.comm_us, 1e-9 * (1 + n.cost_us)) << n.name;
    compute += n.compute_us;
    comm += n.comm_us;
  }
  EXPECT_NEAR(plan.totals.compute_us, compute, 1e-9 * compute);
  EXPECT_NEAR(plan.totals.comm_us, comm, 1e-9 * (1 + comm));
  EXPECT_NEAR(plan.totals.total_us, p.result.solution.objective, 1e-9 * plan.totals.total_us);
  EXPECT_EQ(plan.solver.objective, canonicalNumber(p.result.solution.objective));
}

TEST(MakePlan, NodesParametersAndMemory) {
  ir::Graph g = ir::testing_graphs::toyBlock();
  auto p = planOf(g, toySpec2x4());
  const Plan& plan = p.result.plan;
  // Inputs, parameters and ops keep their names; op nodes are named after their output value.
  ASSERT_GE(plan.nodes.size(), 6u);
  EXPECT_EQ(plan.nodes[0].name, "x");
  EXPECT_EQ(plan.nodes[0].kind, "input");
  EXPECT_EQ(plan.nodes[0].pin_group, "inputs");
  EXPECT_EQ(plan.nodes[0].outputPlacements(),
            (PlacementTuple{mesh::Placement::shard(0), mesh::Placement::replicate()}));
  EXPECT_EQ(plan.nodes[3].name, "h");
  EXPECT_EQ(plan.nodes[3].op, "aten::linear");
  EXPECT_EQ(plan.nodes[3].module_path, "up");
  EXPECT_EQ(plan.nodes[3].input_placements.size(), 3u);
  EXPECT_FALSE(plan.nodes[3].input_placements[2]);  // the None bias
  ASSERT_EQ(plan.parameters.size(), 2u);
  EXPECT_EQ(plan.parameters[0].name, "up.weight");
  EXPECT_EQ(plan.parameters[0].module, "up");
  EXPECT_EQ(plan.parameters[0].shape, (std::vector<int64_t>{4096, 1024}));
  EXPECT_EQ(plan.parameters[0].dtype, "f32");
  EXPECT_EQ(plan.parameters[0].bytes, 4096 * 1024 * 4);
  // The default budget is 1/8 of the parameter bytes on 8 ranks.
  EXPECT_EQ(plan.totals.param_bytes_total, 2 * 4096 * 1024 * 4);
  EXPECT_LE(plan.totals.param_bytes_per_rank, plan.totals.param_bytes_total / 8);
  EXPECT_EQ(plan.totals.memory_high, canonicalNumber(1.0 / 8));
  EXPECT_EQ(plan.solver.status, PlanStatus::kOptimal);
  EXPECT_EQ(plan.solver.statusText(), "optimal");
  // The budget is tight (both weights must be fully sharded), so the exact reduction fixes them
  // and may leave nothing for the ILP: variables can be 0.
  EXPECT_GE(plan.solver.variables, 0);
  EXPECT_LE(plan.solver.sizes.nodes_after, plan.solver.sizes.nodes_before);
  EXPECT_EQ(plan.solver.sizes.nodes_before, plan.nodes.size());
}

TEST(PlanJson, RoundTripGivesTheSamePlanAndBytes) {
  ir::Graph g = ir::testing_graphs::toyBlock();
  spec::Spec spec = toySpec2x4();
  spec.outputs = spec::OutputPlacementTree::makeLeaf(
      {mesh::Placement::shard(0), mesh::Placement::replicate()});
  auto p = planOf(g, spec);
  const Plan& plan = p.result.plan;
  std::string text = toJsonText(plan);
  auto j = parseJsonText(text);
  ASSERT_TRUE(j.ok()) << j.error().message();
  auto back = planFromJson(*j);
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_TRUE(*back == plan);
  EXPECT_EQ(toJsonText(*back), text);
  // The output sink is last, has no graph node and is pinned by the outputs group.
  EXPECT_EQ(back->nodes.back().kind, "output");
  EXPECT_FALSE(back->nodes.back().graph_node);
  EXPECT_EQ(back->nodes.back().pin_group, "outputs");
  // No wall time in the file.
  EXPECT_TRUE((*j)["solver"]["seconds"].is_null());
  EXPECT_EQ(text.find("\"seconds\": null"), text.find("\"seconds\""));
}

TEST(PlanJson, CarriesThePlannedGraph) {
  ir::Graph g = ir::testing_graphs::toyBlock();
  Plan plan = planOf(g, toySpec2x4()).result.plan;
  auto back = plannedGraph(plan);
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(ir::serializeGraph(*back), ir::serializeGraph(g));
  // The problem rebuilt from the carried graph is the plan's.
  EXPECT_TRUE(rebuildProblem(*back, plan).ok());
  // Inputs that are not the plan's, missing bytes and damaged bytes are errors.
  Plan other = plan;
  other.model.inputs = {"x:f32[3,3]"};
  auto wrong = plannedGraph(other);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.error().message().find("x:f32[3,3]"), std::string::npos);
  other = plan;
  other.graph_bytes.clear();
  EXPECT_EQ(plannedGraph(other).error().code(), ErrorCode::kNotFound);
  other = plan;
  other.graph_bytes.resize(other.graph_bytes.size() / 2);
  EXPECT_FALSE(plannedGraph(other).ok());
  // The JSON reader checks the graph: bad base64, or bytes that are not a graph.
  auto j = parseJsonText(toJsonText(plan));
  ASSERT_TRUE(j.ok());
  for (const std::string& bad : {std::string("Zm9v!"), std::string("Zm9vYmFy")}) {
    (*j)["graph"] = bad;
    auto r = planFromJson(*j);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().message().rfind("$.graph: ", 0), 0u) << r.error().message();
  }
  // Without the key: read as a plan without a graph.
  j->erase("graph");
  auto none = planFromJson(*j);
  ASSERT_TRUE(none.ok()) << none.error().message();
  EXPECT_TRUE(none->graph_bytes.empty());
}

// canonicalText writes plain strings itself and leaves every other string to nlohmann's
// serializer: quotes, backslashes, control bytes, UTF-8 and invalid UTF-8 (replaced) must read
// back as nlohmann reads its own dump of them, and one-line lists stay nlohmann's bytes.
TEST(PlanJson, CanonicalTextEscapesLikeNlohmann) {
  const std::vector<std::string> strings = {"plain",
                                            "with \"quote\"",
                                            "back\\slash",
                                            std::string("nul\0byte", 8),
                                            "tab\tnewline\n",
                                            "\x7f del",
                                            "caf\xc3\xa9",
                                            "bad \xff utf8",
                                            "",
                                            std::string(80, 'x')};
  nlohmann::json doc = nlohmann::json::object();
  for (size_t i = 0; i < strings.size(); ++i) {
    doc["list"].push_back(strings[i]);
    doc[strings[i]] = {{"short", strings[i]}, {"n", i}};
  }
  std::string text = canonicalText(doc);
  auto back = parseJsonText(text);
  ASSERT_TRUE(back.ok()) << back.error().message();
  // The reference: nlohmann's own dump (invalid UTF-8 replaced), read back.
  nlohmann::json expected =
      nlohmann::json::parse(doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  EXPECT_EQ(*back, expected);
  for (size_t i = 0; i < strings.size(); ++i) {
    std::string dumped =
        nlohmann::json(strings[i]).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    EXPECT_NE(text.find(dumped), std::string::npos) << dumped;
  }
  EXPECT_EQ(canonicalText(*back), text);
}

TEST(PlanJson, StreamedTextEqualsTheTreeText) {
  // toJsonText streams the nodes; toJson reads its text back, and canonicalText lays that tree
  // out again: the streamed layout is the canonical one (a fixed point), on solved plans and on
  // plans edited into every branch of the layout: escaped strings, null and the longest numbers,
  // several outputs, untyped outputs, a pin group, no graph node, no nodes, no graph.
  std::vector<Plan> plans;
  ir::Graph toy = ir::testing_graphs::toyBlock();
  ir::Graph sizes = ir::testing_graphs::withSizeArithmetic();
  plans.push_back(planOf(toy, toySpec2x4()).result.plan);
  plans.push_back(planOf(toy, toySpec8()).result.plan);
  plans.push_back(planOf(sizes, specFor({2, 2}, {"a", "b"})).result.plan);
  ASSERT_GE(plans[0].nodes.size(), 4u);
  Plan edited = plans[0];
  edited.nodes[0].name = "quote \" back\\slash \t tab caf\xc3\xa9 bad \xff";
  edited.nodes[0].module_path = std::string(100, 'm');
  edited.nodes[1].compute_us = std::numeric_limits<double>::quiet_NaN();
  edited.nodes[1].comm_us = std::numeric_limits<double>::infinity();
  edited.nodes[1].cost_us = -1.2345678901234567e-300;
  edited.nodes[1].graph_node.reset();
  edited.nodes[1].pin_group = "inputs";
  edited.nodes[2].in_edges = {{4294967295u, 4294967295u, -1.2345678901234567e-300},
                              {0, 1, 0.0},
                              {7, 0, std::numeric_limits<double>::quiet_NaN()}};
  edited.nodes[2].outputs = {std::nullopt, edited.nodes[2].outputs.empty()
                                               ? std::optional<PlacementTuple>()
                                               : edited.nodes[2].outputs[0]};
  edited.nodes[3].outputs.clear();
  const PlacementTuple pair = {mesh::Placement::shard(0), mesh::Placement::replicate()};
  edited.nodes[3].input_placements.assign(12, pair);         // one line would be 157 characters
  const PlacementTuple wide(16, mesh::Placement::shard(1));  // 113 characters on one line
  edited.nodes[0].input_placements = {wide, std::nullopt, pair};
  edited.nodes[0].outputs = {wide, wide};
  plans.push_back(edited);
  Plan empty = plans[0];
  empty.nodes.clear();
  plans.push_back(empty);
  Plan no_graph = plans[0];  // a plan of apc before 0.2.0: no "graph" key
  ASSERT_FALSE(no_graph.graph_bytes.empty());
  no_graph.graph_bytes.clear();
  plans.push_back(no_graph);
  for (size_t i = 0; i < plans.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(toJsonText(plans[i]), canonicalText(toJson(plans[i])));
  }
  // The longest edge the plan can hold still fits on one line.
  EXPECT_NE(toJsonText(edited).find(
                "{\"cost_us\":-1.23456789012e-300,\"from\":4294967295,\"input\":4294967295}"),
            std::string::npos);
}

TEST(PlanJson, SameInputsGiveSameBytes) {
  ir::Graph g = ir::testing_graphs::toyBlock();
  std::string a = toJsonText(planOf(g, toySpec2x4()).result.plan);
  std::string b = toJsonText(planOf(g, toySpec2x4()).result.plan);
  EXPECT_EQ(a, b);
}

TEST(PlanJson, ReaderErrorsNameTheJsonPath) {
  ir::Graph g = ir::testing_graphs::toyBlock();
  nlohmann::json good = toJson(planOf(g, toySpec2x4()).result.plan);
  auto expectError = [&](auto mutate, const std::string& prefix) {
    nlohmann::json j = good;
    mutate(j);
    auto p = planFromJson(j);
    ASSERT_FALSE(p.ok()) << prefix;
    EXPECT_EQ(p.error().message().rfind(prefix, 0), 0u) << p.error().message();
    EXPECT_EQ(p.error().message().find('\n'), std::string::npos);
  };
  expectError([](auto& j) { j["nodes"][1]["cost_us"] = "fast"; }, "$.nodes[1].cost_us:");
  expectError([](auto& j) { j["nodes"][3]["in_edges"][0]["from"] = 99; },
              "$.nodes[3].in_edges[0].from:");
  expectError([](auto& j) { j["nodes"][0]["output_placements"] = {"S(0)"}; },
              "$.nodes[0].output_placements:");
  expectError([](auto& j) { j["nodes"][0]["output_placements"][0] = "Q"; },
              "$.nodes[0].output_placements[0]:");
  expectError([](auto& j) { j["totals"]["colour"] = 1; }, "$.totals.colour:");
  expectError([](auto& j) { j.erase("solver"); }, "$: missing key 'solver'");
  expectError([](auto& j) { j["format_version"] = 99; }, "$.format_version:");
  expectError([](auto& j) { j["solver"]["seconds"] = 1.5; }, "$.solver.seconds:");
  expectError([](auto& j) { j["spec"]["mesh"]["shape"] = {2, 0}; }, "$.spec.mesh.shape[1]");
  expectError([](auto& j) { j["parameters"][0]["node"] = 0; }, "$.parameters[0].node:");
  expectError([](auto& j) { j["nodes"][2]["index"] = 7; }, "$.nodes[2].index:");
}

TEST(PlanJson, FileErrorsNameThePath) {
  auto p = readPlanFile("/nonexistent/plan.json");
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().message().find("/nonexistent/plan.json"), std::string::npos);
}

TEST(ContentHash, FollowsSpecInputsAndOptions) {
  ir::Graph g = ir::testing_graphs::toyBlock();
  PlanSource src = testing::toySource(g);
  spec::Spec spec = toySpec2x4();
  solver::SolveGraphOptions o;
  std::string h = contentHash(src, spec, o);
  EXPECT_EQ(h.size(), 64u);
  EXPECT_EQ(contentHash(src, spec, o), h);
  spec::Spec other = spec;
  other.memory_budget.high = 1.0;
  EXPECT_NE(contentHash(src, other, o), h);
  PlanSource moved = src;
  moved.model_path = "elsewhere/toy_block.pt";  // the path is not content
  EXPECT_EQ(contentHash(moved, spec, o), h);
  PlanSource bigger = src;
  bigger.inputs = {"x:f32[16,128,1024]"};
  EXPECT_NE(contentHash(bigger, spec, o), h);
  solver::SolveGraphOptions no_reduce;
  no_reduce.reduce = false;
  EXPECT_NE(contentHash(src, spec, no_reduce), h);
}

// The plan library links no solver, so its reader checks baseline names against its own list:
// every name solver::baselineName gives reads back, an alias parseBaseline accepts does not.
TEST(PlanJson, BaselineNamesAgreeWithTheSolver) {
  ir::Graph g = ir::testing_graphs::toyBlock();
  Plan plan = testing::planOf(g, toySpec2x4()).result.plan;
  ASSERT_FALSE(plan.nodes.empty());
  auto withBaseline = [&](const std::string& name) {
    Plan b = plan;
    b.solver.baseline = name;
    b.solver.status = PlanStatus::kBaseline;
    b.content_hash = planContentHash(b);
    return planFromJson(toJson(b));
  };
  for (solver::Baseline b : solver::allBaselines()) {
    auto back = withBaseline(solver::baselineName(b));
    EXPECT_TRUE(back.ok()) << solver::baselineName(b) << ": " << back.error().message();
  }
  ASSERT_TRUE(solver::parseBaseline("zero3").ok());
  auto alias = withBaseline("zero3");
  ASSERT_FALSE(alias.ok());
  EXPECT_NE(alias.error().message().find("$.solver.baseline"), std::string::npos)
      << alias.error().message();
}

// The status is typed (PlanStatus): every status reads back as it was written, and a text that is
// none of them, or a "baseline <name>" that the baseline key does not repeat, is an error naming
// $.solver.status.
TEST(PlanJson, TheStatusIsTypedAndChecked) {
  ir::Graph g = ir::testing_graphs::toyBlock();
  Plan plan = testing::planOf(g, toySpec2x4()).result.plan;
  for (PlanStatus st : {PlanStatus::kOptimal, PlanStatus::kTimeLimit, PlanStatus::kFeasible}) {
    Plan p = plan;
    p.solver.status = st;
    p.content_hash = planContentHash(p);
    auto back = planFromJson(toJson(p));
    ASSERT_TRUE(back.ok()) << back.error().message();
    EXPECT_EQ(back->solver.status, st);
    EXPECT_EQ(back->solver.statusText(), p.solver.statusText());
  }
  auto withStatus = [&](const std::string& text, const std::string& baseline) {
    nlohmann::json j = toJson(plan);
    j["solver"]["status"] = text;
    if (!baseline.empty()) j["solver"]["baseline"] = baseline;
    return planFromJson(j);
  };
  for (auto [text, baseline] : {std::pair<std::string, std::string>{"done", ""},
                                {"baseline tp", ""},
                                {"baseline ddp", "fsdp"},
                                {"optimal", "ddp"}}) {
    auto r = withStatus(text, baseline);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.error().message().rfind("$.solver.status: ", 0), 0u) << r.error().message();
  }
}

// Issue 15 finding 5: settings that act only through the solution found are not hashed.
TEST(ContentHash, IgnoresThreadsAndTimeLimit) {
  ir::Graph g = ir::testing_graphs::toyBlock();
  PlanSource src = testing::toySource(g);
  spec::Spec spec = toySpec2x4();
  solver::SolveGraphOptions o;
  solver::SolveGraphOptions other = o;
  other.solver.threads = 2;
  other.solver.time_limit_s = 7;
  EXPECT_EQ(contentHash(src, spec, other), contentHash(src, spec, o));
}

// Issue 32: plans are verified, not trusted. The reader recomputes content_hash as makePlan made
// it (planContentHash, under the apc version the plan records) and checks each parameter against
// its node; verifyPlan checks every node's placements against its chosen strategy.
TEST(ContentHash, TheReaderChecksTheHashMakePlanMade) {
  ir::Graph g = ir::testing_graphs::toyBlock();
  Plan plan = planOf(g, toySpec2x4()).result.plan;
  EXPECT_EQ(plan.content_hash, planContentHash(plan));
  const nlohmann::json good = toJson(plan);
  ASSERT_TRUE(planFromJson(good).ok());
  auto expectError = [&](auto mutate, const std::string& prefix) {
    nlohmann::json j = good;
    mutate(j);
    auto p = planFromJson(j);
    ASSERT_FALSE(p.ok()) << prefix;
    EXPECT_EQ(p.error().message().rfind(prefix, 0), 0u) << p.error().message();
    EXPECT_EQ(p.error().message().find('\n'), std::string::npos);
  };
  const std::string changed = "$.content_hash: the plan's content hashes to ";
  expectError([](nlohmann::json& j) { j["content_hash"] = std::string(64, '0'); }, changed);
  expectError(
      [](nlohmann::json& j) {
        for (auto& n : j["nodes"])
          if (n["num_strategies"].get<int>() > 1) {
            n["strategy_index"] =
                (n["strategy_index"].get<int>() + 1) % n["num_strategies"].get<int>();
            break;
          }
      },
      changed);
  expectError(
      [](nlohmann::json& j) {
        j["spec"]["memory_budget"] = {{"low", 0.5}, {"high", 1.0}};
      },
      changed);
  expectError([](nlohmann::json& j) { j["model"]["sha256"] = std::string(64, 'a'); }, changed);
  expectError([](nlohmann::json& j) { j["apc_version"] = "0.0.1"; }, changed);
  ASSERT_FALSE(plan.parameters.empty());
  expectError(
      [&](nlohmann::json& j) {
        j["parameters"][0]["placement"] = mesh::toJson(
            plan.parameters[0].placement == mesh::replicated(2)
                ? PlacementTuple{mesh::Placement::shard(0), mesh::Placement::replicate()}
                : mesh::replicated(2));
      },
      "$.parameters[0].placement: parameter '" + plan.parameters[0].name + "' is placed ");
  // The hash is of the version the plan records: a plan another apc wrote reads back.
  Plan older = plan;
  older.apc_version = "0.0.1";
  older.content_hash = planContentHash(older);
  EXPECT_NE(older.content_hash, plan.content_hash);
  auto back = planFromJson(toJson(older));
  ASSERT_TRUE(back.ok()) << back.error().message();
}

TEST(PlanVerify, PlacementsFollowFromTheChosenStrategies) {
  ir::Graph g = ir::testing_graphs::toyBlock();
  for (const spec::Spec& spec : {toySpec2x4(), toySpec8()}) {
    SCOPED_TRACE(spec.mesh.toString());
    const Plan plan = planOf(g, spec).result.plan;
    ASSERT_TRUE(verifyPlan(g, plan).ok()) << verifyPlan(g, plan).error().message();
    const size_t ndim = spec.mesh.ndim();
    // Another placement than `t` on mesh dim 0: R <-> P for an output, R <-> S(0) for an input.
    auto other = [](PlacementTuple t, bool output) {
      t[0] = !t[0].isReplicate() ? mesh::Placement::replicate()
             : output            ? mesh::Placement::partial()
                                 : mesh::Placement::shard(0);
      return t;
    };
    auto expectRefused = [&](const Plan& edited, size_t i, const std::string& what) {
      Status st = verifyPlan(g, edited);
      ASSERT_FALSE(st.ok()) << "node " << i << " " << what;
      const std::string& m = st.error().message();
      EXPECT_EQ(st.error().code(), ErrorCode::kInvalidArgument);
      EXPECT_EQ(m.rfind("$.nodes[" + std::to_string(i) + "] '" + plan.nodes[i].name + "' (" +
                            plan.nodes[i].op + "): " + what,
                        0),
                0u)
          << m;
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    };
    int ops = 0;
    for (size_t i = 0; i < plan.nodes.size(); ++i) {
      const PlanNode& n = plan.nodes[i];
      if (!n.graph_node || n.outputs.empty() || !n.outputs[0]) continue;
      ASSERT_EQ(n.outputs[0]->size(), ndim);
      Plan edited = plan;  // an output's placement flipped (the P -> R)
      edited.nodes[i].outputs[0] = other(*n.outputs[0], true);
      expectRefused(edited, i, "outputs placed ");
      if (n.kind != "op") continue;
      ++ops;
      for (size_t k = 0; k < n.input_placements.size(); ++k) {
        if (!n.input_placements[k]) continue;
        edited = plan;
        edited.nodes[i].input_placements[k] = other(*n.input_placements[k], false);
        expectRefused(edited, i, "inputs placed ");
        break;
      }
      edited = plan;  // another strategy chosen, the placements left as they were
      if (n.num_strategies > 1) {
        edited.nodes[i].strategy_index = (n.strategy_index + 1) % n.num_strategies;
        EXPECT_FALSE(verifyPlan(g, edited).ok()) << i;
      }
      edited = plan;
      edited.nodes[i].num_strategies = n.num_strategies + 1;
      expectRefused(edited, i, "strategy ");
      edited = plan;
      edited.nodes[i].strategy = "RR -> RR (edited)";
      expectRefused(edited, i, "strategy text ");
    }
    EXPECT_GE(ops, 3);
    // A node left out, or pointing at a node of another kind.
    Plan edited = plan;
    size_t op = 0;
    while (plan.nodes[op].kind != "op") ++op;
    edited.nodes.erase(edited.nodes.begin() + static_cast<std::ptrdiff_t>(op));
    Status st = verifyPlan(g, edited);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.error().message().find("the plan has no node for graph node " +
                                        std::to_string(*plan.nodes[op].graph_node)),
              std::string::npos)
        << st.error().message();
    edited = plan;
    edited.nodes[op].graph_node = plan.nodes[0].graph_node;
    expectRefused(edited, op, "graph node ");
  }
}

TEST(Pipeline, InputShapesInTheInputFlagSyntax) {
  ir::Graph g = ir::testing_graphs::toyBlock(512);
  EXPECT_EQ(inputShapes(g), (std::vector<std::string>{"x:f32[512,128,1024]"}));
}

TEST(Pipeline, MemoryBudgetFlag) {
  auto b = parseMemoryBudget("0,0.25");
  ASSERT_TRUE(b.ok()) << b.error().message();
  EXPECT_EQ(b->low, 0);
  EXPECT_EQ(b->high, 0.25);
  auto open = parseMemoryBudget("0.1,");
  ASSERT_TRUE(open.ok());
  EXPECT_FALSE(open->high);
  for (const char* bad : {"0.5,0.25", "x,1", "0", "-1,1", "0,2", "0,0", "0,1,2"}) {
    auto e = parseMemoryBudget(bad);
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_EQ(e.error().message().rfind("--memory-budget", 0), 0u) << e.error().message();
  }
  EXPECT_NE(parseMemoryBudget("0.5,0.25").error().message().find("greater than high"),
            std::string::npos);
}

TEST(Pipeline, LowAboveTheDefaultHighIsAnError) {
  ir::Graph g = ir::testing_graphs::toyBlock();
  spec::Spec spec = toySpec2x4();
  spec.memory_budget.low = 0.5;  // the default high is 1/8
  auto built = buildProblem(g, spec);
  ASSERT_FALSE(built.ok());
  EXPECT_EQ(built.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(built.error().message().find("exceeds high 0.125"), std::string::npos)
      << built.error().message();
}

TEST(Pipeline, InfeasibleBudgetNamesTheMemoryBound) {
  ir::Graph g = ir::testing_graphs::toyBlock();
  spec::Spec spec = toySpec8();
  spec.memory_budget.high = 0.01;  // below 1/8: no placement of the weights fits
  auto built = buildProblem(g, spec);
  ASSERT_TRUE(built.ok()) << built.error().message();
  auto r = solveAndPlan(g, *built, spec, testing::toySource(g), {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kInfeasible);
  EXPECT_NE(r.error().message().find("memory"), std::string::npos) << r.error().message();
}

TEST(Pipeline, RebuildMatchesThePlanAndRejectsAnotherGraph) {
  ir::Graph g = ir::testing_graphs::toyBlock();
  auto p = planOf(g, toySpec2x4());
  auto again = rebuildProblem(g, p.result.plan);
  ASSERT_TRUE(again.ok()) << again.error().message();
  EXPECT_EQ(again->gp.problem.nodes.size(), p.result.plan.nodes.size());
  ir::Graph other = ir::testing_graphs::withSizeArithmetic();
  auto bad = rebuildProblem(other, p.result.plan);
  EXPECT_FALSE(bad.ok());
}

TEST(Report, SummaryAndLog) {
  ir::Graph g = ir::testing_graphs::toyBlock();
  auto p = planOf(g, toySpec2x4());
  PhaseTimings t;
  std::string s = summaryText(p.result.plan, &t);
  for (const char* needle :
       {"estimated step time:", "compute", "communication", "parameter memory per rank:", "  up\n",
        "    weight", "problem: ", "after reduction", "solver: optimal, objective", "bound",
        "time: import", "enumerate", "build", "solve", "write"})
    EXPECT_NE(s.find(needle), std::string::npos) << needle << "\n" << s;
  std::string log = optimizerLog(p.result.plan);
  EXPECT_NE(log.find("%h "), std::string::npos) << log;
  EXPECT_NE(log.find("placement="), std::string::npos) << log;
  EXPECT_NE(log.find("cost=(comm "), std::string::npos) << log;
  EXPECT_NE(log.find("total: comm"), std::string::npos) << log;
  EXPECT_EQ(formatMicros(12.5), "12.500 us");
  EXPECT_EQ(formatMicros(4500), "4.500 ms");
}

// --- The restricted plan (pipeline.h, solveAndPlan) -------------------------------------------

/// Checks a restricted plan of `g` against the full problem and the optimum: the full problem,
/// rebuilt, accepts its indices and prices it at its objective; it is no cheaper than the
/// optimum; its bound is every full node at its cheapest, at or below the optimum.
void expectRestrictedPlan(const ir::Graph& g, const PlanResult& r, double optimum) {
  const Plan& plan = r.plan;
  EXPECT_EQ(plan.solver.status, PlanStatus::kTimeLimit);
  EXPECT_EQ(plan.solver.statusText(), solver::statusName(solver::SolveStatus::kTimeLimit));
  EXPECT_FALSE(r.note.empty());
  auto full = rebuildProblem(g, plan);
  ASSERT_TRUE(full.ok()) << full.error().message();
  std::vector<uint32_t> choice;
  bool restricted = false;
  double cheapest = 0;
  for (size_t i = 0; i < plan.nodes.size(); ++i) {
    choice.push_back(plan.nodes[i].strategy_index);
    restricted |= plan.nodes[i].num_strategies > kRestrictedStrategies + 1;
    const auto& costs = full->gp.problem.nodes[i].costs;
    cheapest += *std::min_element(costs.begin(), costs.end());
  }
  EXPECT_TRUE(restricted);  // the test means something: some op had more strategies than kept
  const double tol = 1e-9 * std::max(1.0, optimum);
  EXPECT_NEAR(solver::evaluate(full->gp.problem, choice), plan.solver.objective, tol);
  EXPECT_GE(plan.solver.objective, optimum - tol);
  ASSERT_TRUE(plan.solver.bound);
  EXPECT_NEAR(*plan.solver.bound, std::min(cheapest, plan.solver.objective), tol);
  EXPECT_LE(*plan.solver.bound, optimum + tol);
  // Written and read back like any plan, with its gap.
  auto j = parseJsonText(toJsonText(plan));
  ASSERT_TRUE(j.ok());
  EXPECT_TRUE((*j)["solver"].contains("gap"));
  auto back = planFromJson(*j);
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_TRUE(*back == plan);
}

// A deadline that passes before the edges are priced: construction stops, and the plan is the
// restricted one, the same on every run.
TEST(RestrictedPlan, ConstructionPastTheDeadline) {
  ir::Graph g = ir::testing_graphs::toyBlock();
  spec::Spec spec = toySpec2x4();
  const double optimum = planOf(g, spec).result.plan.solver.objective;
  PlanRequest request;
  request.options.solver.deadline = Deadline::at(std::chrono::steady_clock::now());
  auto run = planGraph(g, spec, toySource(g), request);
  ASSERT_TRUE(run.ok()) << run.error().message();
  EXPECT_FALSE(run->built.complete);
  expectRestrictedPlan(g, run->result, optimum);
  auto again = planGraph(g, spec, toySource(g), request);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(toJsonText(again->result.plan), toJsonText(run->result.plan));
  // A classic plan has no time limit on construction.
  request.baseline = solver::Baseline::kDdp;
  auto ddp = planGraph(g, spec, toySource(g), request);
  ASSERT_TRUE(ddp.ok()) << ddp.error().message();
  EXPECT_TRUE(ddp->built.complete);
}

// The problem built, but the reductions before a first plan pass their deadline: the solve
// reports kDeadline and solveAndPlan makes the restricted plan.
TEST(RestrictedPlan, FirstPlanPastTheDeadline) {
  ir::Graph g = ir::testing_graphs::toyBlock();
  spec::Spec spec = toySpec2x4();
  Planned full = planOf(g, spec);
  solver::SolveGraphOptions o;
  o.solver.first_plan_deadline = Deadline::at(std::chrono::steady_clock::now());
  auto direct = solver::solveGraphProblem(full.built.gp, o);
  ASSERT_FALSE(direct.ok());
  EXPECT_EQ(direct.error().code(), ErrorCode::kDeadline);
  auto r = solveAndPlan(g, full.built, spec, toySource(g), o);
  ASSERT_TRUE(r.ok()) << r.error().message();
  expectRestrictedPlan(g, *r, full.result.plan.solver.objective);
  EXPECT_NE(r->note.find("first plan"), std::string::npos) << r->note;
}

}  // namespace
}  // namespace apc::plan
