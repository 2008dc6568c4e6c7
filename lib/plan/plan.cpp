//===- lib/plan/plan.cpp - The plan type: equality, content hash, numbers --===//
//
// contentHash fingerprints the inputs of a planning run and planContentHash a plan. Every real
// number of a plan is made canonical (canonicalNumber, here), so that a plan in memory equals the
// plan read back from its file. makePlan (lib/planner/make_plan.cpp) makes plans.
//
//===----------------------------------------------------------------------===//
#include "apc/plan/plan.h"

#include "apc/plan/memory.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "apc/ir/proto_io.h"
#include "apc/support/hash.h"
#include "apc/support/strings.h"

#ifndef APC_VERSION
#error "APC_VERSION must be defined by the build (lib/plan/CMakeLists.txt)"
#endif

namespace apc::plan {

// Memberwise equality, defaulted here rather than in the header so that the header stays
// C++17 (installed headers, apcConfig.cmake).
bool PlanSource::operator==(const PlanSource&) const = default;
bool PlanEdge::operator==(const PlanEdge&) const = default;
bool PlanNode::operator==(const PlanNode&) const = default;
bool PlanParameter::operator==(const PlanParameter&) const = default;
bool PlanTotals::operator==(const PlanTotals&) const = default;
bool Plan::operator==(const Plan&) const = default;

const MemoryEstimate* Plan::memoryFor(std::string_view optimizer) const {
  for (const MemoryEstimate& e : memory)
    if (e.optimizer == optimizer) return &e;
  return nullptr;
}

const char* apcVersion() {
  return APC_VERSION;
}

PlacementTuple PlanNode::outputPlacements() const {
  for (const auto& o : outputs)
    if (o) return *o;
  return {};
}

bool ProblemSizes::operator==(const ProblemSizes&) const = default;

bool SolverStats::operator==(const SolverStats& o) const {
  return status == o.status && objective == o.objective && bound == o.bound &&
         variables == o.variables && constraints == o.constraints && sizes == o.sizes &&
         time_limit_s == o.time_limit_s && threads == o.threads && reduce == o.reduce &&
         baseline == o.baseline;
}

std::string SolverStats::statusText() const {
  switch (status) {
    case PlanStatus::kOptimal:
      return "optimal";
    case PlanStatus::kTimeLimit:
      return "time_limit";
    case PlanStatus::kFeasible:
      return "feasible";
    case PlanStatus::kBaseline:
      return "baseline " + baseline;
  }
  return "feasible";
}

Expected<std::pair<PlanStatus, std::string>> parsePlanStatus(const std::string& text) {
  if (text == "optimal") return std::pair{PlanStatus::kOptimal, std::string()};
  if (text == "time_limit") return std::pair{PlanStatus::kTimeLimit, std::string()};
  if (text == "feasible") return std::pair{PlanStatus::kFeasible, std::string()};
  if (text.rfind("baseline ", 0) == 0 && text.size() > 9)
    return std::pair{PlanStatus::kBaseline, text.substr(9)};
  return invalidArgument("expected optimal, time_limit, feasible or 'baseline <name>', got '" +
                         text + "'");
}

std::string formatMicros(double us) {
  char buf[64];
  if (us >= 1e6)
    std::snprintf(buf, sizeof buf, "%.3f s", us / 1e6);
  else if (us >= 1e3)
    std::snprintf(buf, sizeof buf, "%.3f ms", us / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.3f us", us);
  return buf;
}

double canonicalNumber(double x) {
  if (!std::isfinite(x)) return x;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.12g", x);
  double y = std::strtod(buf, nullptr);
  return y == 0 ? 0.0 : y;  // no negative zero
}

std::vector<std::string> inputShapes(const ir::Graph& g) {
  std::vector<std::string> out;
  for (ir::NodeId id : g.nodesOfKind(ir::NodeKind::kInput)) {
    const ir::Node& n = g.node(id);
    if (n.outputs.empty()) continue;
    const ir::Value& v = g.value(n.outputs[0]);
    if (!v.tensor) continue;
    out.push_back(n.name + ":" + ir::dtypeName(v.tensor->dtype) + ir::toString(v.tensor->shape));
  }
  return out;
}

namespace {

std::string contentHashAt(std::string_view version, const PlanSource& source,
                          const spec::Spec& spec, bool reduce, std::string_view baseline) {
  // One canonical JSON document (sorted keys) of everything that determines the plan.
  nlohmann::json j = {{"apc_version", std::string(version)}, {"format_version", kPlanFormatVersion},
                      {"model_sha256", source.model_sha256}, {"inputs", source.inputs},
                      {"spec", spec::toJson(spec)},          {"options", {{"reduce", reduce}}}};
  if (!baseline.empty()) j["options"]["baseline"] = std::string(baseline);
  return sha256Hex(j.dump());
}

}  // namespace

std::string contentHash(const PlanSource& source, const spec::Spec& spec, bool reduce,
                        std::string_view baseline) {
  return contentHashAt(apcVersion(), source, spec, reduce, baseline);
}

std::string planContentHash(const Plan& p) {
  // The solver's time limit and threads change the plan only through the strategies it chose, so
  // the hash covers those choices instead of the settings: equal placements, equal hash.
  std::string choices =
      contentHashAt(p.apc_version, p.model, p.spec, p.solver.reduce, p.solver.baseline);
  for (const PlanNode& n : p.nodes) choices += "\n" + std::to_string(n.strategy_index);
  // Checkpointed modules (none in most plans, whose hashes this leaves as they were).
  for (const std::string& m : p.checkpoint) choices += "\ncheckpoint " + m;
  return sha256Hex(choices);
}

Expected<ir::Graph> plannedGraph(const Plan& p) {
  if (p.graph_bytes.empty())
    return notFound(
        "the plan carries no graph (written by an apc before 0.2.0); the model file "
        "is needed");
  auto g = ir::deserializeGraph(p.graph_bytes);
  if (!g.ok()) return g.error().withContext("the plan's graph");
  std::vector<std::string> inputs = inputShapes(*g);
  if (inputs != p.model.inputs)
    return invalidArgument("the plan's graph has inputs " + join(inputs, ", ") +
                           " but the plan was made for " + join(p.model.inputs, ", "));
  return g;
}

}  // namespace apc::plan
