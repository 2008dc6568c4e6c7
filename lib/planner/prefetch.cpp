//===- lib/planner/prefetch.cpp - The prefetch discount -----------------------===//
//
// Scales the priced communication of parameter-derived edges (spec "prefetch_discount", apc plan
// --prefetch-discount, ShardingOptimizer::apply_prefetch_discount): see applyPrefetchDiscount in
// apc/planner/pipeline.h.
//
//===----------------------------------------------------------------------===//
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

#include "apc/cost/cost_model.h"
#include "apc/lower/lower.h"
#include "apc/planner/pipeline.h"
#include "apc/solver/baselines.h"

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

namespace {

/// A plan's step as rank 0's program replays it with the runtime's overlap (the artifact's
/// prediction), and the communication time that overlap takes off the step (the hidden
/// communication's overlap_efficiency share: none on a device whose collectives compute on the
/// cores that run the model).
struct Replayed {
  double step_us = 0, hidden_us = 0;
};
Expected<Replayed> replay(const ir::Graph& g, const Plan& p) {
  APC_ASSIGN_OR_RETURN(proto::Program prog, lower::lowerRank(g, p, 0));
  const proto::Prediction& pr = prog.prediction();
  const double hidden = pr.overlap_efficiency() * pr.hidden_comm_us();
  return Replayed{pr.step_us() - pr.grad_bucket_saving_us() - hidden, hidden};
}

}  // namespace

Status refineForOverlap(const ir::Graph& g, const PlanSource& source,
                        const solver::SolveGraphOptions& options, PlanRun& run) {
  auto addNote = [&](const std::string& note) {
    run.result.note = run.result.note.empty() ? note : run.result.note + "; " + note;
  };
  // A device whose collectives take turns with compute (CPU ranks: overlap efficiency 0) gains
  // nothing from hiding them: no further solve or lowering.
  APC_ASSIGN_OR_RETURN(cost::DeviceSpec device, cost::deviceForSpec(run.spec));
  if (device.overlap_efficiency <= 0) {
    addNote(
        "overlap: the device's collectives take turns with its compute (overlap efficiency 0): "
        "no schedule discount");
    return Status::success();
  }
  const std::vector<bool> derived = parameterDerived(g, run.built.gp);
  auto parameterComm = [&](const Plan& p) {
    double us = 0;
    for (const PlanNode& n : p.nodes)
      for (const PlanEdge& e : n.in_edges)
        if (e.from < derived.size() && derived[e.from]) us += e.cost_us;
    return us;
  };
  auto scaleOf = [](double hidden, double comm) -> std::optional<double> {
    if (hidden <= 0 || comm <= 0) return std::nullopt;
    return std::clamp(1.0 - hidden / comm, 0.0, 1.0);
  };
  APC_ASSIGN_OR_RETURN(Replayed best, replay(g, run.result.plan));
  std::string note = "overlap: the runtime's schedule takes " + formatMicros(best.hidden_us) +
                     " of hidden communication off the step (step " + formatMicros(best.step_us) +
                     ")";
  // One solve with the parameter-derived edges scaled: kept when its replayed step is shorter.
  auto attempt = [&](double scale, const char* from) -> Expected<bool> {
    solver::GraphProblem gp = run.built.gp;
    applyPrefetchDiscount(g, gp, scale);
    PlanResult r;
    auto solution = solver::solveGraphProblem(gp, options, &r.sizes);
    if (!solution.ok()) return solution.error();
    r.solution = std::move(solution).value();
    APC_ASSIGN_OR_RETURN(r.plan, makePlan(g, run.built.gp, r.solution, run.spec, source,
                                          {options, r.sizes, {}, {}, {}, run.built.graph_bytes}));
    APC_ASSIGN_OR_RETURN(const Replayed next, replay(g, r.plan));
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4g", scale);
    const bool better = next.step_us < best.step_us * (1 - 1e-9);
    note += std::string("; parameter edges scaled by ") + buf + " (" + from + "): step " +
            formatMicros(next.step_us) + (better ? "" : ", not kept");
    if (better) {
      r.note = run.result.note;
      run.result = std::move(r);
      best = next;
    }
    return better;
  };
  // The scale data parallelism's schedule gives (every parameter's gradient in DDP's buckets,
  // behind backward): for a plan whose parameters move nothing the runtime could overlap.
  auto ddpScale = [&]() -> std::optional<double> {
    auto pinned = solver::applyBaseline(run.built.gp, g, solver::Baseline::kDdp, run.spec.mesh);
    if (!pinned.ok()) return std::nullopt;
    solver::ReductionStats sizes;
    auto solution = solver::solveGraphProblem(*pinned, options, &sizes);
    if (!solution.ok()) return std::nullopt;
    auto plan = makePlan(g, *pinned, *solution, run.spec, source,
                         {options, sizes, "ddp", {}, {}, run.built.graph_bytes});
    if (!plan.ok()) return std::nullopt;
    auto replayed = replay(g, *plan);
    if (!replayed.ok()) return std::nullopt;
    return scaleOf(replayed->hidden_us, parameterComm(*plan));
  };
  bool ddp_tried = false;
  for (int round = 0; round < kOverlapRounds; ++round) {
    bool improved = false;
    if (const std::optional<double> scale =
            scaleOf(best.hidden_us, parameterComm(run.result.plan))) {
      APC_ASSIGN_OR_RETURN(improved, attempt(*scale, "this plan's schedule"));
    }
    if (!improved && !ddp_tried) {
      ddp_tried = true;
      if (const std::optional<double> scale = ddpScale()) {
        APC_ASSIGN_OR_RETURN(improved, attempt(*scale, "ddp's schedule"));
      }
    }
    if (!improved) break;
  }
  addNote(note);
  return Status::success();
}

}  // namespace apc::plan
