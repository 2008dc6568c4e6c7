//===- tests/solver/reduce_test.cpp - Exact reduction, factorized tables, time limit ===//
//
// The reduction before the ILP must not change the optimum: random problems with planted dominated
// strategies and factorized edge tables are solved with the reduction (dominance pruning 1c,
// class-level elimination) and compared with brute force. Then the time limit: a solve stopped by
// its deadline reports status time_limit and a proven bound below its objective (wall time is not
// asserted).
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <iostream>
#include <optional>
#include <random>
#include <set>

#include "apc/solver/graph_problem.h"
#include "apc/solver/ilp.h"

namespace apc::solver {
namespace {

/// Random DAG of `n` nodes; every node gets `shadows` extra strategies that copy one of its
/// strategies with costs (node and every incident edge entry) raised by random non-negative
/// amounts and equal memory: dominated, so dropping them must keep the optimum.
Problem plantedProblem(std::mt19937& rng, int n, int shadows, bool memory) {
  std::uniform_int_distribution<int> k(2, 3);
  std::uniform_real_distribution<double> cost(0, 100);
  std::uniform_real_distribution<double> raise(0, 5);
  std::bernoulli_distribution forbid(0.1), zero(0.4);
  Problem p;
  std::vector<std::vector<int>> copy_of(n);  // per node: strategy -> the base strategy it copies
  for (int i = 0; i < n; ++i) {
    ProblemNode v;
    v.name = "n" + std::to_string(i);
    int ks = k(rng);
    for (int s = 0; s < ks; ++s) {
      v.costs.push_back(cost(rng));
      v.memory.push_back(std::floor(cost(rng)));
      copy_of[i].push_back(s);
    }
    for (int s = 0; s < shadows; ++s) {
      int base = std::uniform_int_distribution<int>(0, ks - 1)(rng);
      v.costs.push_back(v.costs[base] + (zero(rng) ? 0.0 : raise(rng)));
      v.memory.push_back(v.memory[base]);
      copy_of[i].push_back(base);
    }
    if (!memory) v.memory.clear();
    p.nodes.push_back(v);
  }
  for (int i = 1; i < n; ++i) {
    std::uniform_int_distribution<int> pick(0, i - 1);
    std::set<int> srcs = {pick(rng), pick(rng)};
    for (int src : srcs) {
      ProblemEdge e;
      e.src = static_cast<uint32_t>(src);
      e.dst = static_cast<uint32_t>(i);
      const size_t ns = copy_of[src].size(), nt = copy_of[i].size();
      // Base entries first, then every entry is its bases' entry plus a raise for shadows.
      std::vector<std::vector<double>> base(ns, std::vector<double>(nt));
      for (size_t a = 0; a < ns; ++a)
        for (size_t b = 0; b < nt; ++b)
          base[a][b] = a == b ? 0.0 : forbid(rng) ? kInfinity : cost(rng);
      for (size_t a = 0; a < ns; ++a)
        for (size_t b = 0; b < nt; ++b) {
          double c = base[copy_of[src][a]][copy_of[i][b]];
          bool shadow =
              static_cast<int>(a) != copy_of[src][a] || static_cast<int>(b) != copy_of[i][b];
          e.costs.push_back(shadow && !zero(rng) ? c + raise(rng) : c);
        }
      p.edges.push_back(e);
    }
  }
  return p;
}

/// The same edge in factorized form: identical rows (columns) share a class.
ProblemEdge factorize(const ProblemEdge& e, size_t ns, size_t nt) {
  ProblemEdge f;
  f.src = e.src;
  f.dst = e.dst;
  std::vector<std::vector<double>> rows;
  for (size_t a = 0; a < ns; ++a) {
    std::vector<double> r(e.costs.begin() + static_cast<long>(a * nt),
                          e.costs.begin() + static_cast<long>((a + 1) * nt));
    auto it = std::find(rows.begin(), rows.end(), r);
    f.src_class.push_back(static_cast<uint32_t>(it - rows.begin()));
    if (it == rows.end()) rows.push_back(r);
  }
  std::vector<std::vector<double>> cols;
  for (size_t b = 0; b < nt; ++b) {
    std::vector<double> c;
    for (const auto& r : rows) c.push_back(r[b]);
    auto it = std::find(cols.begin(), cols.end(), c);
    f.dst_class.push_back(static_cast<uint32_t>(it - cols.begin()));
    if (it == cols.end()) cols.push_back(c);
  }
  f.num_dst_classes = static_cast<uint32_t>(cols.size());
  for (const auto& r : rows)
    for (const auto& c : cols) f.costs.push_back(c[&r - &rows[0]]);
  return f;
}

/// Caps the memory row at `fraction` of the sum of every node's largest memory.
void capMemoryRow(Problem& p, double fraction) {
  double total = 0;
  for (const auto& v : p.nodes)
    if (!v.memory.empty()) total += *std::max_element(v.memory.begin(), v.memory.end());
  p.memory = MemoryBound{0, total * fraction};
}

/// Solves `p` with every reduction into `stats` and checks it against brute force: the same
/// verdict and, when feasible, the same optimum, proven. Returns the solution when feasible.
std::optional<Solution> reducedMatchesBruteForce(const Problem& p, int trial,
                                                 ReductionStats& stats) {
  auto brute = bruteForce(p);
  GraphProblem gp;
  gp.problem = p;
  auto reduced = solveGraphProblem(gp, {}, &stats);
  EXPECT_EQ(brute.ok(), reduced.ok())
      << "trial " << trial << ": " << (reduced.ok() ? "" : reduced.error().message());
  if (!brute.ok() || !reduced.ok()) return std::nullopt;
  EXPECT_NEAR(reduced->objective, brute->objective, 1e-6 * std::max(1.0, brute->objective))
      << "trial " << trial;
  EXPECT_DOUBLE_EQ(evaluate(p, reduced->choice), reduced->objective) << "trial " << trial;
  EXPECT_EQ(reduced->status, SolveStatus::kOptimal) << "trial " << trial;
  return std::move(reduced).value();
}

TEST(Reduction, DominancePruningKeepsTheOptimum) {
  std::mt19937 rng(2024);
  int compared = 0;
  size_t dominated = 0;
  for (int trial = 0; trial < 60; ++trial) {
    Problem p = plantedProblem(rng, 4 + trial % 3, 1 + trial % 2, trial % 3 == 0);
    if (trial % 3 == 0) capMemoryRow(p, 0.6);
    ReductionStats stats;
    if (!reducedMatchesBruteForce(p, trial, stats)) continue;
    dominated += stats.dominated;
    ++compared;
  }
  EXPECT_GE(compared, 40);
  EXPECT_GT(dominated, 40u);  // the planted shadows were found and dropped
}

TEST(Reduction, LargeTablesEliminateExactly) {
  // Three nodes in a ring, 170 strategies each, dense random tables: eliminating a node of degree
  // two is a min-plus product of 170 x 170 tables, which runs on several threads
  // (reducer.cpp, forEachRow). Each trial plants the optimum of node 0 on another strategy (every
  // other one costs 1000, more than all tables together), so every row of the product is the
  // optimum's row in some trial; the optimum must be brute force's.
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> cost(0.0, 100.0);
  const size_t n = 170;
  for (size_t planted = 0; planted < n; planted += 9) {
    Problem p;
    for (int v = 0; v < 3; ++v) {
      ProblemNode node;
      node.name = "n" + std::to_string(v);
      for (size_t s = 0; s < n; ++s)
        node.costs.push_back(v > 0 ? cost(rng) : s == planted ? 0.0 : 1000.0);
      p.nodes.push_back(std::move(node));
    }
    std::vector<std::vector<double>> tables;
    for (auto [a, b] : {std::pair<uint32_t, uint32_t>{0, 1}, {1, 2}, {0, 2}}) {
      ProblemEdge e;
      e.src = a;
      e.dst = b;
      std::vector<double>& t = e.costs.mutableValues();
      for (size_t k = 0; k < n * n; ++k) t.push_back(cost(rng));
      tables.push_back(t);
      p.edges.push_back(std::move(e));
    }
    double best = kInfinity;
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j < n; ++j) {
        double ij = p.nodes[0].costs[i] + p.nodes[1].costs[j] + tables[0][i * n + j];
        for (size_t k = 0; k < n; ++k)
          best = std::min(best,
                          ij + p.nodes[2].costs[k] + tables[1][j * n + k] + tables[2][i * n + k]);
      }
    GraphProblem gp;
    gp.problem = p;
    auto solved = solveGraphProblem(gp, {});
    ASSERT_TRUE(solved.ok()) << solved.error().message();
    EXPECT_NEAR(solved->objective, best, 1e-9 * best) << "planted " << planted;
    EXPECT_EQ(solved->choice[0], planted);
    EXPECT_DOUBLE_EQ(evaluate(p, solved->choice), solved->objective);
    EXPECT_EQ(solved->status, SolveStatus::kOptimal);
  }
}

TEST(Reduction, FactorizedTablesGiveTheSameOptimum) {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 40; ++trial) {
    Problem dense = plantedProblem(rng, 5 + trial % 3, 2, false);
    Problem fact = dense;
    for (ProblemEdge& e : fact.edges)
      e = factorize(e, dense.nodes[e.src].numStrategies(), dense.nodes[e.dst].numStrategies());
    ASSERT_TRUE(fact.validate().ok());
    for (size_t k = 0; k < dense.edges.size(); ++k) {
      const ProblemEdge& d = dense.edges[k];
      const size_t ns = dense.nodes[d.src].numStrategies(), nt = dense.nodes[d.dst].numStrategies();
      for (size_t s = 0; s < ns; ++s)
        for (size_t t = 0; t < nt; ++t) ASSERT_EQ(fact.edges[k].cost(s, t, nt), d.cost(s, t, nt));
    }
    auto brute = bruteForce(dense);
    ASSERT_TRUE(brute.ok());
    GraphProblem gp;
    gp.problem = fact;
    auto reduced = solveGraphProblem(gp);
    ASSERT_TRUE(reduced.ok()) << reduced.error().message();
    EXPECT_NEAR(reduced->objective, brute->objective, 1e-6 * std::max(1.0, brute->objective))
        << "trial " << trial;
    SolveGraphOptions no_reduce;
    no_reduce.reduce = false;
    auto ilp = solveGraphProblem(gp, no_reduce);  // the ILP on factorized tables directly
    ASSERT_TRUE(ilp.ok());
    EXPECT_NEAR(ilp->objective, brute->objective, 1e-6 * std::max(1.0, brute->objective));
    // Dumps keep the factorized form.
    auto back = problemFromJson(toJson(fact));
    ASSERT_TRUE(back.ok()) << back.error().message();
    EXPECT_EQ(back->edges[0].src_class, fact.edges[0].src_class);
  }
}

/// Adds a node of the given costs and module path (one placeholder strategy per cost) to `gp`.
uint32_t addNode(GraphProblem& gp, std::string name, std::vector<double> costs, std::string path) {
  ProblemNode n;
  n.name = std::move(name);
  n.costs = std::move(costs);
  gp.problem.nodes.push_back(std::move(n));
  gp.module_paths.push_back(std::move(path));
  gp.strategies.emplace_back(std::vector<strategy::Strategy>(gp.problem.nodes.back().costs.size()));
  gp.graph_nodes.emplace_back();
  return static_cast<uint32_t>(gp.problem.nodes.size() - 1);
}

/// Three layers `layers.<i>.a -> layers.<i>.b` chained and fed from one input: the clustered solve
/// and the check both run.
GraphProblem layered() {
  GraphProblem gp;
  Problem& p = gp.problem;
  auto add = [&](std::string name, std::vector<double> costs, std::string path) {
    return addNode(gp, std::move(name), std::move(costs), std::move(path));
  };
  uint32_t prev = add("in", {0, 0, 0}, "");
  for (int i = 0; i < 3; ++i) {
    std::string l = "layers." + std::to_string(i) + ".";
    uint32_t a = add(l + "a", {3, 1, 2}, l + "a");
    uint32_t b = add(l + "b", {1, 2, 3}, l + "b");
    uint32_t c = add(l + "c", {2, 2, 1}, l + "c");
    std::vector<double> sw = {0, 4, 5, 4, 0, 6, 5, 6, 0};
    p.edges.push_back({prev, a, sw});
    p.edges.push_back({a, b, sw});
    p.edges.push_back({a, c, sw});
    p.edges.push_back({b, c, {0, 1, 9, 1, 0, 1, 9, 1, 0}});
    prev = c;
  }
  return gp;
}

/// A chain of `layers` identical random layers (`layers.<i>.a`, `.b`: a feeds b, b feeds the
/// next layer's a and b) fed by a pinned input, a shared node `hub` feeding every layer's b (like
/// the rope tables of a transformer), ending in `out`. With `memory`, each a has a memory per
/// strategy and the row allows at most `high` of the total.
GraphProblem randomChain(std::mt19937& rng, int layers, bool memory, double high) {
  std::uniform_real_distribution<double> cost(0, 10);
  std::bernoulli_distribution forbid(0.1);
  GraphProblem gp;
  Problem& p = gp.problem;
  auto add = [&](std::string name, std::vector<double> costs, std::string path) {
    return addNode(gp, std::move(name), std::move(costs), std::move(path));
  };
  auto costs = [&](size_t k) {
    std::vector<double> c(k);
    for (double& x : c) x = std::round(cost(rng) * 4) / 4;  // ties happen
    return c;
  };
  auto table = [&](size_t ns, size_t nt) {
    std::vector<double> t(ns * nt);
    for (size_t a = 0; a < ns; ++a)
      for (size_t b = 0; b < nt; ++b)
        t[a * nt + b] = a == b ? 0.0 : forbid(rng) ? kInfinity : std::round(cost(rng) * 4) / 4;
    return t;
  };
  const size_t ka = 3, kb = 2, kh = 3;
  std::vector<double> ca = costs(ka), cb = costs(kb), ma = {4, 2, 1};
  std::vector<double> t_in = table(ka, ka), t_ab = table(ka, kb), t_ba = table(kb, ka),
                      t_bb = table(kb, kb), t_hb = table(kh, kb), t_out = table(kb, 2);
  uint32_t in = add("in", std::vector<double>(ka, 0.0), "");
  p.nodes[in].pinned = 0;
  p.nodes[in].pin_group = "inputs";
  uint32_t hub = add("hub", costs(kh), "");
  uint32_t prev_b = UINT32_MAX;
  for (int i = 0; i < layers; ++i) {
    std::string l = "layers." + std::to_string(i);
    uint32_t a = add(l + ".a", ca, l + ".a");
    if (memory) p.nodes[a].memory = ma;
    uint32_t b = add(l + ".b", cb, l + ".b");
    if (prev_b == UINT32_MAX) {
      p.edges.push_back({in, a, t_in});
    } else {
      p.edges.push_back({prev_b, a, t_ba});
      p.edges.push_back({prev_b, b, t_bb});
    }
    p.edges.push_back({a, b, t_ab});
    p.edges.push_back({hub, b, t_hb});
    prev_b = b;
  }
  uint32_t out = add("out", costs(2), "");
  p.edges.push_back({prev_b, out, t_out});
  if (memory) p.memory = MemoryBound{0, high * 4 * layers};
  return gp;
}

// The folded bound (solve_graph_problem.cpp, step 3a) is a lower bound on every plan: on random
// chains of identical layers it never exceeds the brute-force optimum, the plan returned is optimal
// whether the bound proved the clustered plan or the check fell back to the unclustered problem,
// and the bound proves the clustered plan in a good share of the cases.
TEST(Clustering, FoldedBoundIsALowerBoundAndOftenProves) {
  std::mt19937 rng(7);
  int folded = 0, proven_by_fold = 0, trials = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int layers = 4 + trial % 3;  // 4 to 6: at least two middle layers fold
    const bool memory = trial % 4 == 3;
    GraphProblem gp = randomChain(rng, layers, memory, trial % 8 == 3 ? 0.5 : 0.8);
    auto brute = bruteForce(gp.problem);
    ReductionStats stats;
    SolveGraphOptions o;
    o.fold_min_ratio = 1;             // fold chains this short too
    o.chain = false;                  // the chain relaxation would answer first (tested below)
    o.memory_search_subproblems = 0;  // so would step 0 on a partly binding row
    auto s = solveGraphProblem(gp, o, &stats);
    ASSERT_EQ(brute.ok(), s.ok()) << "trial " << trial;
    if (!brute.ok()) continue;
    ++trials;
    const double tol = 1e-9 * std::max(1.0, brute->objective);
    EXPECT_NEAR(s->objective, brute->objective, tol) << "trial " << trial;
    EXPECT_EQ(s->status, SolveStatus::kOptimal) << "trial " << trial;
    EXPECT_LE(s->bound, brute->objective + tol) << "trial " << trial;
    EXPECT_EQ(stats.clusters, 1u);
    if (stats.folded_bound) {
      ++folded;
      EXPECT_LE(*stats.folded_bound, brute->objective + 1e-7 * std::max(1.0, brute->objective))
          << "trial " << trial << ": " << clusterCheckText(stats);
    }
    if (stats.cluster_check == ClusterCheck::kMeetsBound &&
        stats.check_bound == CheckBound::kFoldedLp)
      ++proven_by_fold;
  }
  EXPECT_GE(trials, 50);
  EXPECT_EQ(folded, trials);
  EXPECT_GE(proven_by_fold, trials / 4);
  std::cout << "[ info ] folded bound proved " << proven_by_fold << " of " << trials << "\n";
}

// The chain relaxation (chain_bound.h) answers first: on random chains of identical layers its
// bound never exceeds the brute-force optimum, its plan is returned only when it meets that bound
// (then it is optimal), and otherwise (a binding memory row, layers that want other hub
// placements than their neighbours) the check after it still returns an optimum. With
// `cross`, every layer's a also reads the previous layer's a: the layer then does not reduce to
// the one value it passes on, and there is no chain bound.
TEST(Clustering, ChainRelaxationIsALowerBoundAndItsPlanOptimal) {
  std::mt19937 rng(11);
  int proven_by_chain = 0, bounded = 0, trials = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int layers = 4 + trial % 3;
    const bool memory = trial % 4 == 3;
    GraphProblem gp = randomChain(rng, layers, memory, trial % 8 == 3 ? 0.5 : 0.8);
    const bool cross = trial % 10 == 9;
    if (cross) {
      std::vector<uint32_t> as;
      for (uint32_t v = 0; v < gp.problem.nodes.size(); ++v)
        if (gp.problem.nodes[v].name.size() > 2 &&
            gp.problem.nodes[v].name.compare(gp.problem.nodes[v].name.size() - 2, 2, ".a") == 0)
          as.push_back(v);
      for (size_t i = 1; i < as.size(); ++i)
        gp.problem.edges.push_back({as[i - 1], as[i], {0, 1, 2, 1, 0, 1, 2, 1, 0}});
    }
    auto brute = bruteForce(gp.problem);
    ReductionStats stats;
    SolveGraphOptions o;
    o.memory_search_subproblems = 0;  // step 0 would answer a partly binding row first
    auto s = solveGraphProblem(gp, o, &stats);
    ASSERT_EQ(brute.ok(), s.ok()) << "trial " << trial;
    if (!brute.ok()) continue;
    ++trials;
    const double tol = 1e-9 * std::max(1.0, brute->objective);
    EXPECT_NEAR(s->objective, brute->objective, tol) << "trial " << trial;
    EXPECT_EQ(s->status, SolveStatus::kOptimal) << "trial " << trial;
    EXPECT_LE(s->bound, brute->objective + tol) << "trial " << trial;
    if (stats.folded_bound) {
      ++bounded;
      EXPECT_LE(*stats.folded_bound, brute->objective + 1e-7 * std::max(1.0, brute->objective))
          << "trial " << trial << ": " << clusterCheckText(stats);
    }
    if (stats.cluster_check == ClusterCheck::kChainPlanMeetsBound) {
      ++proven_by_chain;
      EXPECT_FALSE(cross) << "trial " << trial;
      EXPECT_FALSE(stats.folded_bound && *stats.folded_bound > s->objective + tol);
    }
  }
  EXPECT_GE(trials, 50);
  EXPECT_GE(proven_by_chain, trials / 3);
  EXPECT_LT(proven_by_chain, trials);  // the fallbacks ran too
  std::cout << "[ info ] chain relaxation's plan proven in " << proven_by_chain << " of " << trials
            << " (a bound in " << bounded << ")\n";
}

/// Two kinds of layer under one prefix, as in DeepSeek-V3 (dense blocks, then mixture-of-experts
/// blocks): `short_layers` of kind A, then `long_layers` of kind B (other costs, so a cluster of
/// its own). Each layer has a parameter `w` (memory per strategy) feeding `a`, and a core a, b, c,
/// d with every pair joined (K4: no elimination of degree 2 reduces it), d passing on to the
/// next layer's a. The memory row allows `high` of the parameters' largest total.
GraphProblem twoKindsOfLayers(std::mt19937& rng, int short_layers, int long_layers, double high) {
  std::uniform_real_distribution<double> cost(0, 10);
  GraphProblem gp;
  Problem& p = gp.problem;
  auto costs = [&](size_t k) {
    std::vector<double> c(k);
    for (double& x : c) x = std::round(cost(rng) * 4) / 4;
    return c;
  };
  auto table = [&] {
    std::vector<double> t(9);
    for (size_t a = 0; a < 3; ++a)
      for (size_t b = 0; b < 3; ++b) t[a * 3 + b] = a == b ? 0.0 : std::round(cost(rng) * 4) / 4;
    return t;
  };
  struct Kind {
    std::vector<std::vector<double>> node_costs;  // w, a, b, c, d
    std::vector<std::vector<double>> tables;      // w-a, a-b, a-c, a-d, b-c, b-d, c-d, d-next a
  };
  std::vector<Kind> kinds(2);
  for (Kind& k : kinds) {
    for (int i = 0; i < 5; ++i) k.node_costs.push_back(costs(3));
    for (int i = 0; i < 8; ++i) k.tables.push_back(table());
  }
  uint32_t in = addNode(gp, "in", {0, 0, 0}, "");
  p.nodes[in].pinned = 0;
  p.nodes[in].pin_group = "inputs";
  uint32_t prev = in;
  std::vector<double> prev_table = kinds[0].tables[7];
  for (int i = 0; i < short_layers + long_layers; ++i) {
    const Kind& k = kinds[i < short_layers ? 0 : 1];
    const std::string l = "layers." + std::to_string(i) + ".";
    std::vector<uint32_t> v;
    for (int j = 0; j < 5; ++j)
      v.push_back(addNode(gp, l + "wabcd"[j], k.node_costs[j], l + "wabcd"[j]));
    p.nodes[v[0]].memory = {4, 2, 1};
    p.edges.push_back({prev, v[1], prev_table});
    const std::pair<int, int> pairs[] = {{0, 1}, {1, 2}, {1, 3}, {1, 4}, {2, 3}, {2, 4}, {3, 4}};
    for (size_t e = 0; e < 7; ++e)
      p.edges.push_back({v[pairs[e].first], v[pairs[e].second], k.tables[e]});
    prev = v[4];
    prev_table = k.tables[7];
  }
  uint32_t out = addNode(gp, "out", costs(3), "");
  p.edges.push_back({prev, out, table()});
  p.memory = MemoryBound{0, high * 4 * (short_layers + long_layers)};
  return gp;
}

// Step 0 (memory_search.h) searches the unclustered problem: when the layers do not reduce, its
// size follows the number of layers, and above SolveGraphOptions::memory_search_max_columns (the
// tied problem's columns times the nodes per tied node) it is skipped; the ILP path then takes
// the row, with clustering and its check. Three layers of one kind (too few to fold) and nine of
// another: the plan is the optimum either way, equal to the unclustered ILP's.
TEST(Clustering, MemorySearchSkippedWhenItsProblemFollowsTheLayers) {
  std::mt19937 rng(21);
  int skipped = 0, searched = 0, trials = 0;
  for (int trial = 0; trial < 8; ++trial) {
    GraphProblem gp = twoKindsOfLayers(rng, 3, 9, trial % 2 == 0 ? 0.6 : 0.8);
    SolveGraphOptions reference;
    reference.cluster = false;
    reference.memory_search_subproblems = 0;
    auto ref = solveGraphProblem(gp, reference);
    if (!ref.ok()) continue;
    ASSERT_EQ(ref->status, SolveStatus::kOptimal);
    ++trials;
    const double tol = 1e-9 * std::max(1.0, ref->objective);
    for (double max_columns : {1.0, 1e9}) {
      SolveGraphOptions o;
      o.memory_search_max_columns = max_columns;
      ReductionStats stats;
      auto s = solveGraphProblem(gp, o, &stats);
      ASSERT_TRUE(s.ok()) << s.error().message();
      EXPECT_NEAR(s->objective, ref->objective, tol) << "trial " << trial;
      EXPECT_EQ(s->status, SolveStatus::kOptimal) << "trial " << trial;
      EXPECT_LE(s->bound, ref->objective + tol) << "trial " << trial;
      EXPECT_DOUBLE_EQ(evaluate(gp.problem, s->choice), s->objective);
      if (max_columns == 1.0) {
        EXPECT_EQ(stats.memory_subproblems, 0u) << "trial " << trial;  // step 0 skipped
        EXPECT_EQ(stats.clusters, 2u);                                 // the ILP path, clustered
        ++skipped;
      } else if (stats.memory_subproblems > 0) {
        ++searched;
      }
    }
  }
  EXPECT_GE(trials, 6);
  EXPECT_EQ(skipped, trials);
  EXPECT_GE(searched, 1);  // the row binds in part: step 0 runs when allowed
}

// Layers that are not series-parallel (twoKindsOfLayers: a K4 core per layer, as DeepSeek-V3's
// mixture-of-experts blocks) have no chain bound, so the check's folded bound (step 3a) starts on a
// second thread beside the clustered solve. The plan is the unclustered ILP's optimum, proven,
// the folded bound proves it in most trials, and solving again gives the same plan (the two
// threads' results do not depend on which finishes first).
TEST(Clustering, FoldedBoundBesideTheClusteredSolveProvesNonSeriesParallelLayers) {
  std::mt19937 rng(34);
  int trials = 0, by_fold = 0;
  for (int trial = 0; trial < 10; ++trial) {
    // Three layers of one kind, then 6 to 9 of another; the row never binds (high = 1).
    GraphProblem gp = twoKindsOfLayers(rng, 3, 6 + trial % 4, 1.0);
    SolveGraphOptions reference;
    reference.cluster = false;
    auto ref = solveGraphProblem(gp, reference);
    ASSERT_TRUE(ref.ok()) << ref.error().message();
    ASSERT_EQ(ref->status, SolveStatus::kOptimal);
    ++trials;
    const double tol = 1e-9 * std::max(1.0, ref->objective);
    SolveGraphOptions o;
    o.fold_min_ratio = 1;  // fold chains this short too
    ReductionStats stats;
    auto s = solveGraphProblem(gp, o, &stats);
    ASSERT_TRUE(s.ok()) << s.error().message();
    EXPECT_EQ(stats.clusters, 2u);
    EXPECT_NE(stats.cluster_check, ClusterCheck::kChainPlanMeetsBound) << "trial " << trial;
    EXPECT_NEAR(s->objective, ref->objective, tol) << "trial " << trial;
    EXPECT_EQ(s->status, SolveStatus::kOptimal) << "trial " << trial;
    EXPECT_LE(s->bound, ref->objective + tol) << "trial " << trial;
    EXPECT_DOUBLE_EQ(evaluate(gp.problem, s->choice), s->objective);
    ASSERT_TRUE(stats.folded_bound.has_value()) << "trial " << trial;
    EXPECT_LE(*stats.folded_bound, ref->objective + tol) << "trial " << trial;
    if (stats.check_bound == CheckBound::kFoldedLp &&
        (stats.cluster_check == ClusterCheck::kMeetsBound ||
         stats.cluster_check == ClusterCheck::kBoundaryMeetsBound))
      ++by_fold;
    auto again = solveGraphProblem(gp, o);
    ASSERT_TRUE(again.ok()) << again.error().message();
    EXPECT_EQ(again->choice, s->choice) << "trial " << trial;
  }
  EXPECT_EQ(trials, 10);
  EXPECT_GE(by_fold, trials / 2);
  std::cout << "[ info ] folded bound proved " << by_fold << " of " << trials << "\n";
}

// Dominance (step 1c) compares a pair of rows only when the scan asks, and settles it by the
// rows' sums first: a row with a larger sum is not <= the other. A +infinity entry (a forbidden
// pair) makes a row's sum +infinity, and the row it dominates elementwise may hold one too: the
// strategy whose row is [1, inf] (cost 2) is dominated by [1, 2] (cost 1), and [0, 5] is not
// comparable with either.
TEST(Reduction, DominanceWithForbiddenPairs) {
  Problem p;
  p.nodes.resize(3);
  p.nodes[0].name = "v";
  p.nodes[0].costs = {2, 1, 1};
  p.nodes[1].name = "u";
  p.nodes[1].costs = {5, 0};
  p.nodes[2].name = "w";
  p.nodes[2].costs = {0, 0};
  // v-u, rows over v: s0 = [1, inf], s1 = [1, 2], s2 = [0, 5].
  p.edges.push_back({0, 1, {1, kInfinity, 1, 2, 0, 5}});
  // u-w and v-w keep every other strategy undominated.
  p.edges.push_back({1, 2, {0, 3, 3, 0}});
  p.edges.push_back({0, 2, {0, 0, 0, 0, 0, 0}});
  ReductionStats stats;
  ASSERT_TRUE(reducedMatchesBruteForce(p, 0, stats));
  EXPECT_EQ(stats.dominated, 1u);
}

TEST(Reduction, UnsupportedStrategiesDropToAFixedPoint) {
  // u - v - w, each with two strategies. u0's row on u-v is all infinite; once u0 is gone, v1's
  // column has no finite entry left; once v1 is gone, w0's has none on v-w. Three drops, each
  // found only after the one before.
  Problem p;
  p.nodes.resize(3);
  p.nodes[0].name = "u";
  p.nodes[0].costs = {0, 5};
  p.nodes[1].name = "v";
  p.nodes[1].costs = {3, 0};
  p.nodes[2].name = "w";
  p.nodes[2].costs = {0, 4};
  p.edges.push_back({0, 1, {kInfinity, kInfinity, 1, kInfinity}});  // rows u, columns v
  p.edges.push_back({1, 2, {kInfinity, 2, 0, 0}});                  // rows v, columns w
  ReductionStats stats;
  std::optional<Solution> s = reducedMatchesBruteForce(p, 0, stats);
  ASSERT_TRUE(s);
  EXPECT_EQ(stats.unsupported, 3u);
  EXPECT_EQ(s->choice, (std::vector<uint32_t>{1, 0, 1}));
}

TEST(Reduction, UnsupportedStrategiesAfterAnElimination) {
  // v - u, v - w and u - w: every strategy has a partner on every edge, so nothing drops before
  // the elimination. u and w stay (their memory varies under a row that binds in part); v is
  // eliminated, and its table summed into u - w forbids every pair but (u1, w1): u0 and w0 drop
  // only then.
  Problem p;
  p.nodes.resize(3);
  p.nodes[0].name = "v";
  p.nodes[0].costs = {0, 0};
  p.nodes[1].name = "u";
  p.nodes[1].costs = {0, 10};
  p.nodes[1].memory = {2, 1};
  p.nodes[2].name = "w";
  p.nodes[2].costs = {0, 10};
  p.nodes[2].memory = {2, 1};
  p.memory = MemoryBound{0, 3};
  p.edges.push_back({0, 1, {0, kInfinity, kInfinity, 0}});  // v0-u0, v1-u1
  p.edges.push_back({0, 2, {0, kInfinity, kInfinity, 0}});  // v0-w0, v1-w1
  p.edges.push_back({1, 2, {kInfinity, 0, 0, 0}});          // all but u0-w0
  ReductionStats stats;
  std::optional<Solution> s = reducedMatchesBruteForce(p, 0, stats);
  ASSERT_TRUE(s);
  EXPECT_EQ(stats.unsupported, 2u);
  EXPECT_EQ(s->choice, (std::vector<uint32_t>{1, 1, 1}));
}

TEST(Reduction, UnsupportedDropsKeepTheOptimumOfMostlyForbiddenPairs) {
  // Random DAGs where most pairs are forbidden: 1a drops strategies (and the problem may be
  // infeasible, which the solve must still report); the optimum is brute force's.
  std::mt19937 rng(77);
  std::uniform_real_distribution<double> cost(0, 100);
  std::bernoulli_distribution forbid(0.6);
  size_t dropped = 0;
  int feasible = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 4 + trial % 3;
    Problem p;
    for (int i = 0; i < n; ++i) {
      ProblemNode v;
      v.name = "n" + std::to_string(i);
      const int ks = 2 + trial % 3;
      for (int k = 0; k < ks; ++k) {
        v.costs.push_back(cost(rng));
        v.memory.push_back(std::floor(cost(rng)));
      }
      // Memory rows on some nodes only: the others are eliminated while these stay, so 1a also
      // runs after eliminations.
      if (trial % 2 || i % 2 == 0) v.memory.clear();
      p.nodes.push_back(v);
    }
    for (int i = 1; i < n; ++i) {
      std::set<int> srcs = {std::uniform_int_distribution<int>(0, i - 1)(rng),
                            std::uniform_int_distribution<int>(0, i - 1)(rng)};
      for (int src : srcs) {
        ProblemEdge e;
        e.src = static_cast<uint32_t>(src);
        e.dst = static_cast<uint32_t>(i);
        for (size_t a = 0; a < p.nodes[src].costs.size(); ++a)
          for (size_t b = 0; b < p.nodes[i].costs.size(); ++b)
            e.costs.push_back(forbid(rng) ? kInfinity : cost(rng));
        p.edges.push_back(e);
      }
    }
    if (trial % 2 == 0) capMemoryRow(p, 0.7);
    ReductionStats stats;
    if (reducedMatchesBruteForce(p, trial, stats)) ++feasible;
    dropped += stats.unsupported;
  }
  EXPECT_GE(feasible, 20);
  EXPECT_GT(dropped, 20u);
}

TEST(TimeLimit, ExpiredDeadlineGivesTheBestPlanWithItsGap) {
  GraphProblem gp = layered();
  auto optimal = solveGraphProblem(gp);
  ASSERT_TRUE(optimal.ok()) << optimal.error().message();
  EXPECT_EQ(optimal->status, SolveStatus::kOptimal);

  SolveGraphOptions o;
  o.solver.deadline =
      Deadline::at(std::chrono::steady_clock::now());  // already past: no time for the check
  ReductionStats stats;
  auto stopped = solveGraphProblem(gp, o, &stats);
  ASSERT_TRUE(stopped.ok()) << stopped.error().message();
  EXPECT_EQ(stopped->status, SolveStatus::kTimeLimit);
  // A plan (the clustered one: the first plan is always made) with a proven bound below it.
  EXPECT_TRUE(std::isfinite(stopped->objective));
  EXPECT_DOUBLE_EQ(evaluate(gp.problem, stopped->choice), stopped->objective);
  EXPECT_GE(stopped->objective, optimal->objective - 1e-9);
  EXPECT_LE(stopped->bound, optimal->objective + 1e-9);
  EXPECT_EQ(stats.clusters, 1u);
  EXPECT_TRUE(stats.cluster_check == ClusterCheck::kNotProven ||
              stats.cluster_check == ClusterCheck::kChainPlanUnproven)
      << clusterCheckText(stats);
}

// Past the deadline, a chain whose relaxation's plan does not meet its bound gets that plan (the
// first plan made) with status time_limit and the relaxation's bound: no tied problem is solved.
TEST(TimeLimit, ExpiredDeadlineGivesTheChainPlanWithItsGap) {
  std::mt19937 rng(5);
  int chain_plans = 0;
  for (int trial = 0; trial < 30; ++trial) {
    GraphProblem gp = randomChain(rng, 5, false, 1);
    auto brute = bruteForce(gp.problem);
    SolveGraphOptions o;
    o.solver.deadline = Deadline::at(std::chrono::steady_clock::now());
    ReductionStats stats;
    auto s = solveGraphProblem(gp, o, &stats);
    ASSERT_EQ(brute.ok(), s.ok()) << "trial " << trial;
    if (!s.ok()) continue;
    const double tol = 1e-9 * std::max(1.0, brute->objective);
    EXPECT_GE(s->objective, brute->objective - tol) << "trial " << trial;
    EXPECT_LE(s->bound, brute->objective + tol) << "trial " << trial;
    EXPECT_DOUBLE_EQ(evaluate(gp.problem, s->choice), s->objective);
    if (stats.cluster_check == ClusterCheck::kChainPlanUnproven) {
      ++chain_plans;
      EXPECT_EQ(s->status, SolveStatus::kTimeLimit) << "trial " << trial;
      EXPECT_LT(s->bound, s->objective) << "trial " << trial;
    } else if (stats.cluster_check == ClusterCheck::kChainPlanMeetsBound) {
      EXPECT_EQ(s->status, SolveStatus::kOptimal) << "trial " << trial;
      EXPECT_NEAR(s->objective, brute->objective, tol) << "trial " << trial;
    }
  }
  EXPECT_GE(chain_plans, 1);
}

// With no time left for the LP, the first solve starts from a greedy plan and returns it: a
// feasible plan, status time_limit, a bound below the optimum (before, the LP ran to the end).
TEST(TimeLimit, NoTimeForTheLpGivesAGreedyPlan) {
  std::mt19937 rng(3);
  int greedy = 0;
  for (int trial = 0; trial < 20; ++trial) {
    GraphProblem gp;
    gp.problem = plantedProblem(rng, 6, 0, false);  // a random DAG: not all of it eliminates
    auto brute = bruteForce(gp.problem);
    if (!brute.ok()) continue;
    SolveGraphOptions o;
    o.cluster = false;
    o.solver.deadline = Deadline::at(std::chrono::steady_clock::now());
    auto s = solveGraphProblem(gp, o);
    ASSERT_TRUE(s.ok()) << s.error().message();
    const double tol = 1e-9 * std::max(1.0, brute->objective);
    EXPECT_DOUBLE_EQ(evaluate(gp.problem, s->choice), s->objective);
    EXPECT_GE(s->objective, brute->objective - tol);
    EXPECT_LE(s->bound, brute->objective + tol);
    if (s->status == SolveStatus::kTimeLimit)
      ++greedy;
    else
      EXPECT_EQ(s->status, SolveStatus::kOptimal);  // everything eliminated: no LP at all
  }
  EXPECT_GE(greedy, 1);
}

// A first-plan deadline that has passed stops solveGraphProblem before any plan (kDeadline, for
// the caller's restricted plan), whether the clustered chain or the plain reduction comes first;
// without one, the same problems solve to their optimum.
TEST(TimeLimit, FirstPlanDeadlineStopsBeforeAnyPlan) {
  std::mt19937 rng(11);
  int stopped = 0;
  for (int trial = 0; trial < 10; ++trial) {
    GraphProblem gp = randomChain(rng, 5, trial % 2 == 1, 0.8);
    auto brute = bruteForce(gp.problem);
    if (!brute.ok()) continue;
    SolveGraphOptions o;
    o.solver.first_plan_deadline = Deadline::at(std::chrono::steady_clock::now());
    auto s = solveGraphProblem(gp, o);
    ASSERT_FALSE(s.ok()) << "trial " << trial;
    EXPECT_EQ(s.error().code(), ErrorCode::kDeadline) << s.error().message();
    ++stopped;
    o.solver.first_plan_deadline = Deadline::none();
    auto full = solveGraphProblem(gp, o);
    ASSERT_TRUE(full.ok()) << full.error().message();
    EXPECT_NEAR(full->objective, brute->objective, 1e-9 * std::max(1.0, brute->objective));
  }
  EXPECT_GE(stopped, 5);
}

TEST(TimeLimit, StartKeptWhenTheLpHasNoTime) {
  Problem p;
  ProblemNode a, b, c;
  a.costs = b.costs = c.costs = {0, 0};
  p.nodes = {a, b, c};
  p.edges = {{0, 1, {1, 0, 0, 1}}, {1, 2, {1, 0, 0, 1}}, {0, 2, {1, 0, 0, 1}}};
  SolverOptions o;
  o.deadline = Deadline::at(std::chrono::steady_clock::now());
  auto s = solve(p, o, {0, 0, 0});
  ASSERT_TRUE(s.ok()) << s.error().message();
  EXPECT_EQ(s->status, SolveStatus::kTimeLimit);
  EXPECT_EQ(s->choice, (std::vector<uint32_t>{0, 0, 0}));
  EXPECT_DOUBLE_EQ(s->objective, 3);
  EXPECT_LE(s->bound, 1.0);  // the optimum is 1; the bound proves no more than it may
}

}  // namespace
}  // namespace apc::solver
