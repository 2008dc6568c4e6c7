//===- lib/plan/pipeline.cpp - From an imported graph to a plan ------------===//
//
// The stages after import (see apc/plan/pipeline.h): the device and budget the spec means,
// strategy enumeration and problem construction with their wall times, the solve and makePlan,
// and the check that a rebuilt problem is the one a plan was solved on.
//
//===----------------------------------------------------------------------===//
#include "apc/plan/pipeline.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "apc/support/clock.h"
#include "apc/support/strings.h"

namespace apc::plan {

namespace {

using Clock = std::chrono::steady_clock;

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

}  // namespace

Expected<cost::DeviceSpec> deviceFor(const mesh::Spec& spec) {
  APC_ASSIGN_OR_RETURN(cost::DeviceSpec d, cost::deviceByName(spec.device));
  for (const auto& [dtype, tflops] : spec.device_overrides.peak_tflops)
    APC_RETURN_IF_ERROR(cost::setPeakTflops(d, ir::dtypeName(dtype), tflops));
  if (spec.device_overrides.hbm_bandwidth_gbps) {
    cost::DeviceOverrides o;
    o.hbm_gbps = *spec.device_overrides.hbm_bandwidth_gbps;
    APC_ASSIGN_OR_RETURN(d, cost::applyOverrides(d, o));
  }
  return d;
}

Expected<std::pair<double, double>> effectiveBudget(const mesh::Spec& spec) {
  double low = spec.memory_budget.low;
  double high = spec.memory_budget.highOr(spec.mesh.worldSize());
  if (low > high)
    return invalidArgument(
        "memory budget low " + fmt(low) + " exceeds high " + fmt(high) +
        (spec.memory_budget.high ? std::string() : " (the default high, 1/world size)"));
  return std::pair{low, high};
}

Expected<mesh::MemoryBudget> parseMemoryBudget(std::string_view text) {
  std::vector<std::string> parts = split(text, ',');
  if (parts.size() != 2)
    return invalidArgument(
        "--memory-budget: expected LOW,HIGH (fractions of the parameter bytes, "
        "like 0,0.25), got '" +
        std::string(text) + "'");
  mesh::MemoryBudget b;
  auto low = parseDouble(trim(parts[0]));
  if (!low || !std::isfinite(*low))
    return invalidArgument("--memory-budget: LOW '" + parts[0] + "' is not a number");
  if (*low < 0) return invalidArgument("--memory-budget: LOW must be >= 0, got " + fmt(*low));
  b.low = *low;
  if (!trim(parts[1]).empty()) {
    auto high = parseDouble(trim(parts[1]));
    if (!high || !std::isfinite(*high))
      return invalidArgument("--memory-budget: HIGH '" + parts[1] + "' is not a number");
    if (*high <= 0 || *high > 1)
      return invalidArgument("--memory-budget: HIGH must be in (0, 1], got " + fmt(*high));
    if (*low > *high)
      return invalidArgument("--memory-budget: low " + fmt(*low) + " is greater than high " +
                             fmt(*high));
    b.high = *high;
  }
  return b;
}

Expected<BuiltProblem> buildProblem(const ir::Graph& g, const mesh::Spec& spec,
                                    PhaseTimings* timings) {
  if (spec.mesh.ndim() > kMaxPlanMeshDims)
    return invalidArgument(
        "mesh " + spec.mesh.toString() + " has " + std::to_string(spec.mesh.ndim()) +
        " dims; apc plans meshes of at most " + std::to_string(kMaxPlanMeshDims) +
        " dims (a tensor's placements grow as (rank + 2)^dims: merge mesh dims, like 2x2x4x8 for "
        "2x2x2x2x2x4)");
  APC_RETURN_IF_ERROR(mesh::validateSpecAgainstGraph(spec, g));
  APC_RETURN_IF_ERROR(effectiveBudget(spec));
  // A spec read from JSON has these checked with their paths; a spec made in C++ (the API) or
  // changed by a flag (apc plan --device) meets them here.
  if (!mesh::isKnownDeviceKind(spec.device))
    return invalidArgument("unknown device '" + spec.device +
                           "' (known: " + join(mesh::knownDeviceKinds(), ", ") + ")");
  const mesh::MixedPrecision& mp = spec.mixed_precision;
  for (const auto& [field, dtype] :
       {std::pair{"param_dtype", mp.param_dtype}, std::pair{"reduce_dtype", mp.reduce_dtype},
        std::pair{"output_dtype", mp.output_dtype}})
    if (dtype && !ir::isFloating(*dtype))
      return invalidArgument(std::string("mixed precision ") + field + " must be floating, got " +
                             ir::dtypeName(*dtype));
  if (!(spec.prefetch_discount >= 0 && spec.prefetch_discount <= 1))
    return invalidArgument("the prefetch discount must be in [0, 1], got " +
                           fmt(spec.prefetch_discount));
  APC_ASSIGN_OR_RETURN(cost::DeviceSpec device, deviceFor(spec));
  BuiltProblem out;
  strategy::EnumerateOptions options;
  options.device = device;
  auto t0 = Clock::now();
  std::vector<strategy::NodeStrategies> strategies;  // their lists are shared with gp.strategies
  if (spec.mixed_precision.param_dtype) {
    // Compute costs in param_dtype (solver::computeGraph); the problem is built on the stored
    // graph.
    ir::Graph compute = solver::computeGraph(g, spec.mixed_precision);
    strategies = strategy::enumerate(compute, spec.mesh, strategy::defaultRegistry(), options);
  } else {
    strategies = strategy::enumerate(g, spec.mesh, strategy::defaultRegistry(), options);
  }
  out.fallback_ops = strategy::fallbackOps(g, strategies);
  if (timings) timings->enumerate_s = secondsSince(t0);
  t0 = Clock::now();
  APC_ASSIGN_OR_RETURN(out.gp, solver::buildGraphProblem(g, strategies, spec));
  if (spec.prefetch_discount != 1.0)
    out.discounted_edges = applyPrefetchDiscount(g, out.gp, spec.prefetch_discount);
  if (timings) timings->build_s = secondsSince(t0);
  return out;
}

Expected<PlanResult> solveAndPlan(const ir::Graph& g, const BuiltProblem& built,
                                  const mesh::Spec& spec, const PlanSource& source,
                                  const solver::SolveGraphOptions& options, PhaseTimings* timings) {
  PlanResult r;
  auto t0 = Clock::now();
  auto solution = solver::solveGraphProblem(built.gp, options, &r.sizes);
  if (!solution.ok()) return solution.error();
  r.solution = std::move(solution).value();
  if (timings) {
    timings->solve_s = secondsSince(t0);
    timings->solver_s = r.solution.seconds;
  }
  APC_ASSIGN_OR_RETURN(r.plan,
                       makePlan(g, built.gp, r.solution, spec, source, {options, r.sizes, {}}));
  return r;
}

mesh::Spec baselineSpec(const ir::Graph& g, mesh::Spec spec, solver::Baseline b) {
  for (ir::NodeId id : g.nodesOfKind(ir::NodeKind::kInput)) {
    const ir::Node& n = g.node(id);
    if (n.outputs.empty() || spec.inputs.count(n.name)) continue;
    const ir::Value& v = g.value(n.outputs[0]);
    if (v.tensor) spec.inputs[n.name] = solver::dataParallelInput(*v.tensor, spec.mesh, b);
  }
  return spec;
}

Expected<PlanResult> solveBaselineAndPlan(const ir::Graph& g, const BuiltProblem& built,
                                          const mesh::Spec& spec, const PlanSource& source,
                                          solver::Baseline baseline,
                                          const solver::SolveGraphOptions& options,
                                          PhaseTimings* timings) {
  PlanResult r;
  auto t0 = Clock::now();
  APC_ASSIGN_OR_RETURN(solver::GraphProblem pinned,
                       solver::applyBaseline(built.gp, g, baseline, spec.mesh));
  APC_ASSIGN_OR_RETURN(r.solution, solver::solveGraphProblem(pinned, options, &r.sizes));
  r.solution.status = std::string("baseline ") + solver::baselineName(baseline);
  if (timings) {
    timings->solve_s = secondsSince(t0);
    timings->solver_s = r.solution.seconds;
  }
  APC_ASSIGN_OR_RETURN(r.plan, makePlan(g, pinned, r.solution, spec, source,
                                        {options, r.sizes, solver::baselineName(baseline)}));
  return r;
}

Expected<PlanRun> buildPlanProblem(const ir::Graph& g, mesh::Spec spec, const PlanRequest& request,
                                   PhaseTimings* timings) {
  if (request.baseline) {
    const solver::Baseline b = *request.baseline;
    if (!solver::baselineApplies(b, spec.mesh.ndim()))
      return invalidArgument(std::string("the classic plan ") + solver::baselineName(b) +
                             " needs a mesh of 2 or more dims (data x tensor parallel), got " +
                             spec.mesh.toString());
    spec.memory_budget = {};
    spec = baselineSpec(g, std::move(spec), b);
  }
  PlanRun run;
  APC_ASSIGN_OR_RETURN(run.built, buildProblem(g, spec, timings));
  run.spec = std::move(spec);
  return run;
}

Status solvePlanProblem(const ir::Graph& g, const PlanSource& source, const PlanRequest& request,
                        PlanRun& run, PhaseTimings* timings) {
  APC_ASSIGN_OR_RETURN(
      run.result, request.baseline
                      ? solveBaselineAndPlan(g, run.built, run.spec, source, *request.baseline,
                                             request.options, timings)
                      : solveAndPlan(g, run.built, run.spec, source, request.options, timings));
  return Status::success();
}

Expected<PlanRun> planGraph(const ir::Graph& g, mesh::Spec spec, const PlanSource& source,
                            const PlanRequest& request, PhaseTimings* timings) {
  APC_ASSIGN_OR_RETURN(PlanRun run, buildPlanProblem(g, std::move(spec), request, timings));
  APC_RETURN_IF_ERROR(solvePlanProblem(g, source, request, run, timings));
  return run;
}

Expected<BuiltProblem> rebuildProblem(const ir::Graph& g, const Plan& plan) {
  APC_ASSIGN_OR_RETURN(BuiltProblem built, buildProblem(g, plan.spec));
  if (!plan.solver.baseline.empty()) {
    APC_ASSIGN_OR_RETURN(solver::Baseline b, solver::parseBaseline(plan.solver.baseline));
    APC_ASSIGN_OR_RETURN(built.gp,
                         solver::applyBaseline(std::move(built.gp), g, b, plan.spec.mesh));
  }
  const solver::GraphProblem& gp = built.gp;
  auto mismatch = [&](const std::string& what) {
    return invalidArgument("the model no longer matches the plan (" + what +
                           "); was the model file or apc changed since the plan was made?");
  };
  if (gp.problem.nodes.size() != plan.nodes.size())
    return mismatch("the plan has " + std::to_string(plan.nodes.size()) +
                    " nodes, the problem built now has " + std::to_string(gp.problem.nodes.size()));
  for (size_t i = 0; i < plan.nodes.size(); ++i) {
    const PlanNode& n = plan.nodes[i];
    bool graph_node_ok = gp.graph_nodes[i].valid()
                             ? n.graph_node && *n.graph_node == gp.graph_nodes[i].v
                             : !n.graph_node;
    if (!graph_node_ok || gp.strategies[i].size() != n.num_strategies ||
        std::string(trim(gp.strategies[i][n.strategy_index].toString())) != n.strategy)
      return mismatch("node " + std::to_string(i) + " '" + n.name + "' differs");
  }
  return built;
}

}  // namespace apc::plan
