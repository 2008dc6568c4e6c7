//===- apc/report/diff.h - Differences between two plans ---------------------===//
//
// `apc diff a.json b.json`: the nodes whose chosen strategy (input or output placements) differs,
// each with its cost in both plans and the delta; nodes present in only one plan; parameters whose
// placement differs with their bytes per rank; the totals and parameter memory of both plans and
// the total delta. Nodes are matched by (kind, name), repeated names by occurrence. Differences in
// the model, mesh or device are listed as notes (the costs are then not comparable one to one).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "apc/plan/plan.h"

namespace apc::plan {

struct NodeChange {
  std::string name, kind, op, module_path;
  std::optional<uint32_t> index_a, index_b;  // absent when the node is only in the other plan
  std::string strategy_a, strategy_b;
  PlacementTuple output_a, output_b;
  double cost_a = 0, cost_b = 0;  // cost_us (0 where absent)
  double delta_us = 0;            // cost_b - cost_a
};

struct ParameterChange {
  std::string name;
  PlacementTuple placement_a, placement_b;
  int64_t bytes_per_rank_a = 0, bytes_per_rank_b = 0;
};

struct PlanDiff {
  std::vector<std::string> notes;  // model / mesh / device / spec differences
  std::vector<NodeChange> nodes;   // in plan a's node order, then nodes only in b
  /// Nodes with the same placements whose cost changed (their neighbours moved), by more than
  /// 1e-9 relative; with `nodes` they account for the whole total delta.
  std::vector<NodeChange> cost_changes;
  std::vector<ParameterChange> parameters;
  PlanTotals totals_a, totals_b;
  std::string budget_a, budget_b;   // budgetNote of each plan ("" within its budget)
  double total_delta_us = 0;        // totals_b.total_us - totals_a.total_us
  double changed_delta_us = 0;      // sum of the deltas of `nodes`
  double cost_change_delta_us = 0;  // sum of the deltas of `cost_changes`
  /// The predicted peak memory per rank of each plan under plan a's optimizer (apc/plan/memory.h);
  /// 0 for a plan without an estimate.
  std::string peak_optimizer;
  int64_t peak_bytes_a = 0, peak_bytes_b = 0;

  /// True when no node and no parameter differs.
  bool empty() const { return nodes.empty() && parameters.empty(); }
};

PlanDiff diffPlans(const Plan& a, const Plan& b);

/// The changed placements per module, in model order: a module is the path through its first
/// numbered component ("layers.3"), else its first component; consecutive repeated layers that
/// changed alike (same count and delta) are one entry whose `layers` counts them ("layers.1-31").
struct ModuleChanges {
  std::string module;   // "layers.3", "layers.1-31" for a run, "-" for the top level
  int layers = 1;       // repeated layers in the run
  int nodes = 0;        // changed nodes per layer
  double delta_us = 0;  // their cost delta per layer
};
std::vector<ModuleChanges> changesByModule(const PlanDiff& d);

std::string diffText(const PlanDiff& d);
/// Canonical numbers; the same shape as PlanDiff.
nlohmann::json toJson(const PlanDiff& d);

}  // namespace apc::plan
