//===- lib/solver/solve_graph_problem.cpp - Exact reduction, clustering, ILP ===//
//
// solveGraphProblem reduces the problem before handing it to CBC, then expands the choice back.
// Every reduction here is exact: the reduced optimum plus the recorded back-substitutions is an
// optimum of the full problem.
//
// 1. Pins restrict a node to its pinned strategy; strategies with infinite compute cost are
// dropped.
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
//    by LP bound" in ReductionStats::cluster_check), else the optimum of R, expanded ("re-solved
//    without clustering"). Either way the result is an optimum of the full problem (within the
//    solver's time limit): clustering only makes finding it and proving it cheap.
//    Limits: the check's cost grows with the total number of layers (its LP is over the
//    unclustered problem). Above kMaxCheckColumns, or past the deadline, the clustered plan (or
//    its unclustered re-choice of eliminated nodes, when cheaper) is returned unproven, with the
//    bound of a relaxation (trivialBound, or the folded bound of 3a when larger) so that the plan
//    states its proven gap. Steps 3a and 3b come first and usually make it unnecessary.
// 3a. The folded bound, in time that follows the distinct layers rather than their number. The
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
//    When the clustered plan meets the bound (1e-9 relative) it is optimal.
// 3b. Otherwise the plan is improved on the quotient in which only the middle instances are tied
//    (a restriction: its plans are plans of the full problem): first the nodes its reduction
//    eliminates are re-chosen given the clustered plan (the first and last layers often want
//    other choices there), then that quotient is solved with it as start. A plan that meets the
//    folded bound is optimal. Otherwise the check above runs, unless its LP would clearly be over
//    kMaxCheckColumns (estimated from the folded LP's columns per folded node).
//
//===----------------------------------------------------------------------===//
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "apc/solver/graph_problem.h"
#include "edge_table.h"
#include "lp_bound.h"

namespace apc::solver {

namespace {

using detail::Table;

/// How to recover an eliminated node's choice from its neighbours' choices: the argmin is indexed
/// by the neighbours' classes on the eliminated edges (row-major), `classes` maps each neighbour's
/// kept strategies to those classes.
struct Elimination {
  uint32_t node;
  std::vector<uint32_t> neighbours;            // 0, 1 or 2 reduced-node ids
  std::vector<std::vector<uint32_t>> classes;  // per neighbour: kept strategy -> class
  std::vector<size_t> widths;                  // per neighbour: number of classes
  std::vector<uint32_t> argmin;
};

/// The strategies step 1 keeps: finite cost, the pinned one if any.
std::vector<std::vector<uint32_t>> allowedStrategies(const Problem& p) {
  std::vector<std::vector<uint32_t>> keep(p.nodes.size());
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    const ProblemNode& v = p.nodes[i];
    for (uint32_t s = 0; s < v.numStrategies(); ++s)
      if (std::isfinite(v.costs[s]) && (!v.pinned || *v.pinned == s)) keep[i].push_back(s);
  }
  return keep;
}

/// Step 1b's drops (see the file comment): narrows `keep` to a fixed point.
void dropByMemory(const Problem& p, std::vector<std::vector<uint32_t>>& keep) {
  if (!p.memory) return;
  const size_t n = p.nodes.size();
  auto mem = [&](size_t v, uint32_t s) {
    return p.nodes[v].memory.empty() ? 0.0 : p.nodes[v].memory[s];
  };
  const double low = p.memory->low, high = p.memory->high;
  // Larger than the ILP's slack (1e-9 relative): only strategies that violate (e) by a clear
  // margin are dropped.
  const double tol =
      1e-7 * std::max({1.0, std::fabs(low), std::isfinite(high) ? std::fabs(high) : 0.0});
  bool changed = true;
  while (changed) {
    changed = false;
    std::vector<double> lo(n, 0), hi(n, 0);
    double sum_lo = 0, sum_hi = 0;
    for (size_t v = 0; v < n; ++v) {
      if (keep[v].empty() || p.nodes[v].memory.empty()) continue;
      lo[v] = kInfinity;
      hi[v] = -kInfinity;
      for (uint32_t s : keep[v]) {
        lo[v] = std::min(lo[v], mem(v, s));
        hi[v] = std::max(hi[v], mem(v, s));
      }
      sum_lo += lo[v];
      sum_hi += hi[v];
    }
    for (size_t v = 0; v < n; ++v) {
      if (keep[v].empty() || p.nodes[v].memory.empty() || lo[v] == hi[v]) continue;
      std::vector<uint32_t> kept;
      for (uint32_t s : keep[v]) {
        double m = mem(v, s);
        bool over = sum_lo - lo[v] + m > high + tol;
        bool under = sum_hi - hi[v] + m < low - tol;
        if (!over && !under) kept.push_back(s);
      }
      if (kept.size() == keep[v].size()) continue;
      keep[v] = std::move(kept);
      changed = true;  // the sums above stay valid (weaker) bounds: keep going, then redo
    }
  }
}

struct ReducerOptions {
  // Nodes never eliminated nor pruned (the folded bound's nodes with linked edges); empty = none.
  std::vector<bool> frozen;
  // Step 1b's drops; off when the caller applied them to the problem the nodes stand for.
  bool drop_by_memory = true;
};

class Reducer {
 public:
  explicit Reducer(const Problem& p, ReducerOptions options = {})
      : p_(p), frozen_(std::move(options.frozen)) {
    size_t n = p.nodes.size();
    alive_.assign(n, true);
    cost_.resize(n);
    adj_.resize(n);
    frozen_.resize(n, false);
    keep_ = allowedStrategies(p);
    if (options.drop_by_memory) dropByMemory(p, keep_);
    for (size_t i = 0; i < n; ++i)
      for (uint32_t s : keep_[i]) cost_[i].push_back(p.nodes[i].costs[s]);
    fixMemory();
    for (const ProblemEdge& e : p.edges) {
      Table t = detail::restrict(
          detail::tableOf(e, p.nodes[e.src].numStrategies(), p.nodes[e.dst].numStrategies()),
          keep_[e.src], keep_[e.dst]);
      addEdge(e.src, e.dst, std::move(t));
    }
    if (!hasEmptyNode()) pruneDominated();
  }

  /// Strategies dropped by dominance (step 1c), in the order they were dropped.
  size_t prunedStrategies() const { return pruned_.size(); }

  /// Eliminates what it can; nodes in the memory bound stay.
  /// Stops early, returning false, when `deadline` passes (then the reduction is unfinished and
  /// must not be used).
  bool run(const std::optional<std::chrono::steady_clock::time_point>& deadline = std::nullopt) {
    bool changed = true;
    while (changed) {
      changed = false;
      for (uint32_t v = 0; v < alive_.size(); ++v) {
        if (!alive_[v] || inMemory(v) || frozen_[v]) continue;
        if (cost_[v].empty()) continue;  // infeasible node: leave it to the ILP to report
        if (cost_[v].size() == 1 || adj_[v].size() <= 2) {
          if (deadline && std::chrono::steady_clock::now() > *deadline) return false;
          eliminate(v);
          changed = true;
        }
      }
    }
    return true;
  }

  /// The reduced problem over the surviving nodes; fills `ids` with their original indices.
  Problem reduced(std::vector<uint32_t>& ids) const {
    Problem r;
    bool any_memory = false;
    std::map<uint32_t, uint32_t> index;
    for (uint32_t v = 0; v < alive_.size(); ++v) {
      if (!alive_[v]) continue;
      index[v] = static_cast<uint32_t>(ids.size());
      ids.push_back(v);
      ProblemNode n;
      n.name = p_.nodes[v].name;
      n.costs = cost_[v];
      if (n.costs.empty())
        n.costs.push_back(kInfinity);  // keeps the problem well-formed: infeasible
      if (!p_.nodes[v].memory.empty())
        for (uint32_t s : keep_[v]) n.memory.push_back(p_.nodes[v].memory[s]);
      if (!n.memory.empty() && n.memory.size() != n.costs.size())
        n.memory.resize(n.costs.size(), 0.0);
      r.nodes.push_back(std::move(n));
      any_memory = any_memory || !r.nodes.back().memory.empty();
    }
    for (const auto& [key, m] : edges_)
      r.edges.push_back(detail::edgeOf(index.at(key.first), index.at(key.second), m));
    if (hasMemoryRow()) {
      // Eliminated nodes of constant memory (1b) contribute `eliminated_memory_` to the row.
      r.memory =
          MemoryBound{p_.memory->low - eliminated_memory_, p_.memory->high - eliminated_memory_,
                      p_.memory->total, p_.memory->offset + eliminated_memory_};
      // Without a node left in the row, the constant alone decides feasibility (as evaluate()
      // does); an infeasible constant keeps the row so that the ILP reports it.
      double eps = 1e-9 * std::max(1.0, std::fabs(eliminated_memory_));
      if (!any_memory && eliminated_memory_ >= p_.memory->low - eps &&
          eliminated_memory_ <= p_.memory->high + eps)
        r.memory.reset();
    }
    return r;
  }

  double constant() const { return constant_; }

  bool hasEmptyNode() const {
    return std::any_of(keep_.begin(), keep_.end(), [](const auto& k) { return k.empty(); });
  }

  /// Full choice from the reduced problem's choice.
  std::vector<uint32_t> expand(const std::vector<uint32_t>& ids,
                               const std::vector<uint32_t>& choice) const {
    std::vector<uint32_t> local(alive_.size(), 0);  // index into keep_
    for (size_t i = 0; i < ids.size(); ++i) local[ids[i]] = choice[i];
    for (auto it = eliminations_.rbegin(); it != eliminations_.rend(); ++it) {
      size_t idx = 0;
      for (size_t k = 0; k < it->neighbours.size(); ++k)
        idx = idx * it->widths[k] + it->classes[k][local[it->neighbours[k]]];
      local[it->node] = it->argmin.empty() ? 0 : it->argmin[idx];
    }
    std::vector<uint32_t> full(alive_.size());
    for (uint32_t v = 0; v < alive_.size(); ++v)
      full[v] = keep_[v].empty() ? 0 : keep_[v][local[v]];
    return full;
  }

  /// The reduced problem's choice that a full choice makes (`ids` as filled by reduced()); empty
  /// when the full choice uses a strategy the reduction dropped (then it was infeasible).
  /// A choice that uses a strategy dropped by dominance (1c) is first moved to its dominator, in
  /// the order of the drops: no dearer, and feasible (see the file comment).
  std::vector<uint32_t> restrictChoice(const std::vector<uint32_t>& ids,
                                       std::vector<uint32_t> full) const {
    for (const Pruned& d : pruned_)
      if (full[d.node] == d.dropped) full[d.node] = d.replacement;
    std::vector<uint32_t> choice(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      const std::vector<uint32_t>& k = keep_[ids[i]];
      auto it = std::find(k.begin(), k.end(), full[ids[i]]);
      if (it == k.end()) return {};
      choice[i] = static_cast<uint32_t>(it - k.begin());
    }
    return choice;
  }

  /// Kept strategy -> original strategy of node v.
  const std::vector<uint32_t>& kept(uint32_t v) const { return keep_[v]; }

  size_t aliveNodes() const {
    return static_cast<size_t>(std::count(alive_.begin(), alive_.end(), true));
  }

 private:
  /// Whether v's memory varies over its kept strategies (a constant leaves the row, see 1b).
  bool inMemory(uint32_t v) const { return p_.memory && variable_memory_[v]; }
  /// The memory bound after 1b: none when the row is redundant.
  bool hasMemoryRow() const { return p_.memory && !memory_redundant_; }

  /// 1b in the file comment, after the drops: marks the nodes whose remaining memory varies, and
  /// drops a row that every choice satisfies.
  void fixMemory() {
    const size_t n = p_.nodes.size();
    variable_memory_.assign(n, false);
    if (!p_.memory) return;
    auto mem = [&](size_t v, uint32_t s) {
      return p_.nodes[v].memory.empty() ? 0.0 : p_.nodes[v].memory[s];
    };
    const double low = p_.memory->low, high = p_.memory->high;
    // A row that every choice satisfies (a loose budget, like high = 1) is dropped altogether.
    double sum_lo = 0, sum_hi = 0;
    for (size_t v = 0; v < n; ++v) {
      if (keep_[v].empty() || p_.nodes[v].memory.empty()) continue;
      double lo = kInfinity, hi = -kInfinity;
      for (uint32_t s : keep_[v]) {
        lo = std::min(lo, mem(v, s));
        hi = std::max(hi, mem(v, s));
      }
      sum_lo += lo;
      sum_hi += hi;
      variable_memory_[v] = lo != hi;
    }
    // No tolerance needed here: every choice is within [sum_lo, sum_hi] up to summation rounding,
    // far below the ILP's and evaluate()'s slack.
    if (sum_hi <= high && sum_lo >= low) {
      memory_redundant_ = true;
      variable_memory_.assign(n, false);
    }
  }

  /// The table of edge (a, b) oriented with a's strategies as rows.
  Table edgeMatrix(uint32_t a, uint32_t b) const {
    if (a < b) return edges_.at({a, b});
    return edges_.at({b, a}).transposed();
  }

  void addEdge(uint32_t a, uint32_t b, Table m) {
    if (a > b) {
      std::swap(a, b);
      m = m.transposed();
    }
    auto it = edges_.find({a, b});
    if (it == edges_.end()) {
      edges_.emplace(std::make_pair(a, b), std::move(m));
      adj_[a].insert(b);
      adj_[b].insert(a);
    } else {
      it->second = detail::sum(it->second, m);
    }
  }

  void removeEdge(uint32_t a, uint32_t b) {
    edges_.erase({std::min(a, b), std::max(a, b)});
    adj_[a].erase(b);
    adj_[b].erase(a);
  }

  /// 1c in the file comment: drops strategies dominated in cost, memory and every edge row.
  void pruneDominated() {
    const size_t n = alive_.size();
    for (int pass = 0; pass < 3; ++pass) {
      bool changed = false;
      for (uint32_t v = 0; v < n; ++v) changed = pruneNode(v) || changed;
      if (!changed) break;
    }
  }

  bool pruneNode(uint32_t v) {
    const size_t ns = cost_[v].size();
    if (ns < 2 || frozen_[v]) return false;
    std::vector<uint32_t> nbs(adj_[v].begin(), adj_[v].end());
    // Per incident edge: the table with v's strategies as rows, and which row is <= which.
    std::vector<Table> tables;
    std::vector<std::vector<bool>> leq;  // leq[k][a * rows + b]: row a <= row b elementwise
    size_t work = 0;
    for (uint32_t u : nbs) {
      tables.push_back(edgeMatrix(v, u));
      const Table& t = tables.back();
      work += t.rows * t.rows * t.cols;
    }
    if (work > kDominanceWork) return false;  // too large to compare: keep everything (exact)
    for (const Table& t : tables) {
      std::vector<bool> l(t.rows * t.rows, false);
      for (size_t a = 0; a < t.rows; ++a)
        for (size_t b = 0; b < t.rows; ++b) {
          bool ok = true;
          for (size_t c = 0; c < t.cols && ok; ++c) ok = t.at(a, c) <= t.at(b, c);
          l[a * t.rows + b] = ok;
        }
      leq.push_back(std::move(l));
    }
    auto mem = [&](size_t k) {
      return p_.nodes[v].memory.empty() ? 0.0 : p_.nodes[v].memory[keep_[v][k]];
    };
    std::vector<uint32_t> order(ns);
    for (uint32_t k = 0; k < ns; ++k) order[k] = k;
    std::stable_sort(order.begin(), order.end(),
                     [&](uint32_t a, uint32_t b) { return cost_[v][a] < cost_[v][b]; });
    std::vector<uint32_t> kept;
    std::vector<std::pair<uint32_t, uint32_t>> dropped;  // (local dropped, local dominator)
    for (uint32_t s : order) {
      uint32_t by = UINT32_MAX;
      for (uint32_t k : kept) {
        if (mem(k) != mem(s)) continue;
        bool dom = true;
        for (size_t e = 0; e < tables.size() && dom; ++e) {
          const Table& t = tables[e];
          dom = leq[e][t.row_of[k] * t.rows + t.row_of[s]];
        }
        if (dom) {
          by = k;
          break;
        }
      }
      if (by == UINT32_MAX)
        kept.push_back(s);
      else
        dropped.emplace_back(s, by);
    }
    if (dropped.empty()) return false;
    for (auto [s, by] : dropped) pruned_.push_back({v, keep_[v][s], keep_[v][by]});
    std::sort(kept.begin(), kept.end());
    std::vector<uint32_t> keep;
    std::vector<double> cost;
    for (uint32_t k : kept) {
      keep.push_back(keep_[v][k]);
      cost.push_back(cost_[v][k]);
    }
    for (size_t e = 0; e < nbs.size(); ++e) {
      uint32_t u = nbs[e];
      std::vector<uint32_t> all(cost_[u].size());
      for (uint32_t k = 0; k < all.size(); ++k) all[k] = k;
      Table t = detail::restrict(tables[e], kept, all);
      removeEdge(v, u);
      addEdge(v, u, std::move(t));
    }
    keep_[v] = std::move(keep);
    cost_[v] = std::move(cost);
    return true;
  }

  void eliminate(uint32_t v) {
    std::vector<uint32_t> nbs(adj_[v].begin(), adj_[v].end());
    Elimination el;
    el.node = v;
    const std::vector<double>& cv = cost_[v];
    if (cv.size() == 1) {
      // Fixed choice: fold each edge into the neighbour.
      for (uint32_t u : nbs) {
        Table m = edgeMatrix(u, v);
        for (size_t s = 0; s < cost_[u].size(); ++s) cost_[u][s] += m.cost(s, 0);
        removeEdge(u, v);
      }
      constant_ += cv[0];
      el.argmin = {0};
    } else if (nbs.empty()) {
      auto best = std::min_element(cv.begin(), cv.end());
      constant_ += *best;
      el.argmin = {static_cast<uint32_t>(best - cv.begin())};
    } else if (nbs.size() == 1) {
      uint32_t u = nbs[0];
      Table m = edgeMatrix(u, v);
      // The cheapest strategy of v per column class, then per row class of u.
      std::vector<double> col_best(m.cols, kInfinity);
      std::vector<uint32_t> col_arg(m.cols, 0);
      for (size_t t = 0; t < cv.size(); ++t)
        if (cv[t] < col_best[m.col_of[t]]) {
          col_best[m.col_of[t]] = cv[t];
          col_arg[m.col_of[t]] = static_cast<uint32_t>(t);
        }
      std::vector<double> row_best(m.rows, kInfinity);
      el.argmin.assign(m.rows, 0);
      for (size_t a = 0; a < m.rows; ++a)
        for (size_t c = 0; c < m.cols; ++c) {
          double x = m.at(a, c) + col_best[c];
          if (x < row_best[a]) {
            row_best[a] = x;
            el.argmin[a] = col_arg[c];
          }
        }
      for (size_t s = 0; s < cost_[u].size(); ++s) cost_[u][s] += row_best[m.row_of[s]];
      el.neighbours = {u};
      el.classes = {m.row_of};
      el.widths = {m.rows};
      removeEdge(u, v);
    } else {
      uint32_t u = nbs[0], w = nbs[1];
      Table a = edgeMatrix(u, v), b = edgeMatrix(v, w);
      // out(i, j) = min_t a(i, col_a(t)) + c(t) + b(row_b(t), j), in two stages over the classes
      // of v, v's cheapest strategy per (col_a, row_b) pair standing for the others. Either
      // P(i, r) = min over pairs with row_b = r of a(i, col_a) + c, then out(i, j) = min_r P(i, r)
      // + b(r, j) (a.rows x b.rows x b.cols), or Q(k, j) = min over pairs with col_a = k of c +
      // b(row_b, j), then out(i, j) = min_k a(i, k) + Q(k, j) (a.rows x a.cols x b.cols): the
      // cheaper of the two, a choice made from the sizes alone (deterministic).
      std::map<std::pair<uint32_t, uint32_t>, uint32_t> best_t;  // (col_a, row_b) -> cheapest t
      for (uint32_t t = 0; t < cv.size(); ++t) {
        auto [it, fresh] = best_t.try_emplace({a.col_of[t], b.row_of[t]}, t);
        if (!fresh && cv[t] < cv[it->second]) it->second = t;
      }
      Table out;
      out.row_of = a.row_of;
      out.col_of = b.col_of;
      out.rows = a.rows;
      out.cols = b.cols;
      out.v.assign(a.rows * b.cols, kInfinity);
      el.argmin.assign(a.rows * b.cols, 0);
      if (b.rows <= a.cols) {
        std::vector<double> pm(a.rows * b.rows, kInfinity);
        std::vector<uint32_t> parg(a.rows * b.rows, 0);
        for (const auto& [key, t] : best_t)
          for (size_t i = 0; i < a.rows; ++i) {
            double x = a.at(i, key.first) + cv[t];
            double& cur = pm[i * b.rows + key.second];
            if (x < cur) {
              cur = x;
              parg[i * b.rows + key.second] = t;
            }
          }
        for (size_t i = 0; i < a.rows; ++i)
          for (size_t r = 0; r < b.rows; ++r) {
            double x0 = pm[i * b.rows + r];
            if (!std::isfinite(x0)) continue;
            const double* brow = &b.v[r * b.cols];
            double* orow = &out.v[i * b.cols];
            for (size_t j = 0; j < b.cols; ++j) {
              double x = x0 + brow[j];
              if (x < orow[j]) {
                orow[j] = x;
                el.argmin[i * b.cols + j] = parg[i * b.rows + r];
              }
            }
          }
      } else {
        std::vector<double> qm(a.cols * b.cols, kInfinity);
        std::vector<uint32_t> qarg(a.cols * b.cols, 0);
        for (const auto& [key, t] : best_t) {
          const double* brow = &b.v[key.second * b.cols];
          double* qrow = &qm[key.first * b.cols];
          for (size_t j = 0; j < b.cols; ++j) {
            double x = cv[t] + brow[j];
            if (x < qrow[j]) {
              qrow[j] = x;
              qarg[key.first * b.cols + j] = t;
            }
          }
        }
        for (size_t i = 0; i < a.rows; ++i)
          for (size_t k = 0; k < a.cols; ++k) {
            double x0 = a.at(i, k);
            if (!std::isfinite(x0)) continue;
            const double* qrow = &qm[k * b.cols];
            double* orow = &out.v[i * b.cols];
            for (size_t j = 0; j < b.cols; ++j) {
              double x = x0 + qrow[j];
              if (x < orow[j]) {
                orow[j] = x;
                el.argmin[i * b.cols + j] = qarg[k * b.cols + j];
              }
            }
          }
      }
      // Rows whose every entry is infinite still need an argmin: any t (the pair is forbidden).
      el.neighbours = {u, w};
      el.classes = {a.row_of, b.col_of};
      el.widths = {a.rows, b.cols};
      removeEdge(u, v);
      removeEdge(v, w);
      out.compact();
      addEdge(u, w, std::move(out));
    }
    eliminations_.push_back(std::move(el));
    alive_[v] = false;
    if (hasMemoryRow() && !p_.nodes[v].memory.empty() && !keep_[v].empty())
      eliminated_memory_ += p_.nodes[v].memory[keep_[v][0]];
  }

  /// Above this many comparisons (rows^2 x columns summed over a node's edges) a node is not
  /// checked for dominance.
  static constexpr size_t kDominanceWork = 50'000'000;

  struct Pruned {
    uint32_t node, dropped, replacement;  // original strategy indices
  };

  const Problem& p_;
  std::vector<bool> frozen_;
  std::vector<bool> alive_;
  std::vector<std::vector<double>> cost_;    // per node, over kept strategies
  std::vector<std::vector<uint32_t>> keep_;  // kept strategy -> original strategy
  std::vector<std::set<uint32_t>> adj_;
  std::map<std::pair<uint32_t, uint32_t>, Table> edges_;
  std::vector<Elimination> eliminations_;
  std::vector<Pruned> pruned_;         // 1c, in order
  std::vector<bool> variable_memory_;  // per node: memory varies over its kept strategies (1b)
  bool memory_redundant_ = false;      // every choice satisfies the memory bound (1b)
  double eliminated_memory_ = 0;       // constant memory of eliminated nodes (1b)
  double constant_ = 0;
};

/// The largest unclustered LP the check builds (columns): beyond it (3-d meshes of deep models:
/// llama3_8b on 2x2x2 would need 18.7 M columns, 8.7 GB and minutes) the clustered plan is
/// returned unproven, with a proven gap.
constexpr size_t kMaxCheckColumns = 3'000'000;
/// A rough cost of building and loading the LP, per column (llama3_405b 8x8: 1.9 M columns, about
/// 2 s): the check does not start an LP it could not even build before the deadline.
constexpr double kBuildSecondsPerColumn = 1e-6;
/// The folded bound keeps this many instances at each end of a chain of tied layers unfolded.
constexpr uint32_t kFoldBoundary = 1;

/// The folded bound (step 3a of the file comment): a lower bound on every choice of `full`, or
/// nullopt with the reason in `why`.
struct FoldedBound {
  std::optional<double> bound;
  std::string why;
  size_t columns = 0;       // of the folded LP
  double unfold_ratio = 0;  // nodes of `full` per folded node
};

FoldedBound foldedBound(const Problem& full, const std::vector<uint32_t>& rep,
                        const std::vector<uint32_t>& instance, uint32_t boundary, double min_ratio,
                        const SolverOptions& so, std::chrono::steady_clock::time_point t0) {
  FoldedBound out;
  const size_t n = full.nodes.size();
  std::vector<std::vector<uint32_t>> keep = allowedStrategies(full);
  dropByMemory(full, keep);
  for (const auto& k : keep)
    if (k.empty()) {
      out.why = "a node has no feasible strategy";
      return out;
    }
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
  ro.drop_by_memory = false;  // done on `full` above: the folded row would drop too much
  Reducer reducer(base, ro);
  if (reducer.hasEmptyNode()) {
    out.why = "a folded node has no strategy";
    return out;
  }
  if (!reducer.run(so.deadline)) {
    out.why = kTimeLimitStatus;
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
  if (columns > kMaxCheckColumns) {
    out.why = "the folded LP would have " + std::to_string(columns) + " columns";
    return out;
  }
  double left = secondsLeft(so, t0);
  if (left < kBuildSecondsPerColumn * double(columns)) {
    out.why = kTimeLimitStatus;
    return out;
  }
  std::optional<double> lp = detail::linkedLpBound(reduced, groups, linked, left);
  if (!lp) {
    out.why = "the folded LP was not solved";
    return out;
  }
  out.bound = *lp + reducer.constant();
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
Expected<Solution> checkClustered(const Problem& full, const SolveGraphOptions& options,
                                  Solution clustered, const std::vector<uint32_t>& rep,
                                  const std::vector<uint32_t>& instance, ReductionStats* stats) {
  auto t0 = std::chrono::steady_clock::now();
  // 3a: the folded bound, in time that follows the distinct layers.
  double folded = -kInfinity;
  double unclustered_columns = 0;  // estimated from the folded LP (0: unknown)
  if (secondsLeft(options.solver, t0) > 0) {
    FoldedBound fb =
        foldedBound(full, rep, instance, kFoldBoundary, options.fold_min_ratio, options.solver, t0);
    unclustered_columns = static_cast<double>(fb.columns) * fb.unfold_ratio;
    if (fb.bound) {
      folded = *fb.bound;
      if (stats) stats->folded_bound = folded;
      if (clustered.objective <= folded + 1e-9 * std::max(1.0, std::fabs(folded))) {
        if (stats) {
          stats->cluster_check = "clustered solution verified by the folded LP bound";
          stats->cluster_check_seconds =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        }
        clustered.status = "optimal";
        clustered.bound = std::min(folded, clustered.objective);
        return clustered;
      }
      // 3b: boundary instances free, first re-choosing eliminated nodes, then solving.
      for (bool ilp : {false, true}) {
        if (secondsLeft(options.solver, t0) <= 0) break;
        std::vector<uint32_t> choice = untiedBoundaryPlan(full, rep, instance, kFoldBoundary,
                                                          clustered.choice, options.solver, ilp);
        if (choice.empty()) continue;
        double objective = evaluate(full, choice);
        if (!(objective < clustered.objective)) continue;
        clustered.choice = std::move(choice);
        clustered.objective = objective;
        if (clustered.objective <= folded + 1e-9 * std::max(1.0, std::fabs(folded))) {
          if (stats) {
            stats->cluster_check = "boundary layers re-solved, verified by the folded LP bound";
            stats->cluster_check_seconds =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          }
          clustered.status = "optimal";
          clustered.bound = std::min(folded, clustered.objective);
          return clustered;
        }
      }
    }
  }
  // Not proven: the clustered plan with the bound of a relaxation of `full` (trivialBound).
  auto unproven = [&](const std::string& status, const std::string& why) {
    if (stats) {
      stats->cluster_check = "clustered solution not proven (" + why + ")";
      stats->cluster_check_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    clustered.status = status;
    clustered.bound = std::min(std::max(trivialBound(full), folded), clustered.objective);
    return clustered;
  };
  if (secondsLeft(options.solver, t0) <= 0) return unproven(kTimeLimitStatus, kTimeLimitStatus);
  // The unclustered LP has about as many columns per node as the folded one (llama3_405b 8x8:
  // 2.1 M estimated, 1.9 M built): when that is over the limit, its reduction (which follows the
  // total number of layers) is not even started.
  if (unclustered_columns > double(kMaxCheckColumns))
    return unproven("feasible", "the unclustered LP would have about " +
                                    std::to_string(static_cast<size_t>(unclustered_columns)) +
                                    " columns, over " + std::to_string(kMaxCheckColumns));
  Reducer reducer(full);
  std::vector<uint32_t> ids;
  std::vector<uint32_t> start;
  Problem reduced;
  if (!reducer.hasEmptyNode()) {
    if (secondsLeft(options.solver, t0) <= 0 || !reducer.run(options.solver.deadline))
      return unproven(kTimeLimitStatus, kTimeLimitStatus);
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
    unclustered.status = "optimal";
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
            ? unproven("feasible", "the unclustered LP would have " + std::to_string(columns) +
                                       " columns, over " + std::to_string(kMaxCheckColumns))
            : unproven(kTimeLimitStatus, "no time left to build the unclustered LP of " +
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
    if (stats)
      stats->cluster_check = reduced.nodes.empty() ? "clustered solution verified by elimination"
                             : unclustered.status != "optimal"
                                 ? "clustered solution not proven (" + unclustered.status + ")"
                             : how == StartOutcome::kStartProven
                                 ? "clustered solution verified by LP bound"
                                 : "clustered solution verified by the unclustered ILP";
    // The clustered problem's bound is not one of `full` (it is a restriction): the
    // unclustered one is.
    clustered.status = unclustered.status;
    clustered.bound =
        std::min(std::max(unclustered.bound + reducer.constant(), folded), clustered.objective);
    clustered.seconds += seconds;
    return clustered;
  }
  if (stats) stats->cluster_check = "re-solved without clustering";
  unclustered.choice = std::move(choice);
  unclustered.objective = objective;
  unclustered.bound = std::min(std::max(unclustered.bound + reducer.constant(), folded), objective);
  unclustered.seconds += clustered.seconds;
  return unclustered;
}

}  // namespace

Expected<Solution> solveGraphProblem(const GraphProblem& gp, const SolveGraphOptions& given,
                                     ReductionStats* stats) {
  // One time limit for the whole solve: the clustered solve and the check share it.
  SolveGraphOptions options = given;
  auto limit = std::chrono::steady_clock::now() +
               std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                   std::chrono::duration<double>(std::min(options.solver.time_limit_s, 1e9)));
  if (!options.solver.deadline || limit < *options.solver.deadline) options.solver.deadline = limit;
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
  if (!options.reduce) return solve(full, options.solver);
  // Clustering first (a quotient problem over layer representatives), then elimination on it.
  std::vector<uint32_t> quotient_index(full.nodes.size());
  for (uint32_t v = 0; v < full.nodes.size(); ++v) quotient_index[v] = v;
  Problem quotient;
  const Problem* base = &full;
  std::vector<uint32_t> rep, instance;
  if (options.cluster) {
    size_t clusters = 0;
    rep = repeatedLayerRepresentatives(gp, &clusters, &instance);
    if (stats) stats->clusters = clusters;
    if (clusters > 0) {
      quotient = quotientProblem(full, rep, quotient_index);
      base = &quotient;
    }
  }
  Reducer reducer(*base);
  // A node without an allowed strategy (pins, infinite costs, or the memory bound after 1b): the
  // full problem names the constraint group to blame.
  if (reducer.hasEmptyNode()) return solve(full, options.solver);
  reducer.run();
  std::vector<uint32_t> ids;
  Problem reduced = reducer.reduced(ids);
  if (stats) {
    stats->dominated = reducer.prunedStrategies();
    stats->nodes_after = reduced.nodes.size();
    stats->edges_after = reduced.edges.size();
    stats->strategies_after = reduced.numStrategies();
  }
  Solution s;
  if (reduced.nodes.empty()) {
    s.status = "optimal";
  } else {
    auto r = solve(reduced, options.solver);
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
  return checkClustered(full, options, std::move(s), rep, instance, stats);
}

}  // namespace apc::solver
