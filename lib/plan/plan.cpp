//===- lib/plan/plan.cpp - Making a plan from a solved problem -------------===//
//
// makePlan reads the chosen strategy of every problem node, the chosen cost of every edge and the
// parameter bytes off a solved GraphProblem; contentHash fingerprints the inputs of a planning run.
// Every real number is made canonical here (canonicalNumber), so that a plan in memory equals the
// plan read back from its file.
//
//===----------------------------------------------------------------------===//
#include "apc/plan/plan.h"

#include "apc/plan/memory.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
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

bool SolverStats::operator==(const SolverStats& o) const {
  auto sizes_equal = [](const solver::ReductionStats& a, const solver::ReductionStats& b) {
    return a.nodes_before == b.nodes_before && a.edges_before == b.edges_before &&
           a.strategies_before == b.strategies_before && a.nodes_after == b.nodes_after &&
           a.edges_after == b.edges_after && a.strategies_after == b.strategies_after &&
           a.clusters == b.clusters && a.memory_subproblems == b.memory_subproblems &&
           a.memory_branches == b.memory_branches;
  };
  return status == o.status && objective == o.objective && bound == o.bound &&
         variables == o.variables && constraints == o.constraints && sizes_equal(sizes, o.sizes) &&
         time_limit_s == o.time_limit_s && threads == o.threads && reduce == o.reduce &&
         baseline == o.baseline;
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
                          const mesh::Spec& spec, bool reduce, std::string_view baseline) {
  // One canonical JSON document (sorted keys) of everything that determines the plan.
  nlohmann::json j = {{"apc_version", std::string(version)}, {"format_version", kPlanFormatVersion},
                      {"model_sha256", source.model_sha256}, {"inputs", source.inputs},
                      {"spec", mesh::toJson(spec)},          {"options", {{"reduce", reduce}}}};
  if (!baseline.empty()) j["options"]["baseline"] = std::string(baseline);
  return sha256Hex(j.dump());
}

}  // namespace

std::string contentHash(const PlanSource& source, const mesh::Spec& spec,
                        const solver::SolveGraphOptions& options, std::string_view baseline) {
  return contentHashAt(apcVersion(), source, spec, options.reduce, baseline);
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

namespace {

std::string trimmed(const std::string& s) {
  return std::string(trim(s));
}

std::string opNodeName(const ir::Graph& g, const ir::Node& n, const std::string& fallback) {
  for (ir::ValueId v : n.outputs)
    if (!g.value(v).debug_name.empty()) return g.value(v).debug_name;
  return fallback;
}

}  // namespace

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

Expected<Plan> makePlan(const ir::Graph& g, const solver::GraphProblem& gp,
                        const solver::Solution& solution, const mesh::Spec& spec,
                        const PlanSource& source, const SolveRecord& record) {
  const solver::Problem& p = gp.problem;
  if (solution.choice.size() != p.nodes.size())
    return internalError("the solution has " + std::to_string(solution.choice.size()) +
                         " choices for a problem of " + std::to_string(p.nodes.size()) + " nodes");
  if (gp.graph_nodes.size() != p.nodes.size() || gp.strategies.size() != p.nodes.size() ||
      gp.edge_input.size() != p.edges.size())
    return internalError("the graph problem's tables do not match its problem");

  Plan plan;
  plan.apc_version = apcVersion();
  plan.model = source;
  plan.spec = spec;
  // The graph's bytes (half of this function on a 126-layer LLaMA) on a second thread while the
  // node entries are made; a future from std::async joins on every return path.
  std::shared_future<std::string> graph_bytes =
      record.graph_bytes.valid()
          ? record.graph_bytes
          : std::async(std::launch::async, [&g] { return ir::serializeGraph(g); }).share();

  // A deep model's nodes repeat the same strategies and costs once per layer: their text and
  // canonical numbers (a printf and a strtod each) are made once.
  std::unordered_map<const strategy::Strategy*, std::string> strategy_texts;
  std::unordered_map<uint64_t, double> canonical;
  auto number = [&canonical](double x) {
    uint64_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    auto [it, fresh] = canonical.try_emplace(bits, 0.0);
    if (fresh) it->second = canonicalNumber(x);
    return it->second;
  };
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    const solver::ProblemNode& pn = p.nodes[i];
    uint32_t c = solution.choice[i];
    if (c >= pn.numStrategies() || c >= gp.strategies[i].size())
      return internalError("choice " + std::to_string(c) + " of node '" + pn.name +
                           "' is out of range");
    const strategy::Strategy& s = gp.strategies[i][c];
    PlanNode node;
    if (ir::NodeId gn = gp.graph_nodes[i]; gn.valid()) {
      const ir::Node& n = g.node(gn);
      node.kind = ir::nodeKindName(n.kind);
      node.name = n.kind == ir::NodeKind::kOp ? opNodeName(g, n, pn.name) : n.name;
      node.op = n.kind == ir::NodeKind::kOp ? n.qualifiedOp() : node.kind;
      node.module_path = n.module_path;
      node.graph_node = gn.v;
    } else {
      node.kind = node.op = pn.pin_group == "pins" ? "pin" : "output";
      node.name = pn.name;
    }
    node.strategy_index = c;
    node.num_strategies = static_cast<uint32_t>(pn.numStrategies());
    if (i < record.full_index.size() && !record.full_index[i].empty())
      node.strategy_index = record.full_index[i].at(c);
    if (i < record.full_sizes.size()) node.num_strategies = record.full_sizes[i];
    auto [text, fresh] = strategy_texts.try_emplace(&s);
    if (fresh) text->second = trimmed(s.toString());
    node.strategy = text->second;
    node.input_placements = s.inputs;
    node.outputs = s.outputs;
    node.compute_us = number(pn.costs[c]);
    if (pn.pinned) node.pin_group = pn.pin_group.empty() ? "pins" : pn.pin_group;
    plan.nodes.push_back(std::move(node));
  }

  for (size_t k = 0; k < p.edges.size(); ++k) {
    const solver::ProblemEdge& e = p.edges[k];
    size_t nt = p.nodes[e.dst].numStrategies();
    double c = e.cost(solution.choice[e.src], solution.choice[e.dst], nt);
    if (!std::isfinite(c))
      return internalError("the solution uses a forbidden pair on the edge into '" +
                           p.nodes[e.dst].name + "'");
    plan.nodes[e.dst].in_edges.push_back({e.src, gp.edge_input[k], number(c)});
  }

  double compute = 0, comm = 0;
  for (PlanNode& n : plan.nodes) {
    double in = 0;
    for (const PlanEdge& e : n.in_edges) in += e.cost_us;
    n.comm_us = number(in);
    n.cost_us = number(n.compute_us + n.comm_us);
    compute += n.compute_us;
    comm += n.comm_us;
  }

  int64_t per_rank = 0;
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    if (plan.nodes[i].kind != "parameter") continue;
    const ir::Node& n = g.node(gp.graph_nodes[i]);
    const ir::TensorMeta& t = *g.value(n.outputs.at(0)).tensor;
    PlanParameter prm;
    prm.name = n.name;
    size_t dot = n.name.rfind('.');
    prm.module = dot == std::string::npos ? "" : n.name.substr(0, dot);
    prm.shape = ir::hintSizes(t.shape);
    prm.dtype = ir::dtypeName(t.dtype);
    prm.placement = plan.nodes[i].outputPlacements();
    prm.bytes = t.bytes();
    const auto& mem = p.nodes[i].memory;
    prm.bytes_per_rank = mem.empty() ? prm.bytes : std::llround(mem[solution.choice[i]]);
    prm.node = static_cast<uint32_t>(i);
    per_rank += prm.bytes_per_rank;
    plan.parameters.push_back(std::move(prm));
  }

  PlanTotals& t = plan.totals;
  t.compute_us = canonicalNumber(compute);
  t.comm_us = canonicalNumber(comm);
  t.total_us = canonicalNumber(compute + comm);
  t.param_bytes_per_rank = per_rank;
  t.param_bytes_total = std::llround(gp.total_param_bytes);
  t.param_memory_fraction = t.param_bytes_total > 0
                                ? canonicalNumber(static_cast<double>(per_rank) /
                                                  static_cast<double>(t.param_bytes_total))
                                : 0.0;
  // The high the solver used (the default raised to the least reachable footprint, if so).
  double high = gp.problem.memory && gp.total_param_bytes > 0
                    ? gp.problem.memory->high / gp.total_param_bytes
                : spec.device_memory ? 1.0  // no parameter bound: the device memory's plan
                                     : spec.memory_budget.highOr(spec.mesh.worldSize());
  t.memory_low = canonicalNumber(spec.memory_budget.low);
  t.memory_high = canonicalNumber(high);

  SolverStats& st = plan.solver;
  // A baseline's plan says which (its solve only re-chose what the pins left free).
  st.status =
      record.baseline.empty() ? solver::statusName(solution.status) : "baseline " + record.baseline;
  st.objective = canonicalNumber(solution.objective);
  if (std::isfinite(solution.bound)) st.bound = canonicalNumber(solution.bound);
  st.variables = solution.variables;
  st.constraints = solution.constraints;
  st.sizes = record.sizes;
  st.time_limit_s = canonicalNumber(record.options.solver.time_limit_s);
  st.threads = record.options.solver.threads;
  st.reduce = record.options.reduce;
  st.baseline = record.baseline;
  plan.content_hash = planContentHash(plan);  // the options and choices are set now
  plan.graph_bytes = graph_bytes.get();
  APC_ASSIGN_OR_RETURN(plan.memory, predictMemoryAll(g, plan));
  return plan;
}

}  // namespace apc::plan
