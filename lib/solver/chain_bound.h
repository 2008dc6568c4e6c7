//===- lib/solver/chain_bound.h - A lower bound along chains of tied layers ===//
//
// The chain bound of the clustering check (solve_graph_problem.cpp, step 3a): a lower bound on
// every choice of the unclustered problem, in time that follows the distinct layers, found by
// exact reduction and a min-plus power instead of an LP. It is the optimum of a relaxation R:
//
// - The memory row is dropped (after step 1b's drops, which every feasible choice respects). With
//   the default budget 1b leaves every parameter one memory, so the row is a constant anyway.
// - A node outside a chain of tied layers that is adjacent to layer nodes (rope tables, masks, an
//   encoder's output) is split: one copy per layer instance it touches, with that instance's edges,
//   and the original with the rest; each copy and the original carry 1/(copies + 1) of its cost.
//   A choice of the problem gives the copies its choice and keeps its objective, so min R <= min.
//
// With the copies, a middle instance k of a chain touches nothing but its own copies, instance
// k - 1 through one value (the layer's output, `out`) and instance k + 1 through its own `out`.
// The middle instances are checked to be identical (tables, copies, links), and one of them, with
// out_{k-1} and out_k frozen, is reduced exactly (steps 1c and 2) to T(a, b): the least cost of the
// layer given out_{k-1} = a and out_k = b. When the layer does not reduce to that (its graph is
// not series-parallel between its ends), there is no bound. The m middle instances together are
// the min-plus power T^m, computed by repeated squaring over T's classes; R keeps the first and
// last instance of each chain and puts one edge of table T^m between out_0 and out_{L-2}. R is then
// reduced and, when something remains, solved by the ILP; its optimum (or the ILP's proven bound)
// is the bound. R's size is that of two layers, whatever the number of layers. Tied layers too
// few to fold (2 or 3) are kept whole; their shared nodes are split all the same, and R is then
// used only when it reduces to nothing (else its ILP would be the tied problem's, solved next).
// The reductions run to the end whatever the deadline: they make the first plan, as the first
// LP of a solve does.
//
// The plan: R's optimum expanded (instances 0 and L-1, everything outside the chains), out_1 ..
// out_{m-1} by a dynamic program along T from R's out_0 to R's out_{L-2}, and each middle
// instance by T's back-substitutions given its two ends; each split node takes its original's
// choice. Its objective on the problem is >= the bound; equal, it is optimal.
//
// Exact when the layers agree on the copied nodes (every layer of a plan that meets the bound
// wants the same rope-table placement), else smaller than the optimum: the check then goes on
// to the folded LP bound. Private to lib/solver.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "apc/solver/ilp.h"
#include "apc/solver/problem.h"

namespace apc::solver::detail {

struct ChainBound {
  std::optional<double> bound;
  std::string why;    // without a bound: why not
  size_t chains = 0;  // chains folded into a power
  // R after its reduction, as the ILP saw it (0 nodes: no ILP ran).
  size_t nodes_left = 0, edges_left = 0, strategies_left = 0;
  int64_t variables = 0, constraints = 0;
  // A plan of the problem built from R's optimum (empty without a bound) and its objective:
  // optimal when it meets the bound.
  std::vector<uint32_t> choice;
  double objective = kInfinity;
};

/// The chain bound of `full` (see the file comment). `rep`, `instance` and `cluster` come from
/// repeatedLayerRepresentatives; chains of fewer than four tied instances are not folded.
ChainBound chainBound(const Problem& full, const std::vector<uint32_t>& rep,
                      const std::vector<uint32_t>& instance, const std::vector<uint32_t>& cluster,
                      const SolverOptions& so);

}  // namespace apc::solver::detail
