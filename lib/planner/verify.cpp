//===- lib/planner/verify.cpp - A plan checked against its graph --------------===//
//
// verifyPlan (apc/planner/verify.h): the strategies of every graph node enumerated again, as
// buildProblem enumerates them but without pricing a single edge, and each plan node's
// placements compared with those of its chosen strategy.
//
//===----------------------------------------------------------------------===//
#include "apc/planner/verify.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "apc/planner/pipeline.h"
#include "apc/solver/graph_problem.h"
#include "apc/strategy/strategy.h"
#include "apc/support/strings.h"

namespace apc::plan {

namespace {

/// "RS(1),RS(0),-": one compact tuple per entry, "-" for a non-tensor one (as Strategy prints).
std::string placementsText(const std::vector<std::optional<PlacementTuple>>& ts) {
  std::string s;
  for (size_t i = 0; i < ts.size(); ++i) {
    if (i) s += ",";
    s += ts[i] ? mesh::toCompactString(*ts[i]) : "-";
  }
  return s.empty() ? "nothing" : s;
}

}  // namespace

Status verifyPlan(const ir::Graph& g, const Plan& p) {
  APC_ASSIGN_OR_RETURN(std::vector<strategy::NodeStrategies> enumerated,
                       enumerateForSpec(g, p.spec));
  std::map<uint32_t, const strategy::StrategyList*> op_lists;
  for (const strategy::NodeStrategies& ns : enumerated)
    if (!ns.strategies.empty()) op_lists[ns.node.v] = &ns.strategies;

  std::vector<int> planned(g.numNodes(), -1);  // graph node -> its plan node
  std::map<std::vector<int64_t>, strategy::StrategyList> leaf_lists;
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    const PlanNode& n = p.nodes[i];
    const std::string where = "$.nodes[" + std::to_string(i) + "] '" + n.name + "' (" + n.op + ")";
    if (!n.graph_node) {
      if (n.kind != "output" && n.kind != "pin")
        return invalidArgument(where + ": a " + n.kind + " node without a graph node");
      continue;  // a sink: its strategy places nothing that lowering reads
    }
    if (*n.graph_node >= g.numNodes())
      return invalidArgument(where + ": names graph node " + std::to_string(*n.graph_node) +
                             ", the graph has " + std::to_string(g.numNodes()));
    const ir::Node& gn = g.node(ir::NodeId(*n.graph_node));
    const std::string gop = gn.kind == ir::NodeKind::kOp ? gn.qualifiedOp() : "";
    if (n.kind != ir::nodeKindName(gn.kind) || (gn.kind == ir::NodeKind::kOp && n.op != gop))
      return invalidArgument(where + ": graph node " + std::to_string(gn.id.v) + " is " +
                             ir::nodeKindName(gn.kind) + (gop.empty() ? "" : " " + gop));
    if (planned[gn.id.v] >= 0)
      return invalidArgument(where + ": graph node " + std::to_string(gn.id.v) +
                             " is planned twice (also by node " + std::to_string(planned[gn.id.v]) +
                             ")");
    planned[gn.id.v] = static_cast<int>(i);
    const strategy::StrategyList* list = nullptr;
    if (gn.kind == ir::NodeKind::kOp) {
      auto it = op_lists.find(gn.id.v);
      if (it == op_lists.end())
        return invalidArgument(where + ": the op has no strategies on mesh " +
                               p.spec.mesh.toString());
      list = it->second;
    } else {
      const ir::Value& v = g.value(gn.outputs.at(0));
      if (!v.tensor) return invalidArgument(where + ": not a tensor leaf");
      std::vector<int64_t> sizes;
      for (const ir::Dim& d : v.tensor->shape) sizes.push_back(d.size);
      auto [at, fresh] = leaf_lists.try_emplace(std::move(sizes));
      if (fresh) {
        std::vector<strategy::Strategy> leaves;
        for (const PlacementTuple& t : solver::leafPlacements(*v.tensor, p.spec.mesh)) {
          strategy::Strategy s;
          s.outputs = {t};
          leaves.push_back(std::move(s));
        }
        at->second = std::move(leaves);
      }
      list = &at->second;
    }
    if (list->size() != n.num_strategies || n.strategy_index >= list->size())
      return invalidArgument(where + ": strategy " + std::to_string(n.strategy_index) + " of " +
                             std::to_string(n.num_strategies) + ", but the node has " +
                             std::to_string(list->size()) + " strategies on mesh " +
                             p.spec.mesh.toString());
    const strategy::Strategy& s = (*list)[n.strategy_index];
    const std::string chosen = "its strategy " + std::to_string(n.strategy_index) + " (" +
                               std::string(trim(s.toString())) + ")";
    if (s.outputs != n.outputs)
      return invalidArgument(where + ": outputs placed " + placementsText(n.outputs) + " but " +
                             chosen + " places them " + placementsText(s.outputs));
    if (s.inputs != n.input_placements)
      return invalidArgument(where + ": inputs placed " + placementsText(n.input_placements) +
                             " but " + chosen + " places them " + placementsText(s.inputs));
    if (gn.kind == ir::NodeKind::kOp && std::string(trim(s.toString())) != n.strategy)
      return invalidArgument(where + ": strategy text '" + n.strategy + "' is not " + chosen);
  }
  // Every node the problem places has its plan node (lowering would replicate a missing one).
  for (const ir::Node& gn : g.nodes()) {
    if (planned[gn.id.v] >= 0) continue;
    bool placed = gn.kind == ir::NodeKind::kOp
                      ? op_lists.count(gn.id.v) > 0
                      : !gn.outputs.empty() && g.value(gn.outputs[0]).tensor.has_value();
    if (placed)
      return invalidArgument("the plan has no node for graph node " + std::to_string(gn.id.v) +
                             " (" + (gn.kind == ir::NodeKind::kOp ? gn.qualifiedOp() : gn.name) +
                             ")");
  }
  // Checkpointed modules: each one recomputable in this graph, disjoint, in node order.
  std::optional<ir::NodeRange> previous;
  for (size_t i = 0; i < p.checkpoint.size(); ++i) {
    const std::string where = "$.checkpoint[" + std::to_string(i) + "] '" + p.checkpoint[i] + "'";
    const std::optional<ir::NodeRange> r = ir::checkpointRange(g, p.checkpoint[i]);
    if (!r)
      return invalidArgument(where +
                             ": not a module this graph can recompute (no op of it, its "
                             "nodes not contiguous, an in-place update of outside state, or a "
                             "non-tensor value passed on)");
    if (previous && r->first <= previous->last)
      return invalidArgument(where + ": overlaps or precedes the module before it");
    previous = r;
  }
  return Status::success();
}

}  // namespace apc::plan
