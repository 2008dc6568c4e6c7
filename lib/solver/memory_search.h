//===- lib/solver/memory_search.h - A memory row that binds in part --------===//
//
// Step 0 of solveGraphProblem (solve_graph_problem.cpp): a memory budget that binds in part (some
// parameters may stay replicated, not all) keeps every parameter out of the exact elimination, so
// the ILP gets every edge table of the parameters' consumers and CBC takes minutes (llama_tiny on
// 2x4 at --memory-budget 0,0.25: 52,280 variables, 72 s) where the same model without the row
// reduces to nothing in 14 ms. This step instead relaxes the row (Lagrangian relaxation) and
// closes the duality gap by branch and bound, every subproblem a memory-free problem that the
// reductions solve exactly:
//
// - For a multiplier lambda >= 0, L(lambda) = min_x c(x) + lambda (m(x) - high) is a lower bound
//   on every plan that meets the row (m(x) <= high makes the added term <= 0). Its minimizer is
//   the memory-free problem with lambda m_v(s) added to every node cost, solved exactly by the
//   reductions of steps 1-2 (and CBC on what they leave, whose status must be kOptimal, else
//   the search gives up). The search runs on the problem that steps 1-2 leave with the row in
//   place (the parameters and the nodes that branch), once: every subproblem is small.
// - The best lambda: L is concave and piecewise linear, its pieces the plans on the lower convex
//   hull of (m(x), c(x)). From x0 (lambda = 0; when it meets the row it is optimal) and a plan
//   that meets the row (lambda grown geometrically until one does), the next lambda is where
//   the two plans' lines cross; a plan below both lines replaces the one on its side of `high`,
//   none means the crossing is L's maximum. Each plan that meets the row is an incumbent.
// - Branch and bound closes the gap that remains (the optimum need not be on the hull): a search
//   node restricts parameters' strategies by their memory (m_v(s) <= t or > t, t halfway between
//   the two hull plans' memory of the parameter where they differ most), the bound propagation of
//   step 1b runs on the restricted lists, and nodes are expanded best bound first until the best
//   open bound reaches the incumbent (proven optimal) or the budget is spent.
//
// Every bound is a proven lower bound on the plans its search node admits, and the incumbent is a
// plan of the full problem, so a finished search returns an optimum. An unfinished one returns its
// incumbent and bound; the caller then falls back to the ILP path. It applies only when the row is
// in play after step 1b (some parameter's memory still varies, the row is not redundant) and its
// low side cannot bind (low <= the least memory), as with every budget `apc plan` takes except an
// explicit positive low.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>

#include "apc/solver/graph_problem.h"
#include "apc/support/deadline.h"

namespace apc::solver::detail {

struct MemorySearchResult {
  Solution best;        // over the searched problem's nodes; choice empty when no plan met the row
  bool proven = false;  // best is optimal: the search finished
  double bound = 0;     // a lower bound on every plan of the searched problem
  size_t subproblems = 0;  // memory-free problems solved
  size_t branches = 0;     // search nodes expanded (1 = the root alone)
  size_t reused = 0;       // minimizers a child took from its parent instead of solving
  /// The root's hull plan that meets the row (a minimizer of the memory-free problem at the
  /// root's best multiplier): an optimum of the problem whose row is at its own memory, whatever
  /// the search proves at `high`. Empty when the root found none.
  std::vector<uint32_t> hull;
  /// > 0: the search stopped at its root with `best` proven optimal for the row at this memory
  /// (below the row's high), the loss against the row asked within memorySearch's
  /// `tighten_within` (see there); `bound` is then best's objective.
  double tightened_high = 0;
};

/// Whether step 0 applies to `p` (see the file comment).
bool memoryRowInPlay(const Problem& p);

/// Runs step 0 on `p` (solveGraphProblem hands it the problem its reductions left, the memory
/// row's nodes among them) until it finishes, `give_up` passes or `max_subproblems` are solved.
/// `tighten_within` > 0 (for a caller whose row's high is an estimate of its own, the device-memory
/// loop): when the root's multiplier search ends at L's maximum and a mix of its two hull plans
/// minimizes c + lambda m and meets the row at memory m' < high, with lambda (high - m') (what a
/// plan with up to `high` could cost less, at most) within tighten_within x its cost, the search
/// stops there: that mix, proven optimal at m' (tightened_high). Errors: those of a subproblem's
/// ILP other than infeasibility.
Expected<MemorySearchResult> memorySearch(const Problem& p, const SolverOptions& options,
                                          const Deadline& give_up, size_t max_subproblems,
                                          double tighten_within = 0);

}  // namespace apc::solver::detail
