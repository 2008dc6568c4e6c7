//===- lib/planner/pipeline.cpp - From an imported graph to a plan ------------===//
//
// The stages after import (see apc/planner/pipeline.h): the device and budget the spec means,
// strategy enumeration and problem construction with their wall times, the solve and makePlan,
// and the check that a rebuilt problem is the one a plan was solved on.
//
//===----------------------------------------------------------------------===//
#include "apc/planner/pipeline.h"

#include "apc/plan/memory.h"
#include "apc/planner/checkpointing.h"

#include "apc/cost/cost_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <map>
#include <numeric>

#include "apc/ir/proto_io.h"
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

Expected<std::vector<strategy::NodeStrategies>> enumerateForSpec(const ir::Graph& g,
                                                                 const spec::Spec& spec) {
  APC_ASSIGN_OR_RETURN(cost::CostModel model, cost::costModelFor(spec));
  strategy::EnumerateOptions options;
  options.cost_model = &model;
  if (!spec.mixed_precision.param_dtype)
    return strategy::enumerate(g, spec.mesh, strategy::defaultRegistry(), options);
  // Compute costs in param_dtype; the problem is built on the stored graph.
  return strategy::enumerate(solver::computeGraph(g, spec.mixed_precision), spec.mesh,
                             strategy::defaultRegistry(), options);
}

Expected<std::pair<double, double>> effectiveBudget(const spec::Spec& spec) {
  double low = spec.memory_budget.low;
  double high = spec.memory_budget.highOr(spec.mesh.worldSize());
  if (low > high)
    return invalidArgument(
        "memory budget low " + fmt(low) + " exceeds high " + fmt(high) +
        (spec.memory_budget.high ? std::string() : " (the default high, 1/world size)"));
  return std::pair{low, high};
}

Expected<spec::MemoryBudget> parseMemoryBudget(std::string_view text) {
  std::vector<std::string> parts = split(text, ',');
  if (parts.size() != 2)
    return invalidArgument(
        "--memory-budget: expected LOW,HIGH (fractions of the parameter bytes, "
        "like 0,0.25), got '" +
        std::string(text) + "'");
  spec::MemoryBudget b;
  auto low = parseDouble(trim(parts[0]));
  if (!low || !std::isfinite(*low))
    return invalidArgument("--memory-budget: LOW '" + parts[0] + "' is not a number");
  b.low = *low;
  if (!trim(parts[1]).empty()) {
    auto high = parseDouble(trim(parts[1]));
    if (!high || !std::isfinite(*high))
      return invalidArgument("--memory-budget: HIGH '" + parts[1] + "' is not a number");
    b.high = *high;
  }
  // The one budget rule (spec::MemoryBudget::violation), as the spec reader applies it.
  if (auto v = b.violation()) return invalidArgument("--memory-budget: " + v->text());
  return b;
}

Expected<BuiltProblem> buildProblem(const ir::Graph& g, const spec::Spec& spec,
                                    PhaseTimings* timings, const Deadline& deadline) {
  if (spec.mesh.ndim() > kMaxPlanMeshDims)
    return invalidArgument(
        "mesh " + spec.mesh.toString() + " has " + std::to_string(spec.mesh.ndim()) +
        " dims; apc plans meshes of at most " + std::to_string(kMaxPlanMeshDims) +
        " dims (a tensor's placements grow as (rank + 2)^dims: merge mesh dims, like 2x2x4x8 for "
        "2x2x2x2x2x4)");
  APC_RETURN_IF_ERROR(spec::validateSpecAgainstGraph(spec, g));
  APC_RETURN_IF_ERROR(effectiveBudget(spec));
  // A spec read from JSON has these checked with their paths; a spec made in C++ (the API) or
  // changed by a flag (apc plan --device) meets them here.
  if (!spec::isKnownDeviceKind(spec.device))
    return invalidArgument("unknown device '" + spec.device +
                           "' (known: " + join(spec::knownDeviceKinds(), ", ") + ")");
  const spec::MixedPrecision& mp = spec.mixed_precision;
  for (const auto& [field, dtype] :
       {std::pair{"param_dtype", mp.param_dtype}, std::pair{"reduce_dtype", mp.reduce_dtype},
        std::pair{"output_dtype", mp.output_dtype}})
    if (dtype && !ir::isFloating(*dtype))
      return invalidArgument(std::string("mixed precision ") + field + " must be floating, got " +
                             ir::dtypeName(*dtype));
  if (!(spec.prefetch_discount >= 0 && spec.prefetch_discount <= 1))
    return invalidArgument("the prefetch discount must be in [0, 1], got " +
                           fmt(spec.prefetch_discount));
  BuiltProblem out;
  auto t0 = Clock::now();
  // Their lists are shared with gp.strategies.
  APC_ASSIGN_OR_RETURN(std::vector<strategy::NodeStrategies> strategies, enumerateForSpec(g, spec));
  out.fallback_ops = strategy::fallbackOps(g, strategies);
  if (timings) timings->enumerate_s = secondsSince(t0);
  t0 = Clock::now();
  auto gp = solver::buildGraphProblem(g, strategies, spec, deadline);
  out.strategies = std::move(strategies);
  if (!gp.ok() && gp.error().code() == ErrorCode::kDeadline) {
    out.complete = false;
    if (timings) timings->build_s = secondsSince(t0);
    return out;
  }
  if (!gp.ok()) return gp.error();
  out.gp = std::move(gp).value();
  if (spec.prefetch_discount != 1.0)
    out.discounted_edges = applyPrefetchDiscount(g, out.gp, spec.prefetch_discount);
  if (timings) timings->build_s = secondsSince(t0);
  return out;
}

namespace {

/// True when every tensor input and output of `s` is replicated on every mesh dim.
bool allReplicated(const strategy::Strategy& s) {
  auto replicated = [](const std::optional<mesh::PlacementTuple>& t) {
    return !t || std::all_of(t->begin(), t->end(),
                             [](const mesh::Placement& p) { return p.isReplicate(); });
  };
  return std::all_of(s.inputs.begin(), s.inputs.end(), replicated) &&
         std::all_of(s.outputs.begin(), s.outputs.end(), replicated);
}

/// The restricted plan (see solveAndPlan in the header). `why`: what stopped the full problem;
/// `t0`: when the solve phase began (its time includes a full solve that stopped).
Expected<PlanResult> restrictedPlan(const ir::Graph& g, const BuiltProblem& built,
                                    const spec::Spec& spec, const PlanSource& source,
                                    solver::SolveGraphOptions options, PhaseTimings* timings,
                                    const std::string& why, Clock::time_point t0) {
  // Per distinct list (repeated layers share one) its kept indices and their list, shared again
  // by the nodes that shared the original, so the layers still cluster.
  struct Kept {
    std::vector<uint32_t> index;
    strategy::StrategyList list;
    double cheapest = 0;
    uint32_t full_size = 0;
  };
  std::map<const void*, Kept> by_list;
  std::map<uint32_t, const Kept*> by_node;  // graph node -> its list's Kept
  std::vector<strategy::NodeStrategies> restricted = built.strategies;
  for (strategy::NodeStrategies& ns : restricted) {
    const strategy::StrategyList& all = ns.strategies;
    if (all.empty()) continue;
    auto [it, fresh] = by_list.try_emplace(all.identity());
    Kept& k = it->second;
    if (fresh) {
      std::vector<uint32_t> order(all.size());
      std::iota(order.begin(), order.end(), 0u);
      std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
        return all[a].compute_us < all[b].compute_us;
      });
      k.cheapest = all[order[0]].compute_us;
      k.full_size = static_cast<uint32_t>(all.size());
      k.index.assign(order.begin(), order.begin() + std::min(kRestrictedStrategies, order.size()));
      for (uint32_t i = 0; i < all.size(); ++i)
        if (allReplicated(all[i])) {
          k.index.push_back(i);
          break;
        }
      std::sort(k.index.begin(), k.index.end());
      k.index.erase(std::unique(k.index.begin(), k.index.end()), k.index.end());
      std::vector<strategy::Strategy> list;
      for (uint32_t i : k.index) list.push_back(all[i]);
      k.list = std::move(list);
    }
    ns.strategies = k.list;
    by_node[ns.node.v] = &k;
  }
  APC_ASSIGN_OR_RETURN(solver::GraphProblem gp, solver::buildGraphProblem(g, restricted, spec));
  if (spec.prefetch_discount != 1.0) applyPrefetchDiscount(g, gp, spec.prefetch_discount);
  options.solver.first_plan_deadline = Deadline::none();
  PlanResult r;
  auto solution = solver::solveGraphProblem(gp, options, &r.sizes);
  // The restricted problem can lack a plan the full one has (a pin or the memory bound that only
  // dropped strategies meet): that is no verdict on the constraints.
  if (!solution.ok())
    return Error(solution.error().code() == ErrorCode::kInfeasible ? ErrorCode::kInvalidArgument
                                                                   : solution.error().code(),
                 why + ", and the restricted problem (each op's " +
                     std::to_string(kRestrictedStrategies) + " cheapest strategies) has no plan: " +
                     solution.error().message() + "; give a longer time limit (--time-limit)");
  r.solution = std::move(solution).value();
  // The bound: every node at its cheapest in the full problem, every edge at 0. Op nodes' indices
  // and counts are those of their full lists.
  SolveRecord record{options, {}, {}, {}, {}, built.graph_bytes};
  record.full_index.resize(gp.problem.nodes.size());
  record.full_sizes.resize(gp.problem.nodes.size());
  double bound = 0;
  size_t full = 0;
  for (size_t i = 0; i < gp.problem.nodes.size(); ++i) {
    const std::vector<double>& costs = gp.problem.nodes[i].costs;
    record.full_sizes[i] = static_cast<uint32_t>(costs.size());
    auto it = gp.graph_nodes[i].valid() ? by_node.find(gp.graph_nodes[i].v) : by_node.end();
    if (it != by_node.end()) {
      bound += it->second->cheapest;
      record.full_index[i] = it->second->index;
      record.full_sizes[i] = it->second->full_size;
    } else if (!costs.empty()) {
      bound += *std::min_element(costs.begin(), costs.end());
    }
    full += record.full_sizes[i];
  }
  r.sizes.strategies_before = full;
  record.sizes = r.sizes;
  // The restricted solve itself can stop at the deadline (then its plan is its best found).
  const bool restricted_optimal = r.solution.status == solver::SolveStatus::kOptimal;
  r.solution.status = solver::SolveStatus::kTimeLimit;
  r.solution.bound = std::min(bound, r.solution.objective);
  if (timings) {
    timings->solve_s = secondsSince(t0);
    timings->solver_s = r.solution.seconds;
  }
  APC_ASSIGN_OR_RETURN(r.plan, makePlan(g, gp, r.solution, spec, source, record));
  r.note = why + ": the plan is the " + (restricted_optimal ? "optimum" : "best plan found") +
           " over each op's " + std::to_string(kRestrictedStrategies) +
           " cheapest strategies by compute and its replicated one (" +
           std::to_string(gp.problem.numStrategies()) + " of " + std::to_string(full) +
           " strategies); its bound counts every node at its cheapest and every edge at 0";
  return r;
}

}  // namespace

Expected<PlanResult> solveAndPlan(const ir::Graph& g, const BuiltProblem& built,
                                  const spec::Spec& spec, const PlanSource& source,
                                  const solver::SolveGraphOptions& options, PhaseTimings* timings) {
  auto t0 = Clock::now();
  if (!built.complete)
    return restrictedPlan(g, built, spec, source, options, timings,
                          "the time limit passed while the problem was built", t0);
  PlanResult r;
  auto solution = solver::solveGraphProblem(built.gp, options, &r.sizes);
  if (!solution.ok() && solution.error().code() == ErrorCode::kDeadline)
    return restrictedPlan(g, built, spec, source, options, timings,
                          "the time limit passed before the problem had a first plan", t0);
  if (!solution.ok()) return solution.error();
  r.solution = std::move(solution).value();
  if (timings) {
    timings->solve_s = secondsSince(t0);
    timings->solver_s = r.solution.seconds;
  }
  APC_ASSIGN_OR_RETURN(r.plan, makePlan(g, built.gp, r.solution, spec, source,
                                        {options, r.sizes, {}, {}, {}, built.graph_bytes}));
  return r;
}

spec::Spec baselineSpec(const ir::Graph& g, spec::Spec spec, solver::Baseline b) {
  for (ir::NodeId id : g.nodesOfKind(ir::NodeKind::kInput)) {
    const ir::Node& n = g.node(id);
    if (n.outputs.empty() || spec.inputs.count(n.name)) continue;
    const ir::Value& v = g.value(n.outputs[0]);
    if (v.tensor) spec.inputs[n.name] = solver::dataParallelInput(*v.tensor, spec.mesh, b);
  }
  return spec;
}

Expected<PlanResult> solveBaselineAndPlan(const ir::Graph& g, const BuiltProblem& built,
                                          const spec::Spec& spec, const PlanSource& source,
                                          solver::Baseline baseline,
                                          const solver::SolveGraphOptions& options,
                                          PhaseTimings* timings) {
  PlanResult r;
  auto t0 = Clock::now();
  APC_ASSIGN_OR_RETURN(solver::GraphProblem pinned,
                       solver::applyBaseline(built.gp, g, baseline, spec.mesh));
  APC_ASSIGN_OR_RETURN(r.solution, solver::solveGraphProblem(pinned, options, &r.sizes));
  // A batch too small for every data-parallel mesh dim is left whole on some: said, not silent.
  const size_t dp_dims = solver::dataParallelMeshDims(baseline, spec.mesh.ndim());
  if (std::optional<ir::NodeId> first = solver::firstBatchInput(g)) {
    const ir::Node& n = g.node(*first);
    const ir::Value& v = g.value(n.outputs.at(0));
    auto placed = spec.inputs.find(n.name);
    std::vector<std::string> whole;
    int64_t ranks = 1;
    for (size_t j = 0; j < dp_dims; ++j) {
      ranks *= spec.mesh.size(j);
      if (placed == spec.inputs.end() || j >= placed->second.size() ||
          !placed->second[j].isShard(0))
        whole.push_back(std::to_string(j) + " (" + std::to_string(spec.mesh.size(j)) + " ranks)");
    }
    if (!whole.empty()) {
      std::string dims;
      for (const std::string& w : whole) dims += (dims.empty() ? "" : ", ") + w;
      r.note = std::string(solver::baselineName(baseline)) + ": input '" + n.name + "' (batch " +
               std::to_string(v.tensor->shape[0].size) + ") is not cut on mesh dim" +
               (whole.size() == 1 ? " " : "s ") + dims +
               ": every rank there computes the whole batch (not data-parallel); a batch of at "
               "least " +
               std::to_string(ranks) + " cuts on every data-parallel mesh dim";
    }
  }
  if (timings) {
    timings->solve_s = secondsSince(t0);
    timings->solver_s = r.solution.seconds;
  }
  APC_ASSIGN_OR_RETURN(
      r.plan,
      makePlan(g, pinned, r.solution, spec, source,
               {options, r.sizes, solver::baselineName(baseline), {}, {}, built.graph_bytes}));
  return r;
}

Expected<PlanRun> buildPlanProblem(const ir::Graph& g, spec::Spec spec, const PlanRequest& request,
                                   PhaseTimings* timings) {
  if (request.baseline) {
    const solver::Baseline b = *request.baseline;
    if (!solver::baselineApplies(b, spec.mesh.ndim()))
      return invalidArgument(std::string("the classic plan ") + solver::baselineName(b) +
                             " needs a mesh of 2 or more dims (data x tensor parallel), got " +
                             spec.mesh.toString());
    spec.memory_budget = {};
    spec.device_memory.reset();
    spec = baselineSpec(g, std::move(spec), b);
  }
  PlanRun run;
  // The optimizer's plan has a time limit; a classic plan is built and solved to the end.
  if (!request.baseline) {
    const auto now = Clock::now();
    const Deadline deadline = request.options.solver.deadline.earlier(
        Deadline::after(now, request.options.solver.time_limit_s));
    const auto left = std::max(deadline.time() - now, Clock::duration::zero());
    run.build_deadline =
        Deadline::at(now + std::chrono::duration_cast<Clock::duration>(left * kBuildShare));
    run.first_plan_deadline =
        Deadline::at(now + std::chrono::duration_cast<Clock::duration>(left * kFirstPlanShare));
  }
  APC_ASSIGN_OR_RETURN(run.built, buildProblem(g, spec, timings, run.build_deadline));
  run.built.graph_bytes = request.graph_bytes;
  run.spec = std::move(spec);
  return run;
}

namespace {

/// The most solves of the device-memory loop (solveForDeviceMemory).
constexpr int kMaxDeviceMemorySolves = 6;
/// The memory-free subproblems step 0 may solve per solve of that loop.
constexpr size_t kDeviceMemorySearchSubproblems = 96;
/// The loop's parameter bound is its own estimate: step 0 may prove its plan at a bound slightly
/// below it instead (SolveGraphOptions::memory_tighten_within), giving up at most this fraction
/// of the plan's cost against the bound asked.
constexpr double kDeviceMemoryTightenWithin = 1e-3;

/// The optimizer's plan under spec.device_memory: the fastest plan whose predicted peak per rank
/// fits. The peak is parameters x (1 + optimizer state) + gradients + the rest (activations,
/// buffers, inputs, transient), and only the parameters' part is linear in the placements the
/// solver chooses, so the solver's memory row bounds the parameter bytes and this loop sets its
/// bound from the predicted rest:
///   1. the plan without a memory row; if its peak fits, it is the fastest plan of all;
///   2. else bound the parameter bytes by (device - rest) / (bytes per parameter byte at the
///      peak), the rest and the ratio taken from the last plan (and the optimizer step's
///      (2 + state) x parameters + its temporary), shrinking by device / peak when a plan still
///      does not fit, for at most kMaxDeviceMemorySolves solves.
/// With `checkpoint` (activation checkpointing allowed), every plan of the loop that does not fit
/// is also tried with the cheapest checkpointing that makes it fit (checkpointToFit); the result
/// is the fastest of the plans that fit (estimated step time, recompute included).
/// When even every parameter at its least footprint does not fit, the error names the smallest
/// predicted peak (that plan's).
Status solveForDeviceMemory(const ir::Graph& g, const PlanSource& source,
                            const solver::SolveGraphOptions& options, bool checkpoint, PlanRun& run,
                            PhaseTimings* timings) {
  const spec::Spec& spec = run.spec;
  const double device = static_cast<double>(*spec.device_memory);
  APC_ASSIGN_OR_RETURN(const int state, optimizerStateFactor(spec.optimizer));
  solver::GraphProblem& gp = run.built.gp;
  const double total = gp.total_param_bytes;
  double least = 0;
  for (const solver::ProblemNode& n : gp.problem.nodes)
    if (!n.memory.empty()) least += *std::min_element(n.memory.begin(), n.memory.end());
  // A row that binds in part: step 0's search alone (the ILP path rarely closes what it leaves,
  // and slowly), a few subproblems. Unproven, its plan comes with its proven gap, unless the
  // plan at the memory of the search's root hull plan (below the bound asked; the root proves it
  // optimal there) is no slower: the bound this loop chooses is its own estimate anyway.
  solver::SolveGraphOptions loop_options = options;
  loop_options.memory_search_only = true;
  loop_options.memory_search_subproblems =
      std::min(loop_options.memory_search_subproblems, kDeviceMemorySearchSubproblems);
  loop_options.memory_tighten_within = kDeviceMemoryTightenWithin;
  auto solveWith = [&](std::optional<double>& high) -> Expected<PlanResult> {
    if (high)
      gp.problem.memory = solver::MemoryBound{0, *high, total, 0};
    else
      gp.problem.memory.reset();
    APC_ASSIGN_OR_RETURN(PlanResult r,
                         solveAndPlan(g, run.built, spec, source, loop_options, timings));
    const double tightened = r.sizes.memory_tightened;
    if (high && tightened > 0 && tightened < *high) {
      // Proven optimal at a bound just below the one asked (step 0's check of its plan against
      // the root's minimum): the plan made again at that bound, so that it records the bound it
      // is optimal for. The same solution: no second search.
      high = tightened;
      gp.problem.memory = solver::MemoryBound{0, tightened, total, 0};
      APC_ASSIGN_OR_RETURN(r.plan,
                           makePlan(g, gp, r.solution, spec, source,
                                    {loop_options, r.sizes, {}, {}, {}, run.built.graph_bytes}));
      return r;
    }
    const double hull = r.sizes.memory_hull;
    if (high && r.solution.status != solver::SolveStatus::kOptimal && hull > 0 && hull < *high) {
      gp.problem.memory = solver::MemoryBound{0, hull, total, 0};
      auto snapped = solveAndPlan(g, run.built, spec, source, loop_options, timings);
      if (snapped.ok() && snapped->solution.status == solver::SolveStatus::kOptimal &&
          snapped->plan.totals.total_us <= r.plan.totals.total_us) {
        high = hull;
        return snapped;
      }
      gp.problem.memory = solver::MemoryBound{0, *high, total, 0};
    }
    return r;
  };
  auto peakOf = [&](const PlanResult& r) -> Expected<const MemoryEstimate*> {
    const MemoryEstimate* e = r.plan.memoryFor(spec.optimizer);
    if (!e) return internalError("the plan has no memory estimate for " + spec.optimizer);
    return e;
  };
  const std::string what = "--device-memory " + humanBytes(device);
  std::optional<double> unbounded;
  APC_ASSIGN_OR_RETURN(PlanResult r, solveWith(unbounded));
  APC_ASSIGN_OR_RETURN(const MemoryEstimate* e, peakOf(r));
  int solves = 1;
  std::optional<double> high;
  // The fastest plan so far that fits with checkpointing, and the parameter bound it was solved
  // with.
  std::optional<PlanResult> checkpointed;
  std::optional<double> checkpointed_high;
  auto tryCheckpointing = [&](const PlanResult& from) -> Status {
    if (!checkpoint) return Status::success();
    PlanResult c = from;
    APC_ASSIGN_OR_RETURN(const bool fits,
                         checkpointToFit(g, c.plan, *spec.device_memory, spec.optimizer));
    if (fits && (!checkpointed || c.plan.totals.total_us < checkpointed->plan.totals.total_us)) {
      checkpointed = std::move(c);
      checkpointed_high = high;
    }
    return Status::success();
  };
  // The checkpointed plan, when it is the fastest that fits (`fitting`: the loop's own, if any).
  auto finish = [&](std::optional<PlanResult> fitting) -> bool {
    if (!checkpointed ||
        (fitting && fitting->plan.totals.total_us <= checkpointed->plan.totals.total_us))
      return false;
    const MemoryEstimate* ce = checkpointed->plan.memoryFor(spec.optimizer);
    std::string note = what + ": predicted peak per rank " +
                       humanBytes(static_cast<double>(ce ? ce->peak_bytes : 0)) + " (" +
                       spec.optimizer + ") with " +
                       std::to_string(checkpointed->plan.checkpoint.size()) +
                       " checkpointed module(s) (recompute " +
                       formatMicros(checkpointed->plan.totals.recompute_us) + ")";
    if (checkpointed_high) note += ", parameters bounded to " + humanBytes(*checkpointed_high);
    note += " after " + std::to_string(solves) + " solves";
    checkpointed->note = checkpointed->note.empty() ? note : checkpointed->note + "; " + note;
    run.result = std::move(*checkpointed);
    return true;
  };
  while (static_cast<double>(e->peak_bytes) > device) {
    APC_RETURN_IF_ERROR(tryCheckpointing(r));
    if (solves >= kMaxDeviceMemorySolves) {
      if (finish(std::nullopt)) return Status::success();
      return Error(ErrorCode::kInfeasible, what + ": after " + std::to_string(solves) +
                                               " solves the predicted peak per rank is still " +
                                               humanBytes(static_cast<double>(e->peak_bytes)) +
                                               " (" + e->phase +
                                               (e->at.empty() ? "" : " at " + e->at) +
                                               "); give more memory or a smaller batch");
    }
    const MemoryParts& m = e->at_peak;
    const double params = static_cast<double>(std::max<int64_t>(m.parameters, 1));
    const double per_param =
        static_cast<double>(m.parameters + m.optimizer_state + m.gradients) / params;
    const double rest =
        static_cast<double>(m.total() - m.parameters - m.optimizer_state - m.gradients);
    double next = (device - rest) / per_param;
    // The optimizer step holds every gradient besides the parameters and state.
    int64_t largest = 0;
    for (const PlanParameter& q : r.plan.parameters) largest = std::max(largest, q.bytes_per_rank);
    next = std::min(next, (device - static_cast<double>(largest)) / (2.0 + state));
    if (high) next = std::min(next, *high * device / static_cast<double>(e->peak_bytes));
    if (next < least) {
      // The plan with every parameter at its least footprint: with checkpointing it may fit;
      // else it names the smallest memory that works.
      std::string smallest;
      std::optional<double> at_least = least;
      if (auto lr = solveWith(at_least); lr.ok()) {
        high = at_least;
        ++solves;
        APC_RETURN_IF_ERROR(tryCheckpointing(*lr));
        if (finish(std::nullopt)) return Status::success();
        Plan& lp = lr->plan;
        if (checkpoint) {
          std::vector<std::string> all = checkpointCandidates(g);
          if (!all.empty()) APC_RETURN_IF_ERROR(applyCheckpointing(g, lp, std::move(all)));
        }
        if (const MemoryEstimate* le = lp.memoryFor(spec.optimizer))
          smallest = "; the smallest predicted peak per rank is " +
                     humanBytes(static_cast<double>(le->peak_bytes)) +
                     " (every parameter at its least footprint" +
                     (lp.checkpoint.empty()
                          ? std::string()
                          : ", " + std::to_string(lp.checkpoint.size()) + " modules checkpointed") +
                     ", " + humanBytes(static_cast<double>(le->saved_activations)) +
                     " of saved activations, optimizer " + spec.optimizer + ", peak in " +
                     le->phase + "): give at least that, a smaller batch or more ranks";
      } else if (finish(std::nullopt)) {
        return Status::success();
      }
      return Error(ErrorCode::kInfeasible,
                   what + ": no plan fits: the parameters would need at most " +
                       humanBytes(std::max(next, 0.0)) + " per rank, and they take at least " +
                       humanBytes(least) + smallest);
    }
    high = std::min(next, total);
    APC_ASSIGN_OR_RETURN(r, solveWith(high));
    APC_ASSIGN_OR_RETURN(e, peakOf(r));
    ++solves;
  }
  if (finish(r)) return Status::success();
  std::string note = what + ": predicted peak per rank " +
                     humanBytes(static_cast<double>(e->peak_bytes)) + " (" + spec.optimizer + ", " +
                     e->phase + (e->at.empty() ? "" : " at " + e->at) + ")";
  note += high ? ", parameters bounded to " + humanBytes(*high) + " per rank after " +
                     std::to_string(solves) + " solves"
               : ", the fastest plan without a memory bound fits";
  r.note = r.note.empty() ? note : r.note + "; " + note;
  run.result = std::move(r);
  return Status::success();
}

}  // namespace

Status solvePlanProblem(const ir::Graph& g, const PlanSource& source, const PlanRequest& request,
                        PlanRun& run, PhaseTimings* timings) {
  solver::SolveGraphOptions options = request.options;
  options.solver.first_plan_deadline = run.first_plan_deadline;
  const bool automatic = !request.checkpoint || *request.checkpoint == "auto";
  std::vector<std::string> modules;
  if (!automatic) {
    APC_ASSIGN_OR_RETURN(modules, parseCheckpointModules(g, *request.checkpoint));
  }
  if (!request.baseline && run.spec.device_memory && automatic)
    return solveForDeviceMemory(g, source, options, /*checkpoint=*/true, run, timings);
  if (!request.baseline && run.spec.device_memory) {
    APC_RETURN_IF_ERROR(
        solveForDeviceMemory(g, source, options, /*checkpoint=*/false, run, timings));
  } else {
    APC_ASSIGN_OR_RETURN(
        run.result, request.baseline
                        ? solveBaselineAndPlan(g, run.built, run.spec, source, *request.baseline,
                                               options, timings)
                        : solveAndPlan(g, run.built, run.spec, source, options, timings));
    if (!request.baseline && run.spec.schedule_discount && run.built.complete &&
        run.result.solution.status == solver::SolveStatus::kOptimal)
      APC_RETURN_IF_ERROR(refineForOverlap(g, source, options, run));
  }
  if (!modules.empty()) APC_RETURN_IF_ERROR(applyCheckpointing(g, run.result.plan, modules));
  return Status::success();
}

Expected<PlanRun> planGraph(const ir::Graph& g, spec::Spec spec, const PlanSource& source,
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
