//===- tests/solver/solver_test.cpp - The ILP on hand-built problems -------===//
//
// Tiny problems with costs written by hand and exact expected choices; then random problems where
// the ILP must match brute force; then pins, memory bounds, infeasibility diagnosis and dumps.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <random>

#include "apc/solver/ilp.h"

namespace apc::solver {
namespace {

ProblemNode node(std::string name, std::vector<double> costs) {
  ProblemNode n;
  n.name = std::move(name);
  n.costs = std::move(costs);
  return n;
}

/// a -> b -> c, two strategies each ("shard", "replicate"). Changing strategy along an edge
/// costs 10.
Problem chain() {
  Problem p;
  p.nodes = {node("a", {1, 4}), node("b", {8, 2}), node("c", {1, 1})};
  p.edges = {{0, 1, {0, 10, 10, 0}}, {1, 2, {0, 10, 10, 0}}};
  return p;
}

TEST(Solver, ChainPrefersNoResharding) {
  // All shard: 1+8+1 = 10; all replicate: 4+2+1 = 7; mixed choices pay >= 10 for a change.
  auto s = solve(chain());
  ASSERT_TRUE(s.ok()) << s.error().message();
  EXPECT_EQ(s->choice, (std::vector<uint32_t>{1, 1, 1}));
  EXPECT_DOUBLE_EQ(s->objective, 7);
  EXPECT_EQ(s->status, SolveStatus::kOptimal);
  EXPECT_EQ(s->variables, 6 + 8);    // 6 x, 2 edges x 4 pairs
  EXPECT_EQ(s->constraints, 3 + 8);  // (a) per node, (b)+(c) per edge: 2+2 each
}

TEST(Solver, ForbiddenPairsAreNeverChosen) {
  Problem p = chain();
  p.edges[0].costs = {0, kInfinity, kInfinity, kInfinity};  // b can only follow a's strategy 0
  auto s = solve(p);
  ASSERT_TRUE(s.ok()) << s.error().message();
  EXPECT_EQ(s->choice[0], 0u);
  EXPECT_EQ(s->choice[1], 0u);
  // a0 + b0 + (c0: 1 | c1: 1 + 10) = 10.
  EXPECT_DOUBLE_EQ(s->objective, 10);
  EXPECT_EQ(s->variables, 6 + 1 + 4);
}

TEST(Solver, PinOverridesTheCheaperChoice) {
  Problem p = chain();
  p.nodes[2].pinned = 0;
  p.nodes[2].pin_group = "outputs";
  auto s = solve(p);
  ASSERT_TRUE(s.ok());
  // c must shard: all shard = 10; replicate a,b then reshard to c: 4+2+10+1 = 17.
  EXPECT_EQ(s->choice, (std::vector<uint32_t>{0, 0, 0}));
  EXPECT_DOUBLE_EQ(s->objective, 10);
}

TEST(Solver, MemoryBoundShardsParameters) {
  Problem p = chain();
  // Strategy 0 of a holds 25 bytes (sharded), strategy 1 holds 100 (replicated).
  p.nodes[0].memory = {25, 100};
  p.memory = MemoryBound{0, 50};
  auto s = solve(p);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->choice[0], 0u);
  EXPECT_DOUBLE_EQ(s->objective, 10);  // all shard is the best with a sharded
  p.memory = MemoryBound{0, 100};
  auto r = solve(p);
  ASSERT_TRUE(r.ok());
  EXPECT_DOUBLE_EQ(r->objective, 7);
}

TEST(Solver, InfeasiblePinsAreNamed) {
  Problem p = chain();
  p.edges[0].costs = {0, kInfinity, kInfinity, 0};  // b must equal a
  p.nodes[0].pinned = 0;
  p.nodes[0].pin_group = "inputs";
  p.nodes[1].pinned = 1;
  p.nodes[1].pin_group = "pins";
  auto s = solve(p);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kInfeasible);
  EXPECT_NE(s.error().message().find("inputs"), std::string::npos) << s.error().message();
  EXPECT_NE(s.error().message().find("pins"), std::string::npos) << s.error().message();
}

TEST(Solver, TooSmallMemoryBudgetReportsTheNeed) {
  Problem p = chain();
  p.nodes[0].memory = {25, 100};
  p.nodes[1].memory = {30, 120};
  p.memory = MemoryBound{0, 40};
  auto s = solve(p);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kInfeasible);
  EXPECT_NE(s.error().message().find("needs at least 55 bytes"), std::string::npos)
      << s.error().message();
}

TEST(Solver, MalformedProblemsAreRejected) {
  Problem p = chain();
  p.edges[0].costs.pop_back();
  auto s = solve(p);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kInvalidArgument);
  Problem q = chain();
  q.nodes[1].costs[0] = -1;
  EXPECT_FALSE(solve(q).ok());
}

/// Random DAG: each node gets edges from up to two earlier nodes; some pairs forbidden.
Problem randomProblem(std::mt19937& rng, int n) {
  std::uniform_int_distribution<int> k(2, 4);
  std::uniform_real_distribution<double> cost(0, 100);
  std::bernoulli_distribution forbid(0.15);
  Problem p;
  for (int i = 0; i < n; ++i) {
    ProblemNode v;
    v.name = "n" + std::to_string(i);
    int ks = k(rng);
    for (int s = 0; s < ks; ++s) v.costs.push_back(cost(rng));
    for (int s = 0; s < ks; ++s) v.memory.push_back(std::floor(cost(rng)));
    p.nodes.push_back(v);
  }
  for (int i = 1; i < n; ++i) {
    std::uniform_int_distribution<int> pick(0, i - 1);
    std::set<int> srcs = {pick(rng), pick(rng)};
    for (int src : srcs) {
      ProblemEdge e;
      e.src = static_cast<uint32_t>(src);
      e.dst = static_cast<uint32_t>(i);
      for (size_t a = 0; a < p.nodes[src].numStrategies(); ++a)
        for (size_t b = 0; b < p.nodes[i].numStrategies(); ++b)
          e.costs.push_back(a == b ? 0.0 : forbid(rng) ? kInfinity : cost(rng));
      p.edges.push_back(e);
    }
  }
  return p;
}

TEST(Solver, MatchesBruteForceOnRandomDags) {
  std::mt19937 rng(42);
  int compared = 0;
  for (int trial = 0; trial < 60; ++trial) {
    Problem p = randomProblem(rng, 5 + trial % 4);
    if (trial % 3 == 0) {
      double total = 0;
      for (const auto& v : p.nodes) total += *std::max_element(v.memory.begin(), v.memory.end());
      p.memory = MemoryBound{0, total * 0.6};
    }
    auto brute = bruteForce(p);
    auto ilp = solve(p);
    ASSERT_EQ(brute.ok(), ilp.ok()) << "trial " << trial;
    if (!brute.ok()) continue;
    EXPECT_NEAR(ilp->objective, brute->objective, 1e-6 * std::max(1.0, brute->objective))
        << "trial " << trial;
    EXPECT_DOUBLE_EQ(evaluate(p, ilp->choice), ilp->objective);
    ++compared;
  }
  EXPECT_GE(compared, 50);
}

/// Three nodes, two strategies, every pair of nodes prefers different strategies: the LP
/// relaxation (0, all x = 1/2) is below every integral choice (1), so a start cannot be proven by
/// the LP bound and CBC has to run.
Problem frustratedTriangle() {
  Problem p;
  p.nodes = {node("a", {0, 0}), node("b", {0, 0}), node("c", {0, 0})};
  p.edges = {{0, 1, {1, 0, 0, 1}}, {1, 2, {1, 0, 0, 1}}, {0, 2, {1, 0, 0, 1}}};
  return p;
}

TEST(Solver, StartMeetingTheLpBoundIsReturnedAsIs) {
  StartOutcome how = StartOutcome::kBranchAndBound;
  auto s = solve(chain(), {}, {1, 1, 1}, &how);
  ASSERT_TRUE(s.ok()) << s.error().message();
  EXPECT_EQ(how, StartOutcome::kStartProven);
  EXPECT_EQ(s->choice, (std::vector<uint32_t>{1, 1, 1}));
  EXPECT_DOUBLE_EQ(s->objective, 7);
  EXPECT_EQ(s->status, SolveStatus::kOptimal);
}

TEST(Solver, StartAboveTheBoundIsImproved) {
  StartOutcome how = StartOutcome::kStartProven;
  auto s = solve(chain(), {}, {0, 0, 0}, &how);  // 10, the integral LP finds 7
  ASSERT_TRUE(s.ok()) << s.error().message();
  EXPECT_EQ(how, StartOutcome::kLpIntegral);
  EXPECT_DOUBLE_EQ(s->objective, 7);
  EXPECT_EQ(s->status, SolveStatus::kOptimal);

  // Fractional LP: CBC runs with the start's objective as cutoff.
  s = solve(frustratedTriangle(), {}, {0, 0, 0}, &how);  // 3, the optimum is 1
  ASSERT_TRUE(s.ok()) << s.error().message();
  EXPECT_EQ(how, StartOutcome::kBranchAndBound);
  EXPECT_DOUBLE_EQ(s->objective, 1);
  EXPECT_EQ(s->status, SolveStatus::kOptimal);

  // An optimal start that the LP cannot prove: CBC finds nothing cheaper, the start stays.
  s = solve(frustratedTriangle(), {}, {0, 1, 0}, &how);
  ASSERT_TRUE(s.ok()) << s.error().message();
  EXPECT_EQ(how, StartOutcome::kBranchAndBound);
  EXPECT_EQ(s->choice, (std::vector<uint32_t>{0, 1, 0}));
  EXPECT_DOUBLE_EQ(s->objective, 1);
  EXPECT_EQ(s->status, SolveStatus::kOptimal);
}

TEST(Solver, InfeasibleStartIsRejected) {
  Problem p = chain();
  p.nodes[2].pinned = 0;
  EXPECT_EQ(solve(p, {}, {1, 1, 1}).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(solve(p, {}, {1, 1}).error().code(), ErrorCode::kInvalidArgument);
}

TEST(Solver, MatchesBruteForceFromAnyStart) {
  std::mt19937 rng(7);
  int compared = 0;
  for (int trial = 0; trial < 40; ++trial) {
    Problem p = randomProblem(rng, 5 + trial % 4);
    if (trial % 2 == 0) {
      double total = 0;
      for (const auto& v : p.nodes) total += *std::max_element(v.memory.begin(), v.memory.end());
      p.memory = MemoryBound{0, total * 0.6};
    }
    auto brute = bruteForce(p);
    if (!brute.ok()) continue;
    // A feasible start: the worst of a few random feasible choices (or the optimum itself).
    std::vector<uint32_t> start = brute->choice;
    for (int tries = 0; tries < 50; ++tries) {
      std::vector<uint32_t> c;
      for (const auto& v : p.nodes)
        c.push_back(std::uniform_int_distribution<uint32_t>(
            0, static_cast<uint32_t>(v.numStrategies() - 1))(rng));
      double obj = evaluate(p, c);
      if (std::isfinite(obj) && obj > evaluate(p, start)) start = c;
    }
    auto ilp = solve(p, {}, start);
    ASSERT_TRUE(ilp.ok()) << "trial " << trial << ": " << ilp.error().message();
    EXPECT_NEAR(ilp->objective, brute->objective, 1e-6 * std::max(1.0, brute->objective))
        << "trial " << trial;
    EXPECT_EQ(ilp->status, SolveStatus::kOptimal);
    ++compared;
  }
  EXPECT_GE(compared, 30);
}

TEST(Solver, DumpAndReplayGiveTheSameAnswer) {
  std::mt19937 rng(7);
  Problem p = randomProblem(rng, 7);
  p.nodes[3].pinned = 1;
  p.nodes[3].pin_group = "pins";
  p.memory = MemoryBound{10, kInfinity};
  auto back = problemFromJson(toJson(p));
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(toJson(*back), toJson(p));
  auto a = solve(p), b = solve(*back);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->choice, b->choice);
  EXPECT_FALSE(problemFromJson(nlohmann::json{{"format", "other"}}).ok());
}

}  // namespace
}  // namespace apc::solver

#include "apc/solver/graph_problem.h"

namespace apc::solver {
namespace {

TEST(Reduction, EliminationIsExactOnRandomProblems) {
  // Sparse random DAGs (chains and leaves are eliminated, branching nodes stay), some with pins and
  // a memory bound on a few nodes: the reduced solve must reach exactly the full optimum.
  std::mt19937 rng(123);
  for (int trial = 0; trial < 40; ++trial) {
    GraphProblem gp;
    gp.problem = randomProblem(rng, 6 + trial % 5);
    for (size_t i = 0; i < gp.problem.nodes.size(); ++i)
      if (i % 3 != 0) gp.problem.nodes[i].memory.clear();  // only every third node is "a parameter"
    if (trial % 2 == 0) {
      gp.problem.nodes[1].pinned = 0;
      gp.problem.nodes[1].pin_group = "inputs";
      gp.problem.memory = MemoryBound{0, 120};
    }
    SolveGraphOptions with, without;
    without.reduce = false;
    ReductionStats stats;
    auto a = solveGraphProblem(gp, with, &stats);
    auto b = solveGraphProblem(gp, without);
    ASSERT_EQ(a.ok(), b.ok()) << "trial " << trial << (a.ok() ? "" : a.error().message());
    if (!a.ok()) continue;
    EXPECT_NEAR(a->objective, b->objective, 1e-9 * std::max(1.0, b->objective))
        << "trial " << trial;
    EXPECT_DOUBLE_EQ(evaluate(gp.problem, a->choice), a->objective);
    EXPECT_LT(stats.nodes_after, stats.nodes_before) << "trial " << trial;
  }
}

}  // namespace
}  // namespace apc::solver

namespace apc::solver {
namespace {

TEST(Reduction, MemoryFixingIsExactUnderTightBudgets) {
  // Budgets at or near the least (or, for low, the most) memory the nodes can use, as the default
  // budget of 1/world size is for fully shardable parameters: the reduction drops the strategies
  // the bound rules out and eliminates the nodes whose memory becomes constant; the optimum (and
  // infeasibility) must be the same as without reduction and as brute force.
  std::mt19937 rng(2024);
  std::uniform_real_distribution<double> frac(0, 1);
  int solved = 0;
  for (int trial = 0; trial < 75; ++trial) {
    GraphProblem gp;
    gp.problem = randomProblem(rng, 5 + trial % 4);
    double least = 0, most = 0;
    for (auto& v : gp.problem.nodes) {
      if (trial % 2 == 1 && &v != &gp.problem.nodes[0] && frac(rng) < 0.3) v.memory.clear();
      if (v.memory.empty()) continue;
      least += *std::min_element(v.memory.begin(), v.memory.end());
      most += *std::max_element(v.memory.begin(), v.memory.end());
    }
    switch (trial % 5) {
      case 0:  // every node at its least
        gp.problem.memory = MemoryBound{0, least};
        break;
      case 1:
        gp.problem.memory = MemoryBound{0, least + std::floor(frac(rng) * 40)};
        break;
      case 2:
        gp.problem.memory = MemoryBound{most - std::floor(frac(rng) * 40), kInfinity};
        break;
      case 3:
        gp.problem.memory = MemoryBound{least + 10, least + 30};
        break;
      default:  // every choice fits, as with high = 1: the row is redundant
        gp.problem.memory = MemoryBound{0, most};
        break;
    }
    SolveGraphOptions with, without;
    without.reduce = false;
    auto a = solveGraphProblem(gp, with);
    auto b = solveGraphProblem(gp, without);
    auto brute = bruteForce(gp.problem);
    ASSERT_EQ(a.ok(), b.ok()) << "trial " << trial;
    ASSERT_EQ(a.ok(), brute.ok()) << "trial " << trial;
    if (!a.ok()) continue;
    ++solved;
    EXPECT_NEAR(a->objective, brute->objective, 1e-9 * std::max(1.0, brute->objective))
        << "trial " << trial;
    EXPECT_NEAR(b->objective, brute->objective, 1e-9 * std::max(1.0, brute->objective))
        << "trial " << trial;
    EXPECT_DOUBLE_EQ(evaluate(gp.problem, a->choice), a->objective);
  }
  EXPECT_GE(solved, 40);  // the others are infeasible, which all three must agree on
}

}  // namespace
}  // namespace apc::solver
