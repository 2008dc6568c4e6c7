//===- lib/solver/solve_graph_problem.cpp - Exact reduction, clustering, ILP ===//
//
// solveGraphProblem reduces the problem before handing it to CBC, then expands the choice back.
// Every reduction here is exact: the reduced optimum plus the recorded back-substitutions is an
// optimum of the full problem.
//
// 0. A memory row that binds in part (memory_search.h): Lagrangian relaxation of the row and
//    branch and bound over memory-free subproblems, each solved by steps 1-2 (and CBC on what they
//    leave), on the problem steps 1-2 leave with the row in place. Finished, its plan is optimal
//    and returned; otherwise steps 1-3 run with the rest of the time, and the better plan and the
//    larger bound of the two are returned. llama_tiny on 2x4 at --memory-budget 0,0.25: proven in
//    0.7 s (343 subproblems) where CBC on the 52,280-column ILP took 72 s. It searches the
//    unclustered problem, so with repeated layers that do not reduce away its size follows the
//    number of layers: when the tied problem after steps 1-2, scaled by the nodes per tied node,
//    is over SolveGraphOptions::memory_search_max_columns, it is skipped and steps 1-3 take the row
//    (DeepSeek-V3 on 8x8x8 at the default budget: 37.9 M columns; its reduction, 18 s, and first
//    subproblem, 70 s, made most of the 12 GB peak, and the search did not finish).
// 1. Pins restrict a node to its pinned strategy; strategies with infinite compute cost are
// dropped.
// 1a. Unsupported strategies (after 1b, before 1c): a strategy of v whose row on some edge is
//    infinite over every kept strategy of the neighbour (no placement there goes with it) is in
//    no feasible choice, and in no point of the LP either (its class row of that edge has no
//    edge column: the x of the class is 0). Dropped, and the neighbours checked again, to a fixed
//    point (arc consistency); again after eliminations, whose summed tables can forbid a pair of
//    classes. A feasible choice uses no such strategy, so restricting one (the clustered plan in
//    step 3) never meets a drop. On DeepSeek-V3's folded problem on 8x8x8 it drops 14 k of 24 k
//    strategies and half the LP's columns, which Clp's presolve found as forcing rows in 2-3 s.
// 1b. Memory-bound fixing (bound propagation on row (e)): a strategy s of v is dropped when even
//    the least memory of every other node cannot keep the total under `high`:
//    sum_{u != v} min_t m[u,t] + m[v,s] > high (likewise for `low` with the maxima), repeated to
//    a fixed point. Every solution that uses s violates (e), so this is exact. With the default
//    budget (1/world size) the row is tight: every parameter must be fully sharded, and all its
//    remaining strategies use the same memory. Such a node's memory is a constant: it leaves the
//    row (the bounds are shifted by the constant) and becomes eliminable like any other node, so
//    parameters fold into their consumers and the ILP sees a much smaller, usually integral, LP.
//    A relative tolerance larger than the ILP's and evaluate()'s slack keeps the drop on the safe
//    side of rounding. A row that every choice satisfies (high >= the sum of the maxima, as with
//    high = 1) is dropped, and all nodes become eliminable.
// 1c. Dominance: a strategy s of v is dropped when another kept strategy s' of v has cost <= and
//    equal memory and, on every edge of v, a row (over the neighbour's kept strategies) <= s's row
//    elementwise. Any choice using s becomes, with s' instead, no dearer and as feasible (the
//    memory row sees the same bytes), so the optimum is unchanged. Drops are logged in order: a
//    choice of the full problem (the clustered plan in step 3) is moved onto kept strategies by
//    replaying the log, each swap no dearer because every other node's choice was kept when that
//    drop was decided. Nodes whose comparison would cost more than kDominanceWork are skipped.
//    Rows are compared only when the scan asks (memoized), and a row whose sum is larger is not
//    <= the other (rounding is monotone): the same drops as comparing every pair, at about half
//    the time (DeepSeek-V3's folded problem on 4x4x4).
//    (On the samples few strategies are dominated: 31 of 818 on llama3_8b 8x8, few on 3-d meshes:
//    strategies there differ in their placements, hence in their edge rows.)
// 2. Variable elimination on the pairwise cost graph (min-sum), for nodes outside the memory bound.
//    Edge tables are factorized (ProblemEdge, edge_table.h) and the eliminations work per class:
//    a node of hundreds of strategies on a 3-d mesh has tens of distinct placements per edge.
//    - a node with one strategy folds its edge costs into its neighbours' node costs;
//    - a node with one neighbour u folds min_t (edge(s,t) + cost(t)) into cost_u(s);
//    - a node with two neighbours u, w becomes one edge u-w with
//      cost(s,r) = min_t (edge_uv(s,t) + cost_v(t) + edge_vw(t,r)), summed into an existing u-w
//      edge;
//    each records its argmin so the choice is recovered in reverse order once the rest is solved.
//    Chains of views and pointwise ops, and the leaves of the graph, disappear this way; parameters
//    (memory bound) and branching nodes remain. This is where the design's "follow-merging" went:
//    eliminating a follower is the exact form of merging it into its producer.
// 3. Repeated-layer clustering (SolveGraphOptions::cluster) solves a restriction, the quotient
//    problem in which tied layers make the same choice. Its plan U, expanded to every node, is
//    then checked against the unclustered problem R (reduced by 1-2, no clustering). U restricted
//    to R's nodes is a feasible choice of R; when its objective is within 1e-9 (relative) of the
//    optimum of R's LP relaxation, a lower bound on every choice of R, it is optimal for R, and
//    its expansion (R's eliminated nodes re-chosen by their argmins) is optimal for the full
//    problem. Otherwise R is solved with U's restriction as the incumbent (an integral LP
//    optimum, or CBC with its objective as cutoff), so the result is never worse than U. U itself
//    is returned when that optimum is not cheaper (the common case, "clustered solution verified
//    by LP bound", ClusterCheck::kVerifiedByLp in ReductionStats), else the optimum of R, expanded
//    ("re-solved without clustering"). Either way the result is an optimum of the full problem
//    (within the solver's time limit): clustering only makes finding it and proving it cheap.
//    Limits: the check's cost grows with the total number of layers (its LP is over the
//    unclustered problem). Above kMaxCheckColumns, or past the deadline, the clustered plan (or
//    its unclustered re-choice of eliminated nodes, when cheaper) is returned unproven, with the
//    bound of a relaxation (trivialBound, or the folded bound of 3a when larger) so that the plan
//    states its proven gap. Steps 3a and 3b come first and usually make it unnecessary.
// 3a. Bounds in time that follows the distinct layers rather than their number, cheapest first.
//    The chain bound (chain_bound.h): a relaxation (memory row dropped, nodes shared by the layers
//    split per edge) that exact reduction and a min-plus power over the middle layers solve; it
//    comes with a plan of the full problem, built from the relaxation's optimum, which is tried
//    before anything else: when that plan meets the bound it is optimal and returned without the
//    clustered solve (llama3_8b on 2x2x2: 1.5 s instead of 8.5 s). Otherwise the bound is the first
//    the clustered plan is checked against, before and after 3b's cheap re-choice. Then the folded
//    bound, an LP, in time that follows the distinct layers too. The
//    tied instances of a chain keep the first and the last (kFoldBoundary) apart; the middle ones
//    fold into one node per position, of weight w (their count), whose distribution stands for
//    their average. The copies of an edge (same table, same pair of representatives) between the
//    same folded nodes share one variable, their summed pair counts M; the marginal constraints of
//    the copies are summed too: sum_b M[a, b] = c w x[F, a] when every member of F has c copies
//    at that end, and when the copies cover F's members unevenly (the chain's links: layer i
//    feeds layer i + 1, so the last middle layer feeds the last layer and the first middle layer
//    is fed by the first one) the copies of that edge into F are pooled, and the pool's sum is
//    equal (even coverage) or <= (uneven: x >= 0) the most copies a member has times w x[F, a].
//    Any plan of the unclustered problem gives a feasible point of this LP (the averages and sums
//    of its indicators) of the same objective, so the LP optimum is a lower bound (the same
//    argument as tying the LP's dual variables of the copies). Before the LP, steps 1c and 2 run
//    on the folded nodes whose copies are identical layers (every edge pairs members of the same
//    instance, or one member with a shared node): there they are the same exact reduction done
//    in every copy. Nodes with pooled edges, and shared nodes with several copies, are frozen.
//    Step 1b runs on the unclustered problem first (on the folded row it would drop too much).
//    When the clustered plan meets the bound (1e-9 relative) it is optimal. The bound does not
//    depend on the clustered plan: without a chain bound (which is then always the case for the
//    check to compute it) it starts on a second thread before the clustered solve, and is waited
//    for where the check needs it (DeepSeek-V3, whose mixture-of-experts blocks are not
//    series-parallel: the clustered solve's 1-2 s overlap the folded bound's 6-12 s). Its LP may
//    have up to kMaxFoldedColumns columns.
// 3b. Otherwise the plan is improved on the quotient in which only the middle instances are tied
//    (a restriction: its plans are plans of the full problem): first the nodes its reduction
//    eliminates are re-chosen given the clustered plan (the first and last layers often want
//    other choices there; without a chain bound this runs on a second thread beside the folded
//    bound), then the folded LP's optimum read as a plan (each folded node's largest x, expanded
//    by the folded reduction: the first and last instances free, the middle ones alike; when that
//    optimum is integral the marginals fix every edge variable, pooled ones too, and the plan's
//    objective is the bound), then that quotient is solved with the re-chosen plan as start.
//    Each is adopted when it evaluates cheaper; a plan that meets the best bound of 3a is
//    optimal (DeepSeek-V3 on 4x4x4 and 2x2x2: the LP's plan, the ILP of 3 M columns not needed).
//    Otherwise the check above runs, unless its LP would clearly be over kMaxCheckColumns
//    (estimated from the folded LP's columns per folded node).
//
//===----------------------------------------------------------------------===//
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "apc/solver/graph_problem.h"
#include "chain_bound.h"
#include "edge_table.h"
#include "lp_bound.h"
#include "memory_search.h"
#include "reducer.h"

namespace apc::solver {

namespace {

using detail::feasibleStrategies;
using detail::Reducer;
using detail::ReducerOptions;
using detail::Table;

/// The largest unclustered LP the check builds (columns): beyond it (3-d meshes of deep models:
/// llama3_8b on 2x2x2 would need 18.7 M columns, 8.7 GB and minutes) the clustered plan is
/// returned unproven, with a proven gap.
constexpr size_t kMaxCheckColumns = 3'000'000;
/// The largest folded LP (step 3a) built, in columns. Its size follows the distinct layers, not
/// their number (the first, a middle and the last instance of each chain): DeepSeek-V3 on 2x2x2
/// needs 3.08 M columns (about 7 s of dual simplex on this project's loaded VM, 1.9 GB peak for
/// the whole plan), which proves the plan that kMaxCheckColumns left at a 4.24% gap.
constexpr size_t kMaxFoldedColumns = 4'000'000;
/// A rough cost of building and loading the LP, per column (llama3_405b 8x8: 1.9 M columns, about
/// 2 s): the check does not start an LP it could not even build before the deadline.
constexpr double kBuildSecondsPerColumn = 1e-6;
/// A rough time of the LP relaxation per column (hf_llama_tiny on 2x2x2: 618 k columns, 15 s on a
/// loaded core): below this much time left, the first solve starts from greedyPlan().
constexpr double kLpSecondsPerColumn = 2e-5;
/// Step 0's share of the time left. Where its subproblems still need CBC (hf_llama_tiny on 2x2: the
/// mask's branches leave 12 nodes, 75 ms a solve) it may not finish; the ILP path then keeps most
/// of the limit, with step 0's plan and bound.
constexpr double kMemorySearchShare = 0.25;

/// A plan of `p` by coordinate descent: each node in turn takes its cheapest strategy given its
/// neighbours' (from the cheapest alone), until none changes (at most 100 rounds). Empty when the
/// result is infeasible (a forbidden pair, the memory row). A first plan when the LP has no time.
std::vector<uint32_t> greedyPlan(const Problem& p) {
  const size_t n = p.nodes.size();
  std::vector<std::vector<std::pair<uint32_t, bool>>> incident(n);  // (edge, v is its source)
  for (uint32_t i = 0; i < p.edges.size(); ++i) {
    incident[p.edges[i].src].push_back({i, true});
    incident[p.edges[i].dst].push_back({i, false});
  }
  std::vector<uint32_t> x(n, 0);
  for (size_t v = 0; v < n; ++v) {
    const std::vector<double>& c = p.nodes[v].costs;
    x[v] = static_cast<uint32_t>(std::min_element(c.begin(), c.end()) - c.begin());
  }
  auto local = [&](size_t v, uint32_t s) {
    double total = p.nodes[v].costs[s];
    for (auto [i, is_src] : incident[v]) {
      const ProblemEdge& e = p.edges[i];
      const size_t nt = p.nodes[e.dst].numStrategies();
      total += is_src ? e.cost(s, x[e.dst], nt) : e.cost(x[e.src], s, nt);
    }
    return total;
  };
  for (int round = 0; round < 100; ++round) {
    bool changed = false;
    for (size_t v = 0; v < n; ++v) {
      double best = local(v, x[v]);
      for (uint32_t s = 0; s < p.nodes[v].numStrategies(); ++s) {
        double c = local(v, s);
        if (c < best - 1e-12 * std::max(1.0, std::fabs(best))) {
          best = c;
          x[v] = s;
          changed = true;
        }
      }
    }
    if (!changed) break;
  }
  if (!std::isfinite(evaluate(p, x))) return {};
  return x;
}

/// The folded bound keeps this many instances at each end of a chain of tied layers unfolded.
constexpr uint32_t kFoldBoundary = 1;

/// Nodes per folded node of the folded bound: below SolveGraphOptions::fold_min_ratio it is not
/// computed.
double foldRatio(const std::vector<uint32_t>& rep, const std::vector<uint32_t>& instance,
                 uint32_t boundary) {
  const size_t n = rep.size();
  std::vector<uint32_t> count(n, 0);
  for (uint32_t v = 0; v < n; ++v) ++count[rep[v]];
  std::vector<bool> seen(n, false);
  size_t nf = 0;
  for (uint32_t v = 0; v < n; ++v) {
    uint32_t r = rep[v], c = count[r], k = instance[v];
    bool mid = c >= 2 * boundary + 2 && k >= boundary && k + boundary < c;
    if (mid && seen[r]) continue;
    if (mid) seen[r] = true;
    ++nf;
  }
  return nf == 0 ? 0.0 : static_cast<double>(n) / static_cast<double>(nf);
}

/// The folded bound (step 3a of the file comment): a lower bound on every choice of `full`, or
/// nullopt with the reason in `why`.
struct FoldedBound {
  std::optional<double> bound;
  std::string why;
  size_t columns = 0;       // of the folded LP
  double unfold_ratio = 0;  // nodes of `full` per folded node
  // With the bound: the LP's optimum as a plan of `full` (each folded node's largest x, expanded,
  // every middle instance of a folded node taking its choice). When the optimum is integral this
  // plan's objective is the bound, and the plan is optimal (the check evaluates it).
  std::vector<uint32_t> plan;
};

FoldedBound foldedBound(const Problem& full, const std::vector<uint32_t>& rep,
                        const std::vector<uint32_t>& instance, uint32_t boundary, double min_ratio,
                        const SolverOptions& so, std::chrono::steady_clock::time_point t0) {
  FoldedBound out;
  const size_t n = full.nodes.size();
  auto feasible = feasibleStrategies(full);
  if (!feasible) {
    out.why = "a node has no feasible strategy";
    return out;
  }
  std::vector<std::vector<uint32_t>> keep = std::move(*feasible);
  // Folded nodes: one per middle instance class of a representative, one per other node.
  std::vector<uint32_t> count(n, 0);
  for (uint32_t v = 0; v < n; ++v) ++count[rep[v]];
  std::vector<uint32_t> fold(n), weight, first;
  std::vector<uint32_t> mid_of(n, UINT32_MAX);  // per representative: its middle folded node
  for (uint32_t v = 0; v < n; ++v) {
    uint32_t r = rep[v], c = count[r], k = instance[v];
    bool mid = c >= 2 * boundary + 2 && k >= boundary && k + boundary < c;
    if (mid && mid_of[r] != UINT32_MAX) {
      fold[v] = mid_of[r];
      ++weight[fold[v]];
      // Tied nodes have equal costs and memory (cluster.cpp), so 1b keeps the same strategies.
      if (keep[v] != keep[first[fold[v]]]) {
        out.why = "tied nodes keep different strategies";
        return out;
      }
      continue;
    }
    fold[v] = static_cast<uint32_t>(weight.size());
    if (mid) mid_of[r] = fold[v];
    weight.push_back(1);
    first.push_back(v);
  }
  const size_t nf = weight.size();
  out.unfold_ratio = static_cast<double>(n) / static_cast<double>(nf);
  if (out.unfold_ratio < min_ratio) {
    // Few layers: the folded LP would be most of the unclustered one, and the check (step 3)
    // is then cheaper alone.
    out.why = "too few tied instances to fold";
    return out;
  }
  Problem base;
  for (uint32_t f = 0; f < nf; ++f) {
    const ProblemNode& m = full.nodes[first[f]];
    ProblemNode node;
    node.name = m.name;
    const double w = weight[f];
    for (uint32_t s : keep[first[f]]) {
      node.costs.push_back(w * m.costs[s]);
      if (!m.memory.empty()) node.memory.push_back(w * m.memory[s]);
    }
    base.nodes.push_back(std::move(node));
  }
  base.memory = full.memory;
  // Edges, in subgroups of copies: the same table between the same pair of representatives, from
  // one folded node to one folded node.
  auto sameTable = [](const ProblemEdge& a, const ProblemEdge& b) {
    return a.num_dst_classes == b.num_dst_classes && a.src_class == b.src_class &&
           a.dst_class == b.dst_class && a.costs == b.costs;
  };
  // Per pair of representatives: (first edge, table class) of each distinct table.
  std::map<std::pair<uint32_t, uint32_t>, std::vector<std::pair<uint32_t, uint32_t>>> tables;
  struct Sub {
    uint32_t edge0, table_class, fu, fv;
    std::vector<uint32_t> edges;
  };
  std::vector<Sub> subs;
  std::map<std::array<uint32_t, 3>, uint32_t> sub_of;  // (table class, fu, fv)
  uint32_t table_classes = 0;
  for (uint32_t i = 0; i < full.edges.size(); ++i) {
    const ProblemEdge& e = full.edges[i];
    auto& list = tables[{rep[e.src], rep[e.dst]}];
    size_t t = 0;
    while (t < list.size() && !sameTable(full.edges[list[t].first], e)) ++t;
    if (t == list.size()) list.emplace_back(i, table_classes++);
    const uint32_t table_class = list[t].second;
    auto [it, fresh] = sub_of.try_emplace({table_class, fold[e.src], fold[e.dst]},
                                          static_cast<uint32_t>(subs.size()));
    if (fresh) subs.push_back({i, table_class, fold[e.src], fold[e.dst], {}});
    subs[it->second].edges.push_back(i);
  }
  // Coverage of a side: how many of the subgroup's copies end at each member of the folded node.
  auto counts = [&](const Sub& h, bool src) {
    std::map<uint32_t, uint32_t> c;
    for (uint32_t i : h.edges) ++c[src ? full.edges[i].src : full.edges[i].dst];
    return c;
  };
  auto uniform = [&](const std::map<uint32_t, uint32_t>& c, uint32_t f, uint32_t& per) {
    per = c.empty() ? 0 : c.begin()->second;
    if (c.size() != weight[f]) return false;
    return std::all_of(c.begin(), c.end(), [&](const auto& kv) { return kv.second == per; });
  };
  std::vector<detail::LinkedGroup> groups;
  std::vector<detail::LinkedEdge> linked;
  std::vector<bool> frozen(nf, false);
  // Pooled sides: (folded node, side, table class) -> group and summed counts.
  struct Pool {
    uint32_t group;
    std::map<uint32_t, uint32_t> counts;
  };
  std::map<std::array<uint32_t, 3>, Pool> pools;
  for (const Sub& h : subs) {
    // The tables are dense (seconds and gigabytes on four-dim meshes): stopped by the deadline,
    // as the reduction below is, so that the solve that waits for this thread keeps its limit.
    if (so.deadline.passed()) {
      out.why = statusName(SolveStatus::kTimeLimit);
      return out;
    }
    const ProblemEdge& e0 = full.edges[h.edge0];
    detail::Table t = detail::restrict(
        detail::tableOf(e0, full.nodes[e0.src].numStrategies(), full.nodes[e0.dst].numStrategies()),
        keep[e0.src], keep[e0.dst]);
    auto cu = counts(h, true), cv = counts(h, false);
    uint32_t pu = 0, pv = 0;
    bool own_u = uniform(cu, h.fu, pu), own_v = uniform(cv, h.fv, pv);
    bool standard = own_u && own_v && h.fu != h.fv;
    if (standard && weight[h.fu] > 1 && weight[h.fv] > 1) {
      // Two middle nodes: the copies must pair members of the same instance (then the folded
      // edge stands for identical copies of one layer, and eliminating it is exact per copy).
      standard = weight[h.fu] == weight[h.fv] && pu == pv;
      for (size_t k = 0; k < h.edges.size() && standard; ++k)
        standard = instance[full.edges[h.edges[k]].src] == instance[full.edges[h.edges[k]].dst];
    }
    if (standard) {
      const double copies = static_cast<double>(h.edges.size());
      if (copies != 1)
        for (double& x : t.v) x *= copies;
      base.edges.push_back(detail::edgeOf(h.fu, h.fv, std::move(t)));
      // A node of weight 1 with several copies to a middle node has more edges than its folded
      // node: never eliminated nor pruned.
      if (weight[h.fu] == 1 && weight[h.fv] > 1) frozen[h.fu] = true;
      if (weight[h.fv] == 1 && weight[h.fu] > 1) frozen[h.fv] = true;
      continue;
    }
    auto side = [&](bool own, uint32_t per, uint32_t f, bool src,
                    const std::map<uint32_t, uint32_t>& c) -> uint32_t {
      if (own) {
        groups.push_back({f, static_cast<double>(per) * weight[f], true});
        return static_cast<uint32_t>(groups.size() - 1);
      }
      auto [it, fresh] = pools.try_emplace({f, src ? 1u : 0u, h.table_class});
      if (fresh) {
        it->second.group = static_cast<uint32_t>(groups.size());
        groups.push_back({f, 0, true});
      }
      for (const auto& [member, k] : c) it->second.counts[member] += k;
      return it->second.group;
    };
    detail::LinkedEdge le;
    le.src = h.fu;
    le.dst = h.fv;
    le.src_group = side(own_u, pu, h.fu, true, cu);
    le.dst_group = side(own_v, pv, h.fv, false, cv);
    le.table = std::move(t);
    linked.push_back(std::move(le));
    frozen[h.fu] = frozen[h.fv] = true;
  }
  for (auto& [key, pool] : pools) {
    uint32_t per = 0;
    detail::LinkedGroup& g = groups[pool.group];
    if (uniform(pool.counts, g.node, per)) {
      g.coef = static_cast<double>(per) * weight[g.node];
    } else {
      // Some members have fewer copies: <= with the most copies any member has (x >= 0).
      uint32_t most = 0;
      for (const auto& [member, k] : pool.counts) most = std::max(most, k);
      g.coef = static_cast<double>(most) * weight[g.node];
      g.equality = false;
    }
  }
  // The exact reductions of steps 1c and 2 on the folded nodes that stand for identical copies.
  ReducerOptions ro;
  ro.frozen = frozen;
  ro.drop_by_memory = false;          // done on `full` above: the folded row would drop too much
  ro.drop_unsupported_frozen = true;  // the linked tables follow reducer.kept() below
  ro.deadline = so.deadline;
  Reducer reducer(base, ro);
  if (reducer.stopped()) {
    out.why = statusName(SolveStatus::kTimeLimit);
    return out;
  }
  if (reducer.hasEmptyNode()) {
    out.why = "a folded node has no strategy";
    return out;
  }
  if (!reducer.run(so.deadline)) {
    out.why = statusName(SolveStatus::kTimeLimit);
    return out;
  }
  std::vector<uint32_t> ids;
  Problem reduced = reducer.reduced(ids);
  std::vector<uint32_t> index(nf, UINT32_MAX);
  for (uint32_t i = 0; i < ids.size(); ++i) index[ids[i]] = i;
  size_t columns = programColumns(reduced);
  for (detail::LinkedEdge& le : linked) {
    le.table = detail::restrict(le.table, reducer.kept(le.src), reducer.kept(le.dst));
    le.src = index[le.src];
    le.dst = index[le.dst];
    for (double c : le.table.v) columns += std::isfinite(c) ? 1 : 0;
  }
  for (detail::LinkedGroup& g : groups) g.node = index[g.node];
  out.columns = columns;
  if (columns > kMaxFoldedColumns) {
    out.why = "the folded LP would have " + std::to_string(columns) + " columns";
    return out;
  }
  double left = secondsLeft(so, t0);
  if (left < kBuildSecondsPerColumn * double(columns)) {
    out.why = statusName(SolveStatus::kTimeLimit);
    return out;
  }
  std::vector<double> x;
  std::optional<double> lp = detail::linkedLpBound(reduced, groups, linked, left, nullptr, &x);
  if (!lp) {
    out.why = "the folded LP was not solved";
    return out;
  }
  out.bound = *lp + reducer.constant();
  // The plan the optimum stands for: on integral x the marginals fix every edge variable, pooled
  // ones too, so its objective is the LP's; the check adopts it only when it evaluates cheaper.
  std::vector<uint32_t> reduced_choice(reduced.nodes.size(), 0);
  size_t at = 0;
  for (size_t i = 0; i < reduced.nodes.size(); ++i) {
    const size_t k = reduced.nodes[i].numStrategies();
    for (size_t s = 1; s < k && at + s < x.size(); ++s)
      if (x[at + s] > x[at + reduced_choice[i]]) reduced_choice[i] = static_cast<uint32_t>(s);
    at += k;
  }
  if (at != x.size()) return out;
  const std::vector<uint32_t> folded_choice = reducer.expand(ids, reduced_choice);
  out.plan.resize(n);
  for (uint32_t v = 0; v < n; ++v) out.plan[v] = keep[v][folded_choice[fold[v]]];
  return out;
}

/// Step 3b of the file comment: the plan `clustered` (the same choice in every tied instance)
/// improved on the quotient in which only the middle instances stay tied (the boundary instances
/// are free): a restriction of `full`, so its plans are plans of `full`. Without `ilp` the nodes
/// that this quotient's reduction eliminates are re-chosen (cheap); with it that quotient is solved
/// (with the re-chosen plan as start). Empty when nothing could be done.
std::vector<uint32_t> untiedBoundaryPlan(const Problem& full, const std::vector<uint32_t>& rep,
                                         const std::vector<uint32_t>& instance, uint32_t boundary,
                                         const std::vector<uint32_t>& clustered,
                                         const SolverOptions& so, bool ilp) {
  const size_t n = full.nodes.size();
  std::vector<uint32_t> count(n, 0), tie(n), first_mid(n, UINT32_MAX);
  for (uint32_t v = 0; v < n; ++v) ++count[rep[v]];
  for (uint32_t v = 0; v < n; ++v) {
    uint32_t r = rep[v], c = count[r], k = instance[v];
    bool mid = c >= 2 * boundary + 2 && k >= boundary && k + boundary < c;
    if (!mid) {
      tie[v] = v;
      continue;
    }
    if (first_mid[r] == UINT32_MAX) first_mid[r] = v;
    tie[v] = first_mid[r];
  }
  std::vector<uint32_t> qindex;
  Problem q = quotientProblem(full, tie, qindex);
  Reducer reducer(q);
  if (reducer.hasEmptyNode() || !reducer.run(so.deadline)) return {};
  std::vector<uint32_t> ids;
  Problem reduced = reducer.reduced(ids);
  std::vector<uint32_t> qchoice(q.nodes.size());
  for (uint32_t v = 0; v < n; ++v) qchoice[qindex[v]] = clustered[v];
  std::vector<uint32_t> start = reducer.restrictChoice(ids, qchoice);
  if (start.empty() && !ids.empty()) return {};
  std::vector<uint32_t> best = reducer.expand(ids, start);
  if (ilp && !reduced.nodes.empty()) {
    auto s = solve(reduced, so, start);
    if (!s.ok()) return {};
    best = reducer.expand(ids, s->choice);
  }
  std::vector<uint32_t> choice(n);
  for (uint32_t v = 0; v < n; ++v) choice[v] = best[qindex[v]];
  return choice;
}

/// Step 3 of the file comment: proves the clustered plan `clustered` (a choice of `full`) optimal
/// with the LP bound of the unclustered reduced problem, or replaces it by that problem's optimum.
/// `ahead`: the folded bound when it was started beside the clustered solve (no chain bound).
Expected<Solution> checkClustered(const Problem& full, const SolveGraphOptions& options,
                                  Solution clustered, const std::vector<uint32_t>& rep,
                                  const std::vector<uint32_t>& instance,
                                  const detail::ChainBound& chain, ReductionStats* stats,
                                  std::future<FoldedBound>* ahead = nullptr) {
  auto t0 = std::chrono::steady_clock::now();
  // The best lower bound so far (3a), and whether the plan meets it.
  double folded = -kInfinity;
  CheckBound bound_kind = CheckBound::kNone;
  auto meets = [&] {
    return clustered.objective <= folded + 1e-9 * std::max(1.0, std::fabs(folded));
  };
  auto proven = [&](ClusterCheck how) {
    if (stats) {
      stats->cluster_check = how;
      stats->check_bound = bound_kind;
      stats->cluster_check_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    clustered.status = SolveStatus::kOptimal;
    clustered.bound = std::min(folded, clustered.objective);
    return clustered;
  };
  // 3a, first the chain bound (computed before the clustered solve).
  if (chain.bound) {
    folded = *chain.bound;
    bound_kind = CheckBound::kChain;
    if (stats) stats->folded_bound = folded;
    if (meets()) return proven(ClusterCheck::kMeetsBound);
  }
  // 3b, cheap part first: the boundary instances' eliminated nodes re-chosen.
  bool rechosen = false;  // 3b without the ILP ran
  bool improved = false;  // 3b changed the plan
  auto verifiedHow = [&] {
    return improved ? ClusterCheck::kBoundaryMeetsBound : ClusterCheck::kMeetsBound;
  };
  // The plan `choice` of 3b when cheaper.
  auto adopt = [&](std::vector<uint32_t> choice) {
    if (choice.empty()) return false;
    double objective = evaluate(full, choice);
    if (!(objective < clustered.objective)) return false;
    clustered.choice = std::move(choice);
    clustered.objective = objective;
    improved = true;
    return true;
  };
  auto rechoose = [&](bool ilp) {
    if (secondsLeft(options.solver, t0) <= 0) return false;
    return adopt(untiedBoundaryPlan(full, rep, instance, kFoldBoundary, clustered.choice,
                                    options.solver, ilp));
  };
  if (std::isfinite(folded)) {
    rechosen = true;
    if (rechoose(false) && meets()) return proven(verifiedHow());
  }
  // 3a, then the folded LP bound, in time that follows the distinct layers.
  double unclustered_columns = 0;  // estimated from the folded LP (0: unknown)
  if (secondsLeft(options.solver, t0) > 0) {
    // 3b's cheap re-choice needs no bound: without the chain bound it runs beside the folded
    // bound (whose LP takes one core) and is taken after it, as it was taken in turn before.
    // Both are deterministic, so the plan does not depend on which finishes first.
    std::future<std::vector<uint32_t>> beside;
    if (!rechosen && foldRatio(rep, instance, kFoldBoundary) >= options.fold_min_ratio)
      beside = std::async(std::launch::async, [&, choice = clustered.choice] {
        return untiedBoundaryPlan(full, rep, instance, kFoldBoundary, choice, options.solver,
                                  false);
      });
    FoldedBound fb = ahead && ahead->valid()
                         ? ahead->get()
                         : foldedBound(full, rep, instance, kFoldBoundary, options.fold_min_ratio,
                                       options.solver, t0);
    unclustered_columns = static_cast<double>(fb.columns) * fb.unfold_ratio;
    if (fb.bound && *fb.bound > folded) {
      folded = *fb.bound;
      bound_kind = CheckBound::kFoldedLp;
      if (stats) stats->folded_bound = folded;
    }
    if (fb.bound) {
      if (meets()) return proven(verifiedHow());
      // 3b: boundary instances free, first re-choosing eliminated nodes, then solving.
      if (!rechosen) {
        rechosen = true;
        std::vector<uint32_t> choice = beside.get();
        if (secondsLeft(options.solver, t0) > 0 && adopt(std::move(choice)) && meets())
          return proven(verifiedHow());
      }
      // The folded LP's optimum as a plan (first and last instances free, the middle ones
      // alike): when integral it meets the bound, and 3b's ILP is not needed (DeepSeek-V3 on
      // 4x4x4 and 2x2x2: 3 M columns, about a third of the solve).
      if (!fb.plan.empty() && secondsLeft(options.solver, t0) > 0 && adopt(std::move(fb.plan)) &&
          meets())
        return proven(verifiedHow());
      if (rechoose(true) && meets()) return proven(verifiedHow());
    }
  }
  // Not proven: the clustered plan with the bound of a relaxation of `full` (trivialBound).
  auto unproven = [&](SolveStatus status, const std::string& why) {
    if (stats) {
      stats->cluster_check = ClusterCheck::kNotProven;
      stats->check_why = why;
      stats->cluster_check_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    clustered.status = status;
    clustered.bound = std::min(std::max(trivialBound(full), folded), clustered.objective);
    return clustered;
  };
  if (secondsLeft(options.solver, t0) <= 0)
    return unproven(SolveStatus::kTimeLimit, statusName(SolveStatus::kTimeLimit));
  // The unclustered LP has about as many columns per node as the folded one (llama3_405b 8x8:
  // 2.1 M estimated, 1.9 M built): when that is over the limit, its reduction (which follows the
  // total number of layers) is not even started.
  if (unclustered_columns > double(kMaxCheckColumns))
    return unproven(SolveStatus::kFeasible,
                    "the unclustered LP would have about " +
                        std::to_string(static_cast<size_t>(unclustered_columns)) +
                        " columns, over " + std::to_string(kMaxCheckColumns));
  // A plan exists: its tables (seconds on four-dim meshes) stop at the final deadline, which
  // leaves the clustered plan with its bound.
  ReducerOptions check_options;
  check_options.deadline = Deadline::after(t0, secondsLeft(options.solver, t0));
  Reducer reducer(full, check_options);
  if (reducer.stopped())
    return unproven(SolveStatus::kTimeLimit, statusName(SolveStatus::kTimeLimit));
  std::vector<uint32_t> ids;
  std::vector<uint32_t> start;
  Problem reduced;
  if (!reducer.hasEmptyNode()) {
    if (secondsLeft(options.solver, t0) <= 0 || !reducer.run(options.solver.deadline))
      return unproven(SolveStatus::kTimeLimit, statusName(SolveStatus::kTimeLimit));
    reduced = reducer.reduced(ids);
    start = reducer.restrictChoice(ids, clustered.choice);
  }
  // The clustered plan is a feasible choice of `full` (its objective is finite), and the exact
  // reduction drops no strategy that a feasible choice uses: unreachable.
  if (reducer.hasEmptyNode() || (start.empty() && !ids.empty()))
    return internalError("the clustered plan violates the unclustered problem");
  Solution unclustered;
  StartOutcome how = StartOutcome::kStartProven;
  if (reduced.nodes.empty()) {
    // Everything was eliminated: the expansion is an optimum.
    unclustered.status = SolveStatus::kOptimal;
    how = StartOutcome::kLpIntegral;
  } else if (size_t columns = programColumns(reduced);
             columns > kMaxCheckColumns ||
             secondsLeft(options.solver, t0) < kBuildSecondsPerColumn * double(columns)) {
    // Too large, or no time to even build the LP (building is not interruptible): unproven.
    // The unclustered elimination re-chooses the eliminated nodes of the clustered plan: keep
    // that when cheaper (as the check would).
    std::vector<uint32_t> rechosen = reducer.expand(ids, start);
    if (evaluate(full, rechosen) < clustered.objective) {
      clustered.choice = std::move(rechosen);
      clustered.objective = evaluate(full, clustered.choice);
    }
    Solution s =
        columns > kMaxCheckColumns
            ? unproven(SolveStatus::kFeasible, "the unclustered LP would have " +
                                                   std::to_string(columns) + " columns, over " +
                                                   std::to_string(kMaxCheckColumns))
            : unproven(SolveStatus::kTimeLimit, "no time left to build the unclustered LP of " +
                                                    std::to_string(columns) + " columns");
    // The reduced problem's bound is tighter: its eliminations are exact minima.
    s.bound = std::min(std::max(s.bound, trivialBound(reduced) + reducer.constant()), s.objective);
    return s;
  } else {
    APC_ASSIGN_OR_RETURN(unclustered, solve(reduced, options.solver, start, &how));
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<uint32_t> choice = reducer.expand(ids, unclustered.choice);
  double objective = evaluate(full, choice);
  if (stats) stats->cluster_check_seconds = seconds;
  // The unclustered solution is optimal (or the best found). It can be cheaper than the clustered
  // plan even when it is the clustered plan's restriction (kStartProven): the unclustered
  // elimination re-chooses the eliminated nodes, which clustering had tied. Keep the clustered
  // plan unless clearly cheaper, so that the plan is the one without the check when that passes.
  if (!(objective < clustered.objective - 1e-9 * std::max(1.0, std::fabs(clustered.objective)))) {
    if (stats) {
      stats->cluster_check = reduced.nodes.empty() ? ClusterCheck::kVerifiedByElimination
                             : unclustered.status != SolveStatus::kOptimal
                                 ? ClusterCheck::kNotProven
                             : how == StartOutcome::kStartProven ? ClusterCheck::kVerifiedByLp
                                                                 : ClusterCheck::kVerifiedByIlp;
      if (stats->cluster_check == ClusterCheck::kNotProven)
        stats->check_why = statusName(unclustered.status);
    }
    // The clustered problem's bound is not one of `full` (it is a restriction): the
    // unclustered one is.
    clustered.status = unclustered.status;
    clustered.bound =
        std::min(std::max(unclustered.bound + reducer.constant(), folded), clustered.objective);
    clustered.seconds += seconds;
    return clustered;
  }
  if (stats) stats->cluster_check = ClusterCheck::kResolved;
  unclustered.choice = std::move(choice);
  unclustered.objective = objective;
  unclustered.bound = std::min(std::max(unclustered.bound + reducer.constant(), folded), objective);
  unclustered.seconds += clustered.seconds;
  return unclustered;
}

/// The tied problem of repeated-layer clustering (step 3) after steps 1-2, made once per solve:
/// step 0's size test (memorySearchTooLarge) and the clustered solve both use it.
struct TiedProblem {
  std::vector<uint32_t> rep, instance, cluster;
  size_t clusters = 0;
  std::vector<uint32_t> quotient_index;  // per node of the full problem: its quotient node
  std::unique_ptr<Problem> quotient;     // null without clusters
  std::unique_ptr<Reducer> reducer;      // of *quotient; null until reduceTied
  bool reduced = false;                  // steps 1-2 ran to the end
};

/// The clusters and their quotient (not reduced yet).
TiedProblem tiedProblem(const GraphProblem& gp) {
  TiedProblem t;
  t.rep = repeatedLayerRepresentatives(gp, &t.clusters, &t.instance, &t.cluster);
  if (t.clusters > 0)
    t.quotient = std::make_unique<Problem>(quotientProblem(gp.problem, t.rep, t.quotient_index));
  return t;
}

/// Steps 1-2 on the quotient, once (until the first plan's deadline, as the clustered solve).
void reduceTied(TiedProblem& t, const SolveGraphOptions& options) {
  if (t.reducer || !t.quotient) return;
  ReducerOptions ro;
  ro.deadline = options.solver.first_plan_deadline;
  t.reducer = std::make_unique<Reducer>(*t.quotient, ro);
  t.reduced = !t.reducer->stopped() && !t.reducer->hasEmptyNode() &&
              t.reducer->run(options.solver.first_plan_deadline);
}

/// Whether step 0 would search a problem whose size follows the number of repeated layers: it
/// runs on the unclustered problem (steps 1-2 with the row in place), and when a layer does not
/// reduce (DeepSeek-V3's mixture-of-experts blocks on a 3-d mesh keep 12 nodes of hundreds of
/// strategies each) that problem, and each subproblem's ILP, has a copy of the layer per instance
/// (8x8x8: 37.9 M columns, 18 s to reduce, 70 s for the first subproblem, 12 GB). Estimated as
/// the tied problem's columns after steps 1-2 (row in place) times the nodes per tied node; above
/// SolveGraphOptions::memory_search_max_columns step 0 is skipped, and the ILP path (clustering
/// and its check, the row in every LP) takes the row, exactly as when step 0 gives up.
bool memorySearchTooLarge(const GraphProblem& gp, const SolveGraphOptions& options,
                          TiedProblem& tied) {
  if (!options.cluster || !tied.quotient) return false;
  reduceTied(tied, options);
  if (!tied.reduced) return false;
  std::vector<uint32_t> ids;
  const size_t columns = programColumns(tied.reducer->reduced(ids));
  const double per_tied = static_cast<double>(gp.problem.nodes.size()) /
                          static_cast<double>(std::max<size_t>(1, tied.quotient->nodes.size()));
  return static_cast<double>(columns) * per_tied > options.memory_search_max_columns;
}

}  // namespace

/// The sizes after steps 1-2 and the strategies they dropped as dominated.
void recordReduction(const Reducer& reducer, const Problem& reduced, ReductionStats* stats) {
  if (!stats) return;
  stats->dominated = reducer.prunedStrategies();
  stats->unsupported = reducer.unsupportedStrategies();
  stats->nodes_after = reduced.nodes.size();
  stats->edges_after = reduced.edges.size();
  stats->strategies_after = reduced.numStrategies();
}

/// Steps 1-3 (the file comment): the reductions, clustering and its check, the ILP. `options`
/// carries the whole solve's deadline.
Expected<Solution> solveReduced(const GraphProblem& gp, const SolveGraphOptions& options,
                                ReductionStats* stats, TiedProblem* given_tied = nullptr) {
  const Problem& full = gp.problem;
  if (!options.reduce) return solve(full, options.solver);
  // Clustering first (a quotient problem over layer representatives), then elimination on it
  // (both perhaps made already for step 0's size test).
  TiedProblem own_tied;
  if (options.cluster && !given_tied) own_tied = tiedProblem(gp);
  TiedProblem& tied = given_tied ? *given_tied : own_tied;
  std::vector<uint32_t> quotient_index;
  if (tied.quotient) {
    quotient_index = tied.quotient_index;
  } else {
    quotient_index.resize(full.nodes.size());
    for (uint32_t v = 0; v < full.nodes.size(); ++v) quotient_index[v] = v;
  }
  const Problem* base = &full;
  const std::vector<uint32_t>& rep = tied.rep;
  const std::vector<uint32_t>& instance = tied.instance;
  const std::vector<uint32_t>& cluster = tied.cluster;
  detail::ChainBound chain;  // step 3a's chain relaxation, when computed
  if (options.cluster) {
    const size_t clusters = tied.clusters;
    if (stats) stats->clusters = clusters;
    // Chains of tied layers: the chain relaxation's plan, optimal when it meets its bound (step
    // 3a); then no clustered solve is needed.
    if (clusters > 0 && options.prove_cluster && options.chain) {
      auto t0 = std::chrono::steady_clock::now();
      chain = detail::chainBound(full, rep, instance, cluster, options.solver);
      auto chainSolution = [&](SolveStatus status, ClusterCheck check) {
        Solution s;
        s.choice = std::move(chain.choice);
        s.objective = chain.objective;
        s.bound = std::min(*chain.bound, chain.objective);
        s.status = status;
        s.variables = chain.variables;
        s.constraints = chain.constraints;
        s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (stats) {
          stats->nodes_after = chain.nodes_left;
          stats->edges_after = chain.edges_left;
          stats->strategies_after = chain.strategies_left;
          stats->folded_bound = chain.bound;
          stats->cluster_check = check;
          stats->cluster_check_seconds = s.seconds;
        }
        return s;
      };
      if (chain.bound && std::isfinite(chain.objective)) {
        if (chain.objective <= *chain.bound + 1e-9 * std::max(1.0, std::fabs(*chain.bound)))
          return chainSolution(SolveStatus::kOptimal, ClusterCheck::kChainPlanMeetsBound);
        // No time left for the tied problem: this plan, with its proven gap.
        if (secondsLeft(options.solver, t0) <= 0)
          return chainSolution(SolveStatus::kTimeLimit, ClusterCheck::kChainPlanUnproven);
      }
    }
    if (clusters > 0) base = tied.quotient.get();
  }
  // Without a chain bound the check (step 3a) always computes the folded bound first, and that
  // bound does not depend on the clustered plan: it starts now, on a second thread beside the
  // clustered solve (its reduction and LP are most of the check: DeepSeek-V3 on 8x8x8, 2.8 M
  // columns). Both are deterministic, so the result does not depend on which finishes first.
  // Declared after `own_tied`, whose layers it reads: its destructor waits for it first.
  std::future<FoldedBound> folded_ahead;
  if (options.cluster && options.prove_cluster && base != &full && !chain.bound) {
    folded_ahead = std::async(std::launch::async, [&full, &rep, &instance, &options] {
      return foldedBound(full, rep, instance, kFoldBoundary, options.fold_min_ratio, options.solver,
                         std::chrono::steady_clock::now());
    });
  }
  std::unique_ptr<Reducer> own_reducer;
  if (base == tied.quotient.get()) {
    reduceTied(tied, options);
  } else {
    ReducerOptions ro;
    ro.deadline = options.solver.first_plan_deadline;
    own_reducer = std::make_unique<Reducer>(*base, ro);
  }
  Reducer& reducer = own_reducer ? *own_reducer : *tied.reducer;
  const auto stopped = [] {
    return deadlineError("the time limit passed before the problem was reduced");
  };
  if (reducer.stopped()) return stopped();
  // A node without an allowed strategy (pins, infinite costs, or the memory bound after 1b): the
  // full problem names the constraint group to blame.
  if (reducer.hasEmptyNode()) return solve(full, options.solver);
  if (!reducer.run(options.solver.first_plan_deadline)) return stopped();
  std::vector<uint32_t> ids;
  Problem reduced = reducer.reduced(ids);
  recordReduction(reducer, reduced, stats);
  Solution s;
  if (reduced.nodes.empty()) {
    s.status = SolveStatus::kOptimal;
  } else {
    // With too little time left for its LP, the solve starts from a greedy plan, which it returns
    // (status time_limit, with a proven bound) when the LP does not finish in time; otherwise
    // the LP runs to the end, as a first plan needs.
    std::vector<uint32_t> start;
    if (secondsLeft(options.solver, std::chrono::steady_clock::now()) <
        kLpSecondsPerColumn * static_cast<double>(programColumns(reduced)))
      start = greedyPlan(reduced);
    auto r = start.empty() ? solve(reduced, options.solver) : solve(reduced, options.solver, start);
    // The reduced problem has the pins applied already; the full problem names the guilty group.
    if (!r.ok() && r.error().code() == ErrorCode::kInfeasible) return solve(full, options.solver);
    if (!r.ok()) return r.error();
    s = std::move(r).value();
  }
  std::vector<uint32_t> base_choice = reducer.expand(ids, s.choice);
  std::vector<uint32_t> choice(full.nodes.size());
  for (uint32_t v = 0; v < full.nodes.size(); ++v) choice[v] = base_choice[quotient_index[v]];
  double objective = evaluate(full, choice);
  if (!std::isfinite(objective)) {
    if (reduced.nodes.empty())
      return solve(full, options.solver);  // infeasible: diagnose on the full problem
    return internalError("the reduced problem's solution violates the full problem");
  }
  s.bound = s.bound + reducer.constant();
  s.choice = std::move(choice);
  s.objective = objective;
  if (base == &full || !options.prove_cluster) return s;
  return checkClustered(full, options, std::move(s), rep, instance, chain, stats, &folded_ahead);
}

std::string clusterCheckText(const ReductionStats& stats) {
  const char* bound = stats.check_bound == CheckBound::kChain      ? "the chain bound"
                      : stats.check_bound == CheckBound::kFoldedLp ? "the folded LP bound"
                                                                   : "a bound";
  switch (stats.cluster_check) {
    case ClusterCheck::kNone:
      return "";
    case ClusterCheck::kChainPlanMeetsBound:
      return "the chain relaxation's plan meets its bound";
    case ClusterCheck::kChainPlanUnproven:
      return "the chain relaxation's plan, not proven (time limit)";
    case ClusterCheck::kMeetsBound:
      return std::string("clustered solution verified by ") + bound;
    case ClusterCheck::kBoundaryMeetsBound:
      return std::string("boundary layers re-solved, verified by ") + bound;
    case ClusterCheck::kVerifiedByLp:
      return "clustered solution verified by LP bound";
    case ClusterCheck::kVerifiedByIlp:
      return "clustered solution verified by the unclustered ILP";
    case ClusterCheck::kVerifiedByElimination:
      return "clustered solution verified by elimination";
    case ClusterCheck::kResolved:
      return "re-solved without clustering";
    case ClusterCheck::kNotProven:
      return "clustered solution not proven (" + stats.check_why + ")";
  }
  return "";
}

namespace {

/// Rounds of solveGraphProblem's read shares (see there).
constexpr int kReadShareRounds = 6;

Expected<Solution> solveEachReadPriced(const GraphProblem& gp, const SolveGraphOptions& given,
                                       ReductionStats* stats);

}  // namespace

Expected<Solution> solveGraphProblem(const GraphProblem& gp, const SolveGraphOptions& options,
                                     ReductionStats* stats) {
  if (gp.shared_reads.empty()) return solveEachReadPriced(gp, options, stats);
  // Shared redistributions (SharedReads) make a plan's price, evaluate(gp, .), more than a sum of
  // pairwise costs. Each round solves withReadShares(gp, shares), a relaxation whose optimum is a
  // lower bound (graph_problem.h), and prices its plan with evaluate(gp, .). The first round
  // splits each price evenly over its readers; where a plan reads a redistribution on readers
  // whose shares sum to less than 1, the next round puts its whole price on those readers, evenly
  // (a subgradient step of the Lagrangian dual; the plan then costs there what it costs). A plan
  // that meets the best bound is optimal. When the rounds end without one, the plan that pays each
  // read whole (gp itself: the plan before reads were shared, never dearer) is a candidate too,
  // and the cheapest plan is returned with the best bound.
  const auto t0 = std::chrono::steady_clock::now();
  SolveGraphOptions rounds = options;
  rounds.solver.deadline =
      options.solver.deadline.earlier(Deadline::after(t0, options.solver.time_limit_s));
  const size_t n = gp.problem.nodes.size();
  ReadShares shares = evenReadShares(gp);
  std::optional<Solution> best;
  double lower = 0;
  auto proven = [&] { return best->objective <= lower * (1 + 1e-9) + 1e-9; };
  auto consider = [&](Solution s) {
    s.choice.resize(n);
    s.objective = evaluate(gp, s.choice);
    if (!best || s.objective < best->objective) best = std::move(s);
  };
  for (int round = 0; round < kReadShareRounds; ++round) {
    APC_ASSIGN_OR_RETURN(Solution s, solveEachReadPriced(withReadShares(gp, shares), rounds,
                                                         round == 0 ? stats : nullptr));
    lower = std::max(lower, s.bound);
    const std::vector<std::vector<std::vector<bool>>> reads = sharedReadsOf(gp, s.choice);
    consider(std::move(s));
    if (proven() || rounds.solver.deadline.passed()) break;
    bool moved = false;
    for (size_t group = 0; group < reads.size(); ++group)
      for (size_t key = 0; key < reads[group].size(); ++key) {
        const std::vector<bool>& on = reads[group][key];
        std::vector<double>& share = shares[group][key];
        double paid = 0;
        size_t count = 0;
        for (size_t i = 0; i < on.size(); ++i) {
          paid += on[i] ? share[i] : 0.0;
          count += on[i] ? 1 : 0;
        }
        if (count == 0 || paid >= 1 - 1e-9) continue;
        for (size_t i = 0; i < on.size(); ++i) share[i] = on[i] ? 1.0 / count : 0.0;
        moved = true;
      }
    if (!moved) break;
  }
  bool whole_considered = false;
  if (!proven() && !rounds.solver.deadline.passed()) {
    auto whole = solveEachReadPriced(gp, rounds, nullptr);
    whole_considered = whole.ok() && whole->status == SolveStatus::kOptimal;
    if (whole.ok()) consider(std::move(whole).value());
  }
  best->bound = std::min(lower, best->objective);
  // Unproven: "feasible" when the rounds and the plan that pays each read whole all finished (the
  // gap is the relaxation's), else the time limit's.
  if (best->status == SolveStatus::kOptimal && !proven())
    best->status = whole_considered ? SolveStatus::kFeasible : SolveStatus::kTimeLimit;
  best->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return *best;
}

namespace {

Expected<Solution> solveEachReadPriced(const GraphProblem& gp, const SolveGraphOptions& given,
                                       ReductionStats* stats) {
  // One time limit for the whole solve: step 0, the clustered solve and the check share it.
  const auto t0 = std::chrono::steady_clock::now();
  SolveGraphOptions options = given;
  options.solver.deadline =
      options.solver.deadline.earlier(Deadline::after(t0, options.solver.time_limit_s));
  const Problem& full = gp.problem;
  APC_RETURN_IF_ERROR(full.validate());
  if (stats) {
    stats->nodes_before = full.nodes.size();
    stats->edges_before = full.edges.size();
    stats->strategies_before = full.numStrategies();
    stats->nodes_after = stats->nodes_before;
    stats->edges_after = stats->edges_before;
    stats->strategies_after = stats->strategies_before;
  }
  if (!options.reduce || options.memory_search_subproblems == 0 || !detail::memoryRowInPlay(full))
    return solveReduced(gp, options, stats);
  TiedProblem tied;
  if (options.cluster) tied = tiedProblem(gp);
  if (memorySearchTooLarge(gp, options, tied)) return solveReduced(gp, options, stats, &tied);
  // Step 0 (memory_search.h) on what steps 1-2 leave with the row in place, for a quarter of the
  // time left (the ILP path keeps the rest when it does not finish).
  ReducerOptions ro;
  ro.deadline = options.solver.first_plan_deadline;
  Reducer reducer(full, ro);
  if (reducer.stopped() || reducer.hasEmptyNode() ||
      !reducer.run(options.solver.first_plan_deadline))
    return solveReduced(gp, options, stats, &tied);
  std::vector<uint32_t> ids;
  Problem reduced = reducer.reduced(ids);
  if (!detail::memoryRowInPlay(reduced)) return solveReduced(gp, options, stats, &tied);
  const Deadline give_up =
      Deadline::after(t0, kMemorySearchShare * secondsLeft(options.solver, t0));
  APC_ASSIGN_OR_RETURN(
      detail::MemorySearchResult found,
      detail::memorySearch(reduced, options.solver, give_up, options.memory_search_subproblems,
                           options.memory_tighten_within));
  if (stats) {
    stats->memory_subproblems = found.subproblems;
    stats->memory_branches = found.branches;
  }
  std::vector<uint32_t> found_choice;
  if (!found.best.choice.empty()) found_choice = reducer.expand(ids, found.best.choice);
  const double found_bound = found.bound + reducer.constant();
  if (stats && !found.proven && !found.hull.empty())
    stats->memory_hull = memoryOf(full, reducer.expand(ids, found.hull));
  if (stats && found.tightened_high > 0 && !found_choice.empty())
    stats->memory_tightened = memoryOf(full, found_choice);
  // Proven, or unproven and the caller takes the search's plan as it is (memory_search_only).
  if (!found_choice.empty() && (found.proven || options.memory_search_only)) {
    Solution s;
    s.choice = std::move(found_choice);
    s.objective = evaluate(full, s.choice);
    if (!std::isfinite(s.objective))
      return internalError("the memory search's plan violates the full problem");
    s.bound = std::min(found_bound, s.objective);
    s.status = found.proven ? SolveStatus::kOptimal : SolveStatus::kTimeLimit;
    s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    recordReduction(reducer, reduced, stats);
    return s;
  }
  // Unfinished, or no plan meets the row (the ILP path names the constraint): the ILP path,
  // keeping the search's plan and bound where they are better.
  APC_ASSIGN_OR_RETURN(Solution s, solveReduced(gp, options, stats, &tied));
  if (!found_choice.empty()) {
    double objective = evaluate(full, found_choice);
    if (std::isfinite(objective) && objective < s.objective) {
      s.choice = std::move(found_choice);
      s.objective = objective;
    }
  }
  s.bound = std::max(s.bound, std::min(found_bound, s.objective));
  return s;
}

}  // namespace

}  // namespace apc::solver
