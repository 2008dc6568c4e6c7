//===- apc/solver/ilp.h - The integer program, solved with COIN-OR CBC -----===//
//
// Variables
//   x[v,s] in {0,1}     node v uses strategy s
//   e[uv,s,t] in [0,1]  edge u->v uses the pair (s,t); created only for pairs of finite cost
// Objective
//   min sum_v sum_s c[v,s] x[v,s] + sum_uv sum_(s,t) r[uv,s,t] e[uv,s,t]
// Constraints
//   (a) one strategy per node:      sum_s x[v,s] = 1
//   (b) edge marginal, source side: sum_t e[uv,s,t] = x[u,s]      for every s of u
//   (c) edge marginal, dest side:   sum_s e[uv,s,t] = x[v,t]      for every t of v
//   (d) pins:                       x[v,p] = 1 for a pinned strategy p (bounds, not rows)
//   (e) memory:                     low <= sum_v sum_s m[v,s] x[v,s] <= high
// With (b) and (c) the LP relaxation is the local marginal polytope, usually integral on our sparse
// graphs, so CBC tends to finish at the root. e needs no integrality: integral x forces it.
// Forbidden pairs (infinite r) get no e variable, so (b)/(c) exclude them.
// Strategies of u with identical rows of r (and of v with identical columns) are grouped into
// classes and e is indexed by class pairs, (b)/(c) summing x over a class: the same integral
// solutions with far fewer variables (see ilp.cpp).
//
// The problem is built in memory and solved in-process (no files). The LP relaxation is solved
// first with Clp's dual simplex and, when integral in x, is the answer; CBC runs only otherwise.
// Performance comes mostly from what reaches this program: solveGraphProblem's exact reduction
// (lib/solver/solve_graph_problem.cpp) fixes the strategies the memory row (e) rules out, and a
// tight budget (the default 1/world size) leaves every parameter with a constant memory, so the row
// drops out and the parameters are eliminated before the ILP (llama3_8b 8x8: 18 nodes, an integral
// LP).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <chrono>
#include <optional>

#include "apc/solver/problem.h"
#include "apc/support/deadline.h"

namespace apc::solver {

struct SolverOptions {
  // Wall-clock limit of one solve (LP relaxation and CBC together), from its start. Hit, the solve
  // returns the best choice found with status "time_limit" and its proven bound; without any
  // choice yet, the LP of the first solve runs on (a plan always comes back).
  double time_limit_s = 60;
  // An absolute deadline that also bounds the solve when earlier (the tool sets it from the end of
  // import, so that the limit covers enumeration and construction too). Not part of a plan's
  // recorded options: it does not change which plan is optimal, only whether one is proven.
  Deadline deadline;
  // Before the first plan: the reductions that make it (solveGraphProblem's, the chain
  // relaxation's) stop here, and solveGraphProblem returns ErrorCode::kDeadline, so that its
  // caller can still plan within `deadline` on a restricted problem (lib/planner/pipeline.cpp,
  // "restricted plan"). None: they run to the end, as a first plan needs.
  Deadline first_plan_deadline;
  int threads = 1;
  int log_level = 0;  // 0 silent, 1 CBC summary, 2+ more
};

/// Seconds left before the earlier of `o.deadline` and `start` + o.time_limit_s (>= 0).
double secondsLeft(const SolverOptions& o, std::chrono::steady_clock::time_point start);

/// Solves the problem. Errors: kInvalidArgument for malformed problems, kInfeasible when no choice
/// satisfies the constraints (the message names the pin groups or the memory bound that make it
/// infeasible, and for the memory bound the smallest feasible high), kInternal when CBC fails.
Expected<Solution> solve(const Problem& p, const SolverOptions& options = {});

/// A lower bound on every choice that needs no LP: each edge's cost charged to its ends (all to the
/// source, all to the destination, or half each), each node's cheapest allowed strategy with the
/// cheapest entries of its charged rows; the best of the three (the memory row relaxed away).
double trivialBound(const Problem& p);

/// The number of columns (x and e variables) the program of `p` has, without building it.
size_t programColumns(const Problem& p);

/// How solve() with a start finished (see below).
enum class StartOutcome {
  kStartProven,    // the start's objective met the LP bound: the start is returned, optimal
  kLpIntegral,     // the LP optimum was integral and cheaper than the start: it is returned
  kBranchAndBound  // CBC ran with the start's objective as cutoff; the better of the two returned
};

/// Solves the problem given a feasible choice `start` (an incumbent, e.g. the expanded plan of a
/// restricted problem). The LP relaxation is solved first; its optimum is a lower bound on every
/// choice, so a start whose objective is within 1e-9 (relative) of it is proven optimal and
/// returned as is, without CBC. Otherwise an integral LP optimum is returned, or CBC runs with the
/// start's objective as cutoff (it only looks for cheaper choices) and the start is kept when CBC
/// finds none: the result is never worse than the start. `outcome` receives which of these
/// happened. Errors as solve(); kInvalidArgument also when `start` is infeasible for `p`.
Expected<Solution> solve(const Problem& p, const SolverOptions& options,
                         const std::vector<uint32_t>& start, StartOutcome* outcome = nullptr);

}  // namespace apc::solver
