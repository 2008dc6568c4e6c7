//===- tests/solver/memory_search_test.cpp - Step 0: a memory row that binds in part ===//
//
// solveGraphProblem's step 0 (lib/solver/memory_search.h) must return the optimum whatever the
// budget: random problems shaped like ours (parameters with a memory per strategy feeding a DAG of
// compute nodes, forbidden pairs) are solved at binding, slack and partly binding budgets and
// compared with brute force and with the ILP path (step 0 off). An unfinished search falls back
// to the ILP path and is still optimal, and the search is deterministic.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "apc/solver/graph_problem.h"

namespace apc::solver {
namespace {

/// `params` parameters (strategies: 4 shard levels of a random size, the memory halving with each)
/// feeding `ops` compute nodes of 2-3 strategies in a random DAG. A parameter's edge to its
/// consumer is cheap where the memory is high (replicated: no gather) and dearer as it shrinks,
/// as all-gathers are, so the row trades cost for memory.
Problem shapedProblem(std::mt19937& rng, int params, int ops) {
  std::uniform_real_distribution<double> cost(0, 10);
  std::uniform_int_distribution<int> size(1, 4), strategies(2, 3);
  std::bernoulli_distribution forbid(0.1);
  Problem p;
  std::vector<int> op_strategies;
  for (int i = 0; i < ops; ++i) {
    ProblemNode v;
    v.name = "op" + std::to_string(i);
    op_strategies.push_back(strategies(rng));
    for (int s = 0; s < op_strategies.back(); ++s) v.costs.push_back(std::round(cost(rng) * 4) / 4);
    p.nodes.push_back(v);
  }
  auto table = [&](size_t ns, size_t nt, bool diagonal_free) {
    std::vector<double> t(ns * nt);
    for (size_t a = 0; a < ns; ++a)
      for (size_t b = 0; b < nt; ++b)
        t[a * nt + b] = diagonal_free && a == b ? 0.0
                        : forbid(rng)           ? kInfinity
                                                : std::round(cost(rng) * 4) / 4;
    return t;
  };
  for (int i = 1; i < ops; ++i) {
    uint32_t src = std::uniform_int_distribution<uint32_t>(0, static_cast<uint32_t>(i - 1))(rng);
    p.edges.push_back({src, static_cast<uint32_t>(i),
                       table(static_cast<size_t>(op_strategies[src]),
                             static_cast<size_t>(op_strategies[i]), true)});
  }
  for (int k = 0; k < params; ++k) {
    ProblemNode v;
    v.name = "param" + std::to_string(k);
    double bytes = 8.0 * size(rng);
    for (int level = 0; level < 4; ++level) {
      v.costs.push_back(0);
      v.memory.push_back(bytes / (1 << level));
    }
    uint32_t id = static_cast<uint32_t>(p.nodes.size());
    p.nodes.push_back(v);
    uint32_t consumer =
        std::uniform_int_distribution<uint32_t>(0, static_cast<uint32_t>(ops - 1))(rng);
    const size_t nt = static_cast<size_t>(op_strategies[consumer]);
    std::vector<double> t(4 * nt);
    for (size_t a = 0; a < 4; ++a)
      for (size_t b = 0; b < nt; ++b)
        t[a * nt + b] = forbid(rng) ? kInfinity : std::round((a * 3 + cost(rng)) * 4) / 4;
    p.edges.push_back({id, consumer, t});
  }
  return p;
}

/// The least and the most memory of any choice (per node minima and maxima).
std::pair<double, double> memoryRange(const Problem& p) {
  double lo = 0, hi = 0;
  for (const ProblemNode& v : p.nodes) {
    if (v.memory.empty()) continue;
    lo += *std::min_element(v.memory.begin(), v.memory.end());
    hi += *std::max_element(v.memory.begin(), v.memory.end());
  }
  return {lo, hi};
}

TEST(MemorySearch, MatchesBruteForceAndTheIlpPathAtEveryKindOfBudget) {
  std::mt19937 rng(29);
  int compared = 0, searched = 0, branched = 0, infeasible = 0;
  // Fractions of the range between the least and the most memory: binding everywhere (0), partly
  // binding (0.15-0.85), slack (1), and below the least (infeasible).
  const std::vector<double> fractions = {-0.1, 0, 0.15, 0.3, 0.5, 0.7, 0.85, 1};
  for (int trial = 0; trial < 40; ++trial) {
    Problem base = shapedProblem(rng, 4 + trial % 3, 3 + trial % 3);
    auto [least, most] = memoryRange(base);
    for (double f : fractions) {
      Problem p = base;
      p.memory = MemoryBound{0, least + f * (most - least), most};
      auto brute = bruteForce(p);
      GraphProblem gp;
      gp.problem = p;
      ReductionStats stats;
      auto searched_solution = solveGraphProblem(gp, {}, &stats);
      SolveGraphOptions ilp_only;
      ilp_only.memory_search_subproblems = 0;
      ReductionStats ilp_stats;
      auto ilp = solveGraphProblem(gp, ilp_only, &ilp_stats);
      const std::string at = "trial " + std::to_string(trial) + " fraction " + std::to_string(f);
      ASSERT_EQ(brute.ok(), searched_solution.ok()) << at;
      ASSERT_EQ(brute.ok(), ilp.ok()) << at;
      EXPECT_EQ(ilp_stats.memory_subproblems, 0u) << at;
      if (!brute.ok()) {
        ++infeasible;
        continue;
      }
      ++compared;
      const double tol = 1e-9 * std::max(1.0, brute->objective);
      EXPECT_NEAR(searched_solution->objective, brute->objective, tol) << at;
      EXPECT_NEAR(ilp->objective, brute->objective, tol) << at;
      EXPECT_DOUBLE_EQ(evaluate(p, searched_solution->choice), searched_solution->objective) << at;
      EXPECT_EQ(searched_solution->status, SolveStatus::kOptimal) << at;
      EXPECT_LE(searched_solution->bound, searched_solution->objective + tol) << at;
      EXPECT_GE(searched_solution->bound, searched_solution->objective - tol) << at;
      if (stats.memory_subproblems > 0) ++searched;
      if (stats.memory_branches > 1) ++branched;
      // Slack and everywhere-binding rows never reach step 0 (step 1b decides them).
      if (f >= 1 || f <= 0) {
        EXPECT_EQ(stats.memory_subproblems, 0u) << at;
      }
    }
  }
  std::printf("compared %d, infeasible %d, step 0 ran %d, branched %d\n", compared, infeasible,
              searched, branched);
  EXPECT_GE(compared, 200);
  EXPECT_GE(infeasible, 30);  // the budgets below the least memory
  EXPECT_GE(searched, 150);   // step 0 ran on most partly binding rows
  EXPECT_GE(branched, 100);   // and needed its branch and bound on most
}

TEST(MemorySearch, AnUnfinishedSearchFallsBackToTheIlpPath) {
  std::mt19937 rng(31);
  int fell_back = 0;
  for (int trial = 0; trial < 20; ++trial) {
    Problem p = shapedProblem(rng, 5, 4);
    auto [least, most] = memoryRange(p);
    p.memory = MemoryBound{0, least + 0.4 * (most - least), most};
    auto brute = bruteForce(p);
    GraphProblem gp;
    gp.problem = p;
    SolveGraphOptions o;
    o.memory_search_subproblems = 1;  // the root's first subproblem, then the ILP path
    ReductionStats stats;
    auto s = solveGraphProblem(gp, o, &stats);
    ASSERT_EQ(brute.ok(), s.ok()) << "trial " << trial;
    if (!brute.ok()) continue;
    EXPECT_NEAR(s->objective, brute->objective, 1e-9 * std::max(1.0, brute->objective))
        << "trial " << trial;
    EXPECT_EQ(s->status, SolveStatus::kOptimal) << "trial " << trial;
    // The budget stops the search after its root; the ILP path (variables > 0) then finishes.
    if (stats.memory_branches == 1 && s->variables > 0) ++fell_back;
  }
  EXPECT_GE(fell_back, 10);
}

// The device-memory loop's shortcuts (lib/planner/pipeline.cpp): with memory_search_only an
// unfinished search returns its own plan (meeting the row, its bound a true lower bound, status
// time_limit) instead of the ILP path; and the root's hull plan, whose memory it reports, is an
// optimum of the row at exactly that memory (brute force), proven by the search at the root.
TEST(MemorySearch, SearchOnlyAndTheRootHullPlan) {
  std::mt19937 rng(41);
  int hulls = 0, unproven = 0;
  for (int trial = 0; trial < 30; ++trial) {
    Problem p = shapedProblem(rng, 5, 4);
    auto [least, most] = memoryRange(p);
    p.memory = MemoryBound{0, least + 0.45 * (most - least), most};
    auto brute = bruteForce(p);
    if (!brute.ok()) continue;
    GraphProblem gp;
    gp.problem = p;
    SolveGraphOptions o;
    o.memory_search_subproblems = 3;
    o.memory_search_only = true;
    ReductionStats stats;
    auto s = solveGraphProblem(gp, o, &stats);
    ASSERT_TRUE(s.ok()) << "trial " << trial;
    const std::string at = "trial " + std::to_string(trial);
    const double tol = 1e-9 * std::max(1.0, brute->objective);
    EXPECT_LE(memoryOf(p, s->choice), p.memory->high + tol) << at;
    EXPECT_GE(s->objective, brute->objective - tol) << at;
    EXPECT_LE(s->bound, brute->objective + tol) << at;
    if (s->status != SolveStatus::kOptimal) {
      ++unproven;
      EXPECT_EQ(s->status, SolveStatus::kTimeLimit) << at;
      EXPECT_EQ(s->variables, 0) << at << ": no ILP ran";
    }
    if (stats.memory_hull <= 0) continue;
    ++hulls;
    EXPECT_LE(stats.memory_hull, p.memory->high + tol) << at;
    Problem at_hull = p;
    at_hull.memory->high = stats.memory_hull;
    auto brute_hull = bruteForce(at_hull);
    ASSERT_TRUE(brute_hull.ok()) << at;
    GraphProblem gh;
    gh.problem = at_hull;
    SolveGraphOptions full_search;
    ReductionStats hull_stats;
    auto h = solveGraphProblem(gh, full_search, &hull_stats);
    ASSERT_TRUE(h.ok()) << at;
    EXPECT_NEAR(h->objective, brute_hull->objective, tol) << at;
    EXPECT_EQ(h->status, SolveStatus::kOptimal) << at;
  }
  std::printf("root hull plans %d, unproven search-only solves %d\n", hulls, unproven);
  EXPECT_GE(hulls, 5);
  EXPECT_GE(unproven, 5);
}

/// `layers` identical layers in a chain, as a transformer's: residual node r_i (one strategy)
/// -> op_i (2-3 strategies) -> r_{i+1}, and a parameter (4 shard levels, as shapedProblem's) read
/// by op_i. The same random costs in every layer, so that a partly binding row's optimum mixes
/// layers of two kinds, which the Lagrangian bound alone does not prove.
Problem layeredProblem(std::mt19937& rng, int layers) {
  std::uniform_real_distribution<double> cost(0, 10);
  const int ops = std::uniform_int_distribution<int>(2, 3)(rng);
  std::vector<double> op_costs, in_table, out_table, param_table;
  for (int s = 0; s < ops; ++s) op_costs.push_back(std::round(cost(rng) * 4) / 4);
  for (int s = 0; s < ops; ++s) in_table.push_back(std::round(cost(rng) * 2) / 4);
  for (int s = 0; s < ops; ++s) out_table.push_back(std::round(cost(rng) * 2) / 4);
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < ops; ++b) param_table.push_back(std::round((a * 3 + cost(rng)) * 4) / 4);
  const double bytes = 8.0 * std::uniform_int_distribution<int>(1, 4)(rng);
  Problem p;
  auto add = [&](ProblemNode v) {
    p.nodes.push_back(std::move(v));
    return static_cast<uint32_t>(p.nodes.size() - 1);
  };
  uint32_t r = add({"r0", {0.0}, {}, {}, {}});
  for (int i = 0; i < layers; ++i) {
    const std::string n = std::to_string(i);
    ProblemNode param{"param" + n, {}, {}, {}, {}};
    for (int level = 0; level < 4; ++level) {
      param.costs.push_back(0);
      param.memory.push_back(bytes / (1 << level));
    }
    const uint32_t w = add(param);
    const uint32_t op = add({"op" + n, op_costs, {}, {}, {}});
    const uint32_t next = add({"r" + std::to_string(i + 1), {0.0}, {}, {}, {}});
    p.edges.push_back({w, op, param_table});
    p.edges.push_back({r, op, in_table});
    p.edges.push_back({op, next, out_table});
    r = next;
  }
  return p;
}

// The device-memory loop's tightened row (SolveGraphOptions::memory_tighten_within): where step 0
// stops at its root with a mix of the two hull plans, that plan is optimal for the row at its own
// memory (brute force there), meets the row asked, and gives up at most the allowed fraction
// against that row's optimum (brute force); solving again at the tightened row proves it at once.
TEST(MemorySearch, ATightenedRowIsProvenAtItsOwnMemory) {
  std::mt19937 rng(43);
  int tightened = 0;
  constexpr double kWithin = 0.2;
  for (int trial = 0; trial < 30; ++trial) {
    Problem p = layeredProblem(rng, 5);
    auto [least, most] = memoryRange(p);
    p.memory = MemoryBound{0, least + (0.2 + 0.02 * trial) * (most - least), most};
    auto brute = bruteForce(p);
    ASSERT_TRUE(brute.ok()) << "trial " << trial;
    GraphProblem gp;
    gp.problem = p;
    SolveGraphOptions o;
    o.memory_search_only = true;
    o.memory_tighten_within = kWithin;
    ReductionStats stats;
    auto s = solveGraphProblem(gp, o, &stats);
    ASSERT_TRUE(s.ok()) << "trial " << trial;
    const std::string at = "trial " + std::to_string(trial);
    const double tol = 1e-9 * std::max(1.0, brute->objective);
    EXPECT_LE(memoryOf(p, s->choice), p.memory->high + tol) << at;
    EXPECT_GE(s->objective, brute->objective - tol) << at;
    if (stats.memory_tightened <= 0) continue;
    ++tightened;
    EXPECT_EQ(s->status, SolveStatus::kOptimal) << at;
    EXPECT_LT(stats.memory_tightened, p.memory->high) << at;
    EXPECT_NEAR(memoryOf(p, s->choice), stats.memory_tightened, tol) << at;
    EXPECT_LE(s->objective, brute->objective * (1 + kWithin) + tol) << at;
    Problem at_row = p;
    at_row.memory->high = stats.memory_tightened;
    auto brute_row = bruteForce(at_row);
    ASSERT_TRUE(brute_row.ok()) << at;
    EXPECT_NEAR(s->objective, brute_row->objective, tol) << at;
    GraphProblem g2;
    g2.problem = at_row;
    ReductionStats again_stats;
    auto again = solveGraphProblem(g2, o, &again_stats);
    ASSERT_TRUE(again.ok()) << at;
    EXPECT_EQ(again->status, SolveStatus::kOptimal) << at;
    EXPECT_NEAR(again->objective, brute_row->objective, tol) << at;
    EXPECT_EQ(again_stats.memory_tightened, 0.0) << at;
    EXPECT_EQ(again_stats.memory_branches, 1u) << at << ": proven at the root";
  }
  std::printf("tightened rows %d\n", tightened);
  EXPECT_GE(tightened, 8);
}

// Without memory_tighten_within the mixes are only incumbents: the search proves the row asked.
TEST(MemorySearch, LayeredRowsMatchBruteForce) {
  std::mt19937 rng(47);
  for (int trial = 0; trial < 20; ++trial) {
    Problem p = layeredProblem(rng, 5);
    auto [least, most] = memoryRange(p);
    p.memory = MemoryBound{0, least + (0.1 + 0.04 * trial) * (most - least), most};
    auto brute = bruteForce(p);
    ASSERT_TRUE(brute.ok()) << "trial " << trial;
    GraphProblem gp;
    gp.problem = p;
    ReductionStats stats;
    auto s = solveGraphProblem(gp, {}, &stats);
    ASSERT_TRUE(s.ok()) << "trial " << trial;
    EXPECT_NEAR(s->objective, brute->objective, 1e-9 * std::max(1.0, brute->objective))
        << "trial " << trial;
    EXPECT_EQ(s->status, SolveStatus::kOptimal) << "trial " << trial;
    EXPECT_EQ(stats.memory_tightened, 0.0) << "trial " << trial;
  }
}

TEST(MemorySearch, IsDeterministic) {
  std::mt19937 rng(37);
  for (int trial = 0; trial < 10; ++trial) {
    Problem p = shapedProblem(rng, 6, 5);
    auto [least, most] = memoryRange(p);
    p.memory = MemoryBound{0, least + 0.5 * (most - least), most};
    GraphProblem gp;
    gp.problem = p;
    ReductionStats a_stats, b_stats;
    auto a = solveGraphProblem(gp, {}, &a_stats);
    auto b = solveGraphProblem(gp, {}, &b_stats);
    ASSERT_EQ(a.ok(), b.ok());
    if (!a.ok()) continue;
    EXPECT_EQ(a->choice, b->choice) << "trial " << trial;
    EXPECT_EQ(a_stats.memory_subproblems, b_stats.memory_subproblems) << "trial " << trial;
    EXPECT_EQ(a_stats.memory_branches, b_stats.memory_branches) << "trial " << trial;
  }
}

}  // namespace
}  // namespace apc::solver
