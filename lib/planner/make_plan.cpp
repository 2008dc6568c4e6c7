//===- lib/planner/make_plan.cpp - Making a plan from a solved problem -----===//
//
// makePlan reads the chosen strategy of every problem node, the chosen cost of every edge and the
// parameter bytes off a solved GraphProblem. Every real number is made canonical here
// (canonicalNumber), so that a plan in memory equals the plan read back from its file.
//
//===----------------------------------------------------------------------===//
#include <cmath>
#include <cstring>
#include <future>
#include <unordered_map>

#include "apc/ir/proto_io.h"
#include "apc/lower/lower.h"
#include "apc/plan/memory.h"
#include "apc/planner/pipeline.h"
#include "apc/support/strings.h"

namespace apc::plan {

std::string contentHash(const PlanSource& source, const spec::Spec& spec,
                        const solver::SolveGraphOptions& options, std::string_view baseline) {
  return contentHash(source, spec, options.reduce, baseline);
}

namespace {

std::string trimmedText(const std::string& s) {
  return std::string(trim(s));
}

std::string planOpNodeName(const ir::Graph& g, const ir::Node& n, const std::string& fallback) {
  for (ir::ValueId v : n.outputs)
    if (!g.value(v).debug_name.empty()) return g.value(v).debug_name;
  return fallback;
}

/// The sizes a plan records of the solver's ReductionStats.
ProblemSizes problemSizes(const solver::ReductionStats& z) {
  ProblemSizes s;
  s.nodes_before = z.nodes_before;
  s.edges_before = z.edges_before;
  s.strategies_before = z.strategies_before;
  s.nodes_after = z.nodes_after;
  s.edges_after = z.edges_after;
  s.strategies_after = z.strategies_after;
  s.clusters = z.clusters;
  s.memory_subproblems = z.memory_subproblems;
  s.memory_branches = z.memory_branches;
  return s;
}

}  // namespace

Expected<Plan> makePlan(const ir::Graph& g, const solver::GraphProblem& gp,
                        const solver::Solution& solution, const spec::Spec& spec,
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
      node.name = n.kind == ir::NodeKind::kOp ? planOpNodeName(g, n, pn.name) : n.name;
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
    if (fresh) text->second = trimmedText(s.toString());
    node.strategy = text->second;
    node.input_placements = s.inputs;
    node.outputs = s.outputs;
    node.compute_us = number(pn.costs[c]);
    if (pn.pinned) node.pin_group = pn.pin_group.empty() ? "pins" : pn.pin_group;
    plan.nodes.push_back(std::move(node));
  }

  // A redistribution several readers share is paid on the first one's edge (SharedReads).
  const std::vector<bool> paid = solver::paidByAnEarlierReader(gp, solution.choice);
  for (size_t k = 0; k < p.edges.size(); ++k) {
    const solver::ProblemEdge& e = p.edges[k];
    size_t nt = p.nodes[e.dst].numStrategies();
    double c = e.cost(solution.choice[e.src], solution.choice[e.dst], nt);
    if (paid[k] && std::isfinite(c)) c = 0;
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
  st.status = !record.baseline.empty()                             ? PlanStatus::kBaseline
              : solution.status == solver::SolveStatus::kOptimal   ? PlanStatus::kOptimal
              : solution.status == solver::SolveStatus::kTimeLimit ? PlanStatus::kTimeLimit
                                                                   : PlanStatus::kFeasible;
  st.objective = canonicalNumber(solution.objective);
  if (std::isfinite(solution.bound)) st.bound = canonicalNumber(solution.bound);
  st.variables = solution.variables;
  st.constraints = solution.constraints;
  st.sizes = problemSizes(record.sizes);
  st.time_limit_s = canonicalNumber(record.options.solver.time_limit_s);
  st.threads = record.options.solver.threads;
  st.reduce = record.options.reduce;
  st.baseline = record.baseline;
  plan.content_hash = planContentHash(plan);  // the options and choices are set now
  // The graph's bytes: the caller's (apc plan serializes them on a thread of its own while it
  // plans: PlanRequest::graph_bytes), else made here.
  plan.graph_bytes = record.graph_bytes.valid() ? record.graph_bytes.get() : ir::serializeGraph(g);
  APC_ASSIGN_OR_RETURN(plan.memory, lower::predictRuntimeMemory(g, plan));
  return plan;
}

}  // namespace apc::plan
