//===- lib/solver/lp_bound.h - LP bounds over linked marginals -------------===//
//
// The LP relaxation of ilp.h's program, extended by "linked" edges: an edge whose marginal on a
// side is not one node's distribution but a share of a pooled constraint. Used by the folded bound
// of the clustering check (solve_graph_problem.cpp, step 3a): there a node stands for several
// identical nodes of the unclustered problem (its distribution is their average) and an edge stands
// for several identical edges (its variable is their summed pair counts), so a marginal constraint
// reads
//   sum over the group's edges of sum_b M[a, b]  (= or <=)  coef * sum_{s in class a} x[node, s].
// Every edge of a group uses the same class map on the group's side. Private to lib/solver.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <optional>
#include <vector>

#include "apc/solver/problem.h"
#include "edge_table.h"

namespace apc::solver::detail {

struct LinkedGroup {
  uint32_t node = 0;
  double coef = 1;
  bool equality = true;  // otherwise <=
};

struct LinkedEdge {
  uint32_t src = 0, dst = 0;  // nodes of the problem
  Table table;                // rows over src's strategies, columns over dst's
  uint32_t src_group = 0, dst_group = 0;
};

/// The optimum of the LP relaxation of `p` (rows (a)-(c), (e)) with the linked edges and their
/// group rows added, solved within `seconds` (> 0); nullopt when not solved to optimality in time,
/// infeasible, or when the linked edges of a group disagree on its class map. `columns` receives
/// the number of columns; `x`, when solved, the node columns of the optimum (x[v, s], node by node,
/// each node's strategies in order).
std::optional<double> linkedLpBound(const Problem& p, const std::vector<LinkedGroup>& groups,
                                    const std::vector<LinkedEdge>& linked, double seconds,
                                    size_t* columns = nullptr, std::vector<double>* x = nullptr);

}  // namespace apc::solver::detail
