//===- lib/solver/reduce.cpp - Exact problem reduction before the ILP ------===//
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
// 2. Variable elimination on the pairwise cost graph (min-sum), for nodes outside the memory bound:
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
//
//===----------------------------------------------------------------------===//
#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <set>

#include "apc/solver/graph_problem.h"

namespace apc::solver {

namespace {

/// A dense matrix rows x cols, row-major.
struct Matrix {
  size_t rows = 0, cols = 0;
  std::vector<double> v;
  double at(size_t r, size_t c) const { return v[r * cols + c]; }
  double& at(size_t r, size_t c) { return v[r * cols + c]; }
  Matrix transposed() const {
    Matrix t{cols, rows, std::vector<double>(v.size())};
    for (size_t r = 0; r < rows; ++r)
      for (size_t c = 0; c < cols; ++c) t.at(c, r) = at(r, c);
    return t;
  }
};

/// How to recover an eliminated node's choice from its neighbours' choices.
struct Elimination {
  uint32_t node;
  std::vector<uint32_t> neighbours;  // 0, 1 or 2 reduced-node ids
  std::vector<uint32_t> argmin;      // indexed by the neighbours' local choices (row-major)
};

class Reducer {
 public:
  explicit Reducer(const Problem& p) : p_(p) {
    size_t n = p.nodes.size();
    alive_.assign(n, true);
    cost_.resize(n);
    keep_.resize(n);
    adj_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const ProblemNode& v = p.nodes[i];
      for (uint32_t s = 0; s < v.numStrategies(); ++s) {
        bool allowed = std::isfinite(v.costs[s]) && (!v.pinned || *v.pinned == s);
        if (!allowed) continue;
        keep_[i].push_back(s);
        cost_[i].push_back(v.costs[s]);
      }
    }
    fixMemory();
    for (const ProblemEdge& e : p.edges) {
      size_t nt = p.nodes[e.dst].numStrategies();
      Matrix m{keep_[e.src].size(), keep_[e.dst].size(), {}};
      m.v.resize(m.rows * m.cols);
      for (size_t a = 0; a < m.rows; ++a)
        for (size_t b = 0; b < m.cols; ++b)
          m.at(a, b) = e.cost(keep_[e.src][a], keep_[e.dst][b], nt);
      addEdge(e.src, e.dst, std::move(m));
    }
  }

  /// Eliminates what it can; nodes in the memory bound stay.
  void run() {
    bool changed = true;
    while (changed) {
      changed = false;
      for (uint32_t v = 0; v < alive_.size(); ++v) {
        if (!alive_[v] || inMemory(v)) continue;
        if (cost_[v].empty()) continue;  // infeasible node: leave it to the ILP to report
        if (cost_[v].size() == 1 || adj_[v].size() <= 2) {
          eliminate(v);
          changed = true;
        }
      }
    }
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
    for (const auto& [key, m] : edges_) {
      ProblemEdge e;
      e.src = index.at(key.first);
      e.dst = index.at(key.second);
      e.costs = m.v;
      r.edges.push_back(std::move(e));
    }
    if (hasMemoryRow()) {
      // Eliminated nodes of constant memory (1b) contribute `eliminated_memory_` to the row.
      r.memory =
          MemoryBound{p_.memory->low - eliminated_memory_, p_.memory->high - eliminated_memory_};
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
      for (size_t k = 0; k < it->neighbours.size(); ++k) {
        uint32_t nb = it->neighbours[k];
        idx = idx * widths_.at(it->node)[k] + local[nb];
      }
      local[it->node] = it->argmin.empty() ? 0 : it->argmin[idx];
    }
    std::vector<uint32_t> full(alive_.size());
    for (uint32_t v = 0; v < alive_.size(); ++v)
      full[v] = keep_[v].empty() ? 0 : keep_[v][local[v]];
    return full;
  }

  /// The reduced problem's choice that a full choice makes (`ids` as filled by reduced()); empty
  /// when the full choice uses a strategy the reduction dropped (then it was infeasible).
  std::vector<uint32_t> restrictChoice(const std::vector<uint32_t>& ids,
                                       const std::vector<uint32_t>& full) const {
    std::vector<uint32_t> choice(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      const std::vector<uint32_t>& k = keep_[ids[i]];
      auto it = std::find(k.begin(), k.end(), full[ids[i]]);
      if (it == k.end()) return {};
      choice[i] = static_cast<uint32_t>(it - k.begin());
    }
    return choice;
  }

  size_t aliveNodes() const {
    return static_cast<size_t>(std::count(alive_.begin(), alive_.end(), true));
  }

 private:
  /// Whether v's memory varies over its kept strategies (a constant leaves the row, see 1b).
  bool inMemory(uint32_t v) const { return p_.memory && variable_memory_[v]; }
  /// The memory bound after 1b: none when the row is redundant.
  bool hasMemoryRow() const { return p_.memory && !memory_redundant_; }

  /// 1b in the file comment: drops strategies that cannot satisfy (e), marks the nodes whose
  /// remaining memory varies.
  void fixMemory() {
    const size_t n = p_.nodes.size();
    variable_memory_.assign(n, false);
    if (!p_.memory) return;
    auto mem = [&](size_t v, uint32_t s) {
      return p_.nodes[v].memory.empty() ? 0.0 : p_.nodes[v].memory[s];
    };
    const double low = p_.memory->low, high = p_.memory->high;
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
        if (keep_[v].empty() || p_.nodes[v].memory.empty()) continue;
        lo[v] = kInfinity;
        hi[v] = -kInfinity;
        for (uint32_t s : keep_[v]) {
          lo[v] = std::min(lo[v], mem(v, s));
          hi[v] = std::max(hi[v], mem(v, s));
        }
        sum_lo += lo[v];
        sum_hi += hi[v];
      }
      for (size_t v = 0; v < n; ++v) {
        if (keep_[v].empty() || p_.nodes[v].memory.empty() || lo[v] == hi[v]) continue;
        std::vector<uint32_t> keep;
        std::vector<double> cost;
        for (size_t k = 0; k < keep_[v].size(); ++k) {
          double m = mem(v, keep_[v][k]);
          bool over = sum_lo - lo[v] + m > high + tol;
          bool under = sum_hi - hi[v] + m < low - tol;
          if (over || under) continue;
          keep.push_back(keep_[v][k]);
          cost.push_back(cost_[v][k]);
        }
        if (keep.size() == keep_[v].size()) continue;
        keep_[v] = std::move(keep);
        cost_[v] = std::move(cost);
        changed = true;  // the sums above stay valid (weaker) bounds: keep going, then redo
      }
    }
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

  /// The matrix of edge (a, b) oriented with a's strategies as rows.
  Matrix edgeMatrix(uint32_t a, uint32_t b) const {
    if (a < b) return edges_.at({a, b});
    return edges_.at({b, a}).transposed();
  }

  void addEdge(uint32_t a, uint32_t b, Matrix m) {
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
      for (size_t i = 0; i < m.v.size(); ++i) it->second.v[i] += m.v[i];
    }
  }

  void removeEdge(uint32_t a, uint32_t b) {
    edges_.erase({std::min(a, b), std::max(a, b)});
    adj_[a].erase(b);
    adj_[b].erase(a);
  }

  void eliminate(uint32_t v) {
    std::vector<uint32_t> nbs(adj_[v].begin(), adj_[v].end());
    Elimination el;
    el.node = v;
    const std::vector<double>& cv = cost_[v];
    if (cv.size() == 1) {
      // Fixed choice: fold each edge into the neighbour.
      for (uint32_t u : nbs) {
        Matrix m = edgeMatrix(u, v);
        for (size_t s = 0; s < m.rows; ++s) cost_[u][s] += m.at(s, 0);
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
      Matrix m = edgeMatrix(u, v);
      el.neighbours = {u};
      for (size_t s = 0; s < m.rows; ++s) {
        double best = kInfinity;
        uint32_t arg = 0;
        for (size_t t = 0; t < m.cols; ++t) {
          double c = m.at(s, t) + cv[t];
          if (c < best) {
            best = c;
            arg = static_cast<uint32_t>(t);
          }
        }
        cost_[u][s] += best;
        el.argmin.push_back(arg);
      }
      removeEdge(u, v);
    } else {
      uint32_t u = nbs[0], w = nbs[1];
      Matrix a = edgeMatrix(u, v), b = edgeMatrix(v, w);
      Matrix out{a.rows, b.cols, std::vector<double>(a.rows * b.cols)};
      el.neighbours = {u, w};
      el.argmin.resize(a.rows * b.cols);
      for (size_t s = 0; s < a.rows; ++s) {
        for (size_t r = 0; r < b.cols; ++r) {
          double best = kInfinity;
          uint32_t arg = 0;
          for (size_t t = 0; t < a.cols; ++t) {
            double c = a.at(s, t) + cv[t] + b.at(t, r);
            if (c < best) {
              best = c;
              arg = static_cast<uint32_t>(t);
            }
          }
          out.at(s, r) = best;
          el.argmin[s * b.cols + r] = arg;
        }
      }
      removeEdge(u, v);
      removeEdge(v, w);
      addEdge(u, w, std::move(out));
    }
    std::vector<size_t> widths;
    for (uint32_t nb : el.neighbours) widths.push_back(cost_[nb].size());
    widths_[v] = widths;
    eliminations_.push_back(std::move(el));
    alive_[v] = false;
    if (hasMemoryRow() && !p_.nodes[v].memory.empty() && !keep_[v].empty())
      eliminated_memory_ += p_.nodes[v].memory[keep_[v][0]];
  }

  const Problem& p_;
  std::vector<bool> alive_;
  std::vector<std::vector<double>> cost_;    // per node, over kept strategies
  std::vector<std::vector<uint32_t>> keep_;  // kept strategy -> original strategy
  std::vector<std::set<uint32_t>> adj_;
  std::map<std::pair<uint32_t, uint32_t>, Matrix> edges_;
  std::vector<Elimination> eliminations_;
  std::map<uint32_t, std::vector<size_t>> widths_;
  std::vector<bool> variable_memory_;  // per node: memory varies over its kept strategies (1b)
  bool memory_redundant_ = false;      // every choice satisfies the memory bound (1b)
  double eliminated_memory_ = 0;       // constant memory of eliminated nodes (1b)
  double constant_ = 0;
};

/// Step 3 of the file comment: proves the clustered plan `clustered` (a choice of `full`) optimal
/// with the LP bound of the unclustered reduced problem, or replaces it by that problem's optimum.
Expected<Solution> checkClustered(const Problem& full, const SolveGraphOptions& options,
                                  Solution clustered, ReductionStats* stats) {
  auto t0 = std::chrono::steady_clock::now();
  Reducer reducer(full);
  std::vector<uint32_t> ids;
  std::vector<uint32_t> start;
  Problem reduced;
  if (!reducer.hasEmptyNode()) {
    reducer.run();
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
                             : how == StartOutcome::kStartProven
                                 ? "clustered solution verified by LP bound"
                                 : "clustered solution verified by the unclustered ILP";
    // The clustered problem's bound is not one of `full` (it is a restriction): the
    // unclustered one is.
    clustered.status = unclustered.status;
    clustered.bound = std::min(unclustered.bound + reducer.constant(), clustered.objective);
    clustered.seconds += seconds;
    return clustered;
  }
  if (stats) stats->cluster_check = "re-solved without clustering";
  unclustered.choice = std::move(choice);
  unclustered.objective = objective;
  unclustered.bound = std::min(unclustered.bound + reducer.constant(), objective);
  unclustered.seconds += clustered.seconds;
  return unclustered;
}

}  // namespace

Expected<Solution> solveGraphProblem(const GraphProblem& gp, const SolveGraphOptions& options,
                                     ReductionStats* stats) {
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
  if (options.cluster) {
    size_t clusters = 0;
    std::vector<uint32_t> rep = repeatedLayerRepresentatives(gp, &clusters);
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
  return checkClustered(full, options, std::move(s), stats);
}

}  // namespace apc::solver
