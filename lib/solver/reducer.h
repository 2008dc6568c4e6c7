//===- lib/solver/reducer.h - Exact reduction of a Problem -----------------===//
//
// Steps 1-2 of solveGraphProblem (solve_graph_problem.cpp's file comment has the argument for
// each): pins and infinite costs, memory-bound fixing (1b), dominance pruning (1c) and variable
// elimination on the pairwise cost graph (2). Every reduction is exact: the reduced problem's
// optimum, expanded by the recorded back-substitutions, is an optimum of the problem. Used by
// the clustered solve, the folded and chain bounds of its check, and the check itself. Private
// to lib/solver.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "apc/solver/problem.h"
#include "apc/support/deadline.h"
#include "edge_table.h"

namespace apc::solver::detail {

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
std::vector<std::vector<uint32_t>> allowedStrategies(const Problem& p);

/// Step 1b's drops (see the file comment): narrows `keep` to a fixed point.
void dropByMemory(const Problem& p, std::vector<std::vector<uint32_t>>& keep);

/// The least and the most memory of the row over `keep` (per node minima and maxima), and whether
/// some node's memory still varies there. Step 1b's redundancy test and step 0's test use it.
struct MemoryRange {
  double least = 0, most = 0;
  std::vector<bool> varies;  // per node
};
MemoryRange memoryRange(const Problem& p, const std::vector<std::vector<uint32_t>>& keep);

/// Steps 1 and 1b together: per node, the strategies a feasible choice may use; nullopt when a
/// node has none left.
std::optional<std::vector<std::vector<uint32_t>>> feasibleStrategies(const Problem& p);

struct ReducerOptions {
  // Nodes never eliminated nor pruned (the folded bound's nodes with linked edges); empty = none.
  std::vector<bool> frozen;
  // Step 1a on the frozen nodes too: a caller that reads their strategies through kept() (the
  // folded bound) rather than by their original indices (the chain bound).
  bool drop_unsupported_frozen = false;
  // Step 1b's drops; off when the caller applied them to the problem the nodes stand for.
  bool drop_by_memory = true;
  // Step 1c; off where the reduction runs many times on small problems that elimination solves
  // anyway (step 0's subproblems: there it was half the time).
  bool prune_dominated = true;
  // Construction (the dense tables, dominance pruning: seconds on four-dim meshes) stops when
  // this passes; then stopped() is true and the reducer must not be used.
  Deadline deadline;
};

class Reducer {
 public:
  explicit Reducer(const Problem& p, ReducerOptions options = {});

  /// True when construction stopped at ReducerOptions::deadline.
  bool stopped() const { return stopped_; }

  /// Strategies dropped by dominance (step 1c), in the order they were dropped.
  size_t prunedStrategies() const { return pruned_.size(); }

  /// Strategies dropped because an edge allows none of them (step 1a).
  size_t unsupportedStrategies() const { return unsupported_; }

  /// Eliminates what it can; nodes in the memory bound stay.
  /// Stops early, returning false, when `deadline` passes (then the reduction is unfinished and
  /// must not be used), or at once when construction stopped.
  bool run(const Deadline& deadline = {});

  /// The reduced problem over the surviving nodes; fills `ids` with their original indices.
  Problem reduced(std::vector<uint32_t>& ids) const;

  double constant() const { return constant_; }

  bool hasEmptyNode() const {
    return std::any_of(keep_.begin(), keep_.end(), [](const auto& k) { return k.empty(); });
  }

  /// Full choice from the reduced problem's choice.
  std::vector<uint32_t> expand(const std::vector<uint32_t>& ids,
                               const std::vector<uint32_t>& choice) const;

  /// The reduced problem's choice that a full choice makes (`ids` as filled by reduced()); empty
  /// when the full choice uses a strategy the reduction dropped (then it was infeasible).
  /// A choice that uses a strategy dropped by dominance (1c) is first moved to its dominator, in
  /// the order of the drops: no dearer, and feasible (see the file comment).
  std::vector<uint32_t> restrictChoice(const std::vector<uint32_t>& ids,
                                       std::vector<uint32_t> full) const;

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
  void fixMemory();

  /// The table of edge (a, b) oriented with a's strategies as rows.
  Table edgeMatrix(uint32_t a, uint32_t b) const {
    if (a < b) return edges_.at({a, b});
    return edges_.at({b, a}).transposed();
  }

  void addEdge(uint32_t a, uint32_t b, Table m);

  void removeEdge(uint32_t a, uint32_t b) {
    edges_.erase({std::min(a, b), std::max(a, b)});
    adj_[a].erase(b);
    adj_[b].erase(a);
  }

  /// 1a in the file comment: drops every strategy whose row is infinite on some edge (no kept
  /// strategy of that neighbour goes with it), to a fixed point. Returns whether it dropped any;
  /// false with stopped_ set when `deadline` passed.
  bool dropUnsupported(const Deadline& deadline);

  /// Keeps the kept strategies `local` of v (indices into keep_[v], ascending), restricts v's
  /// edges to them and renumbers v's kept indices in the eliminations that have v as neighbour.
  void restrictNode(uint32_t v, const std::vector<uint32_t>& local);

  /// 1c in the file comment: drops strategies dominated in cost, memory and every edge row.
  void pruneDominated(const Deadline& deadline);

  bool pruneNode(uint32_t v);

  void eliminate(uint32_t v);

  /// Above this many comparisons (rows^2 x columns summed over a node's edges) a node is not
  /// checked for dominance.
  static constexpr size_t kDominanceWork = 50'000'000;

  struct Pruned {
    uint32_t node, dropped, replacement;  // original strategy indices
  };

  const Problem& p_;
  std::vector<bool> frozen_;
  bool drop_unsupported_frozen_ = false;
  std::vector<bool> alive_;
  std::vector<std::vector<double>> cost_;  // per node, over kept strategies
  std::vector<std::vector<uint32_t>> keep_;
  bool stopped_ = false;  // kept strategy -> original strategy
  std::vector<std::set<uint32_t>> adj_;
  std::map<std::pair<uint32_t, uint32_t>, Table> edges_;
  std::vector<Elimination> eliminations_;
  std::vector<Pruned> pruned_;         // 1c, in order
  size_t unsupported_ = 0;             // strategies dropped by 1a
  std::vector<bool> variable_memory_;  // per node: memory varies over its kept strategies (1b)
  bool memory_redundant_ = false;      // every choice satisfies the memory bound (1b)
  double eliminated_memory_ = 0;       // constant memory of eliminated nodes (1b)
  double constant_ = 0;
};

}  // namespace apc::solver::detail
