//===- lib/planner/prefetch.cpp - The prefetch discount -----------------------===//
//
// Scales the priced communication of parameter-derived edges (spec "prefetch_discount", apc plan
// --prefetch-discount, ShardingOptimizer::apply_prefetch_discount): see applyPrefetchDiscount in
// apc/planner/pipeline.h.
//
//===----------------------------------------------------------------------===//
#include <cmath>

#include "apc/planner/pipeline.h"

namespace apc::plan {

namespace {

/// Marks the problem nodes whose value depends on parameters only: parameters, and ops that have
/// an in-edge for each tensor input, all from marked nodes. Problem nodes are in graph order, so
/// one pass suffices.
std::vector<bool> parameterDerived(const ir::Graph& g, const solver::GraphProblem& gp) {
  const solver::Problem& p = gp.problem;
  std::vector<std::vector<uint32_t>> in(p.nodes.size());
  for (uint32_t e = 0; e < p.edges.size(); ++e) in[p.edges[e].dst].push_back(e);
  std::vector<bool> derived(p.nodes.size(), false);
  for (size_t v = 0; v < p.nodes.size(); ++v) {
    if (!gp.graph_nodes[v].valid()) continue;  // output sinks
    const ir::Node& n = g.node(gp.graph_nodes[v]);
    if (n.kind == ir::NodeKind::kParameter) {
      derived[v] = true;
      continue;
    }
    if (n.kind != ir::NodeKind::kOp || in[v].empty()) continue;
    size_t tensor_inputs = 0;
    for (ir::ValueId id : n.inputs)
      if (g.value(id).isTensor()) ++tensor_inputs;
    if (in[v].size() != tensor_inputs) continue;
    bool all = true;
    for (uint32_t e : in[v]) all = all && derived[p.edges[e].src];
    derived[v] = all;
  }
  return derived;
}

}  // namespace

size_t applyPrefetchDiscount(const ir::Graph& g, solver::GraphProblem& gp, double scale) {
  std::vector<bool> derived = parameterDerived(g, gp);
  size_t touched = 0;
  for (solver::ProblemEdge& e : gp.problem.edges) {
    if (!derived[e.src]) continue;
    bool any = false;
    for (double& c : e.costs.mutableValues()) {
      if (!std::isfinite(c) || c <= 0) continue;
      c *= scale;
      any = true;
    }
    if (any) ++touched;
  }
  return touched;
}

}  // namespace apc::plan
