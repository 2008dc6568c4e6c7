//===- apc/planner/pipeline.h - From an imported graph to a plan --------------===//
//
// The planner's stages after import, as `apc plan`, `apc explain` and the C++ API run them:
//
//   buildProblem:  spec checks -> enumerate strategies (lib/strategy) -> GraphProblem (lib/solver)
//   solveAndPlan:  solveGraphProblem (reduction + CBC) -> makePlan
//
// Import stays with the callers (it needs LibTorch; this library does not). The planner
// (lib/planner) is the only part of the plan libraries that links the solver: the Plan type and
// its files (lib/plan) do not, so lowering and the runtime carry no solver. Each stage records its
// wall time in PhaseTimings, which is printed and never stored in the plan.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <future>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "apc/cost/device.h"
#include "apc/ir/graph.h"
#include "apc/plan/plan.h"
#include "apc/solver/baselines.h"
#include "apc/solver/graph_problem.h"
#include "apc/spec/spec.h"
#include "apc/strategy/strategy.h"
#include "apc/support/deadline.h"

namespace apc::plan {

/// Wall times of the phases of one planning run, in seconds.
struct PhaseTimings {
  double import_s = 0;     // filled by the caller
  double enumerate_s = 0;  // strategy enumeration
  double build_s = 0;      // GraphProblem construction (edge pricing)
  double solve_s = 0;      // reduction + ILP + expansion
  double write_s = 0;      // filled by the caller
  double solver_s = 0;     // the ILP alone, as the solver reports it (part of solve_s)
};

/// The strategies of every op of `g` priced by the spec's cost model (cost::costModelFor): on
/// solver::computeGraph(g, ...) under mixed precision, on `g` otherwise. The one enumeration of
/// planning and of plan verification, so both see the same lists (pruning depends on prices).
Expected<std::vector<strategy::NodeStrategies>> enumerateForSpec(const ir::Graph& g,
                                                                 const spec::Spec& spec);

/// The memory budget a spec means, as fractions of the parameter bytes: (low, high) with high
/// defaulting to 1 / world size. low > high is a kInvalidArgument error that names both.
Expected<std::pair<double, double>> effectiveBudget(const spec::Spec& spec);

/// Parses `--memory-budget LOW,HIGH` (fractions of the parameter bytes, like "0,0.25"; "LOW," keeps
/// the default high). Errors name the flag: a value that is not a number, low < 0, high outside
/// (0, 1], low > high.
Expected<spec::MemoryBudget> parseMemoryBudget(std::string_view text);

struct BuiltProblem {
  solver::GraphProblem gp;  // its `strategies` are the enumerated ones
  /// False when construction stopped at its deadline (buildProblem's `deadline`): then `gp` is
  /// empty and the solve makes the restricted plan (solveAndPlan).
  bool complete = true;
  /// The enumerated strategies per op (their lists are gp.strategies'), for the restricted plan.
  std::vector<strategy::NodeStrategies> strategies;
  /// Ops without a sharding rule (they got the Replicate-only strategy), sorted.
  std::vector<std::string> fallback_ops;
  /// How many edges the spec's prefetch discount scaled (0 without one).
  size_t discounted_edges = 0;
  /// PlanRequest::graph_bytes as buildPlanProblem got it (invalid when the caller gave none);
  /// makePlan takes it (through SolveRecord) instead of serializing the graph again.
  std::shared_future<std::string> graph_bytes;
};

/// The prefetch discount: scales by `scale` the finite positive costs of every edge out of a
/// parameter-derived node (a parameter, or an op all of whose tensor inputs come from
/// parameter-derived nodes, like a transposed weight). Their cost is the whole communication of
/// the parameter (the all-gather before use, the re-gather for backward, the gradient's
/// reduce-scatter or all-reduce), which can overlap other layers' compute. Scaling only lowers
/// costs, so the optimum can only fall. Returns how many edges it scaled.
size_t applyPrefetchDiscount(const ir::Graph& g, solver::GraphProblem& gp, double scale);

struct PlanRun;
/// The prefetch discount from the runtime's schedule (spec "prefetch_discount": "schedule"):
/// run.result's plan (solved without a discount) is lowered for rank 0 and its step replayed as
/// the runtime overlaps it (apc/lower/schedule.h, the artifact's Prediction.hidden_comm_us). The
/// share of the parameter-derived edges' priced communication that the schedule hides becomes the
/// scale of applyPrefetchDiscount on a copy of run.built's problem, which is solved again; its plan
/// (made with the undiscounted prices, so its costs stay the cost model's) replaces run.result
/// when its replayed step is shorter, and the round repeats from it (at most kOverlapRounds). The
/// plan's solver objective and bound are then the discounted problem's. run.result.note says
/// what each round found.
Status refineForOverlap(const ir::Graph& g, const PlanSource& source,
                        const solver::SolveGraphOptions& options, PlanRun& run);
inline constexpr int kOverlapRounds = 2;

/// The most mesh dims buildProblem accepts: strategy counts grow as (rank + 2)^dims per tensor, and
/// beyond four dims planning would not finish in reasonable time or memory.
inline constexpr size_t kMaxPlanMeshDims = 4;

/// Checks the spec against the graph (validateSpecAgainstGraph, the budget, the mixed precision
/// dtypes), enumerates the strategies on the spec's mesh and device (on solver::computeGraph when
/// the spec's mixed precision sets a param_dtype, so compute is priced in that dtype), builds the
/// GraphProblem and applies the spec's prefetch discount (applyPrefetchDiscount). When `deadline`
/// passes while the edges are priced, construction stops and the result is not `complete`.
Expected<BuiltProblem> buildProblem(const ir::Graph& g, const spec::Spec& spec,
                                    PhaseTimings* timings = nullptr, const Deadline& deadline = {});

/// What the solve step gives a plan besides the solution: the options (recorded and part of the
/// content hash) and the problem sizes before and after reduction.
struct SolveRecord {
  solver::SolveGraphOptions options;
  solver::ReductionStats sizes;
  std::string baseline;  // SolverStats::baseline
  /// A restricted plan's (pipeline.h, solveAndPlan): per problem node, the index in its full list
  /// of each strategy the solved problem kept (empty: the node kept its whole list), and the full
  /// lists' sizes; the plan records full-list indices and counts. Empty: no restriction.
  std::vector<std::vector<uint32_t>> full_index;
  std::vector<uint32_t> full_sizes;
  /// ir::serializeGraph(g) when already started (BuiltProblem::graph_bytes); else makePlan makes
  /// it.
  std::shared_future<std::string> graph_bytes = {};
};

/// The content hash of a planning run: apc/plan/plan.h's contentHash with the options' reduce
/// setting (the one solver option that defines the problem).
std::string contentHash(const PlanSource& source, const spec::Spec& spec,
                        const solver::SolveGraphOptions& options, std::string_view baseline = {});

/// Makes the plan of a solved problem. `solution.choice` must have one entry per node of
/// `gp.problem` (solveGraphProblem expands reduced solutions); errors otherwise.
Expected<Plan> makePlan(const ir::Graph& g, const solver::GraphProblem& gp,
                        const solver::Solution& solution, const spec::Spec& spec,
                        const PlanSource& source, const SolveRecord& record);

struct PlanResult {
  Plan plan;
  solver::Solution solution;  // solution.seconds: the solver's own time
  solver::ReductionStats sizes;
  /// Set for a restricted plan: one line on why and how it was made (apc plan prints it).
  std::string note;
};

/// The most strategies per op of the restricted plan (solveAndPlan), besides the replicated one.
inline constexpr size_t kRestrictedStrategies = 8;

/// Solves a built problem and makes its plan. Infeasible constraints are a kInfeasible error with
/// the solver's diagnosis.
///
/// The restricted plan: when construction did not finish (built.complete false) or the solve's
/// reductions passed options.solver.first_plan_deadline, no plan of the full problem exists yet.
/// Then every op keeps its kRestrictedStrategies cheapest strategies by compute (ties by index)
/// and its all-Replicate one, leaves and sinks keep theirs, and that problem is built and solved
/// exactly (its edges priced as the full problem's, so the plan's costs are exact). Its status is
/// time_limit and its bound the sum of every node's cheapest cost in the full problem (edge costs
/// are >= 0): a valid lower bound on the optimum, so the plan states its proven gap. Strategy
/// indices in the plan are those of the full lists.
Expected<PlanResult> solveAndPlan(const ir::Graph& g, const BuiltProblem& built,
                                  const spec::Spec& spec, const PlanSource& source,
                                  const solver::SolveGraphOptions& options,
                                  PhaseTimings* timings = nullptr);

/// The spec a classic plan is made with: `spec` with every tensor input it does not place given the
/// baseline's conventional data-parallel placement (solver::dataParallelInput: batch dim sharded on
/// the mesh dims the baseline uses for data, R elsewhere; tp keeps inputs replicated). Inputs the
/// spec places keep their placement. The memory budget is left as is (a baseline ignores it).
spec::Spec baselineSpec(const ir::Graph& g, spec::Spec spec, solver::Baseline b);

/// A classic plan: the built problem with the baseline's parameter pins (solver::applyBaseline: the
/// memory bound removed, the rest of the graph optimized around the pins), solved and made into a
/// plan with status "baseline <name>" and SolverStats::baseline set. Errors: as applyBaseline
/// (fsdp+tp on a 1-d mesh), and infeasible pins as in solveAndPlan.
Expected<PlanResult> solveBaselineAndPlan(const ir::Graph& g, const BuiltProblem& built,
                                          const spec::Spec& spec, const PlanSource& source,
                                          solver::Baseline baseline,
                                          const solver::SolveGraphOptions& options,
                                          PhaseTimings* timings = nullptr);

/// What a planning run asks for besides the spec: the optimizer's plan or a classic one, and the
/// solver's settings.
struct PlanRequest {
  std::optional<solver::Baseline> baseline;
  solver::SolveGraphOptions options;
  /// Activation checkpointing (apc/planner/checkpointing.h), `apc plan --checkpoint`: nullopt or
  /// "auto" (chosen when the spec's device_memory needs it, never otherwise), "none", "all" or a
  /// comma-separated list of modules (checkpointed in the plan as solved: with device_memory,
  /// the memory loop then runs without automatic checkpointing).
  std::optional<std::string> checkpoint;
  /// ir::serializeGraph(g) (the plan's `graph`), when the caller computes it beside planning: apc
  /// plan starts it on a thread of its own after the import, so that it overlaps hashing,
  /// enumeration, construction and the solve. Without it makePlan serializes the graph itself. The
  /// planner starts no thread.
  std::shared_future<std::string> graph_bytes;
};

struct PlanRun {
  spec::Spec spec;  // the spec planned (a classic plan's: see planGraph)
  BuiltProblem built;
  PlanResult result;
  /// From the request's deadline (or time limit), set by buildPlanProblem: construction stops at
  /// kBuildShare of the time and the reductions before a first plan at kFirstPlanShare, leaving
  /// the rest for the restricted plan (see solveAndPlan). None for a classic plan.
  Deadline build_deadline, first_plan_deadline;
};

/// The shares of the time limit that construction, and construction with the first plan's
/// reductions, may use before the restricted plan takes over. The restricted plan takes a small
/// part of what the full problem takes (llama_tiny on 2x2x4x8: 0.13 s against 52 s).
inline constexpr double kBuildShare = 0.8;
inline constexpr double kFirstPlanShare = 0.9;

/// The one driver after import, shared by `apc plan` and the C++ API (optimize_placement,
/// baseline_placement): buildPlanProblem, then solvePlanProblem.
Expected<PlanRun> planGraph(const ir::Graph& g, spec::Spec spec, const PlanSource& source,
                            const PlanRequest& request, PhaseTimings* timings = nullptr);
/// planGraph's first half (apc plan reports the build and dumps the problem in between): for a
/// classic plan, checks that it applies to the mesh and plans with baselineSpec's spec, its memory
/// budget dropped (a classic plan defines its own parameter memory); then buildProblem. Fills
/// run.spec and run.built.
Expected<PlanRun> buildPlanProblem(const ir::Graph& g, spec::Spec spec, const PlanRequest& request,
                                   PhaseTimings* timings = nullptr);
/// planGraph's second half: solveAndPlan or solveBaselineAndPlan of run.built into run.result.
Status solvePlanProblem(const ir::Graph& g, const PlanSource& source, const PlanRequest& request,
                        PlanRun& run, PhaseTimings* timings = nullptr);

/// Rebuilds the problem a plan was solved on, from the same graph (imported again from
/// plan.model) and plan.spec, and checks that it matches the plan: the same nodes, names, strategy
/// counts and chosen strategies (a baseline plan's pins are applied again). A mismatch (the model
/// file or apc changed) is an error that names the first differing node.
Expected<BuiltProblem> rebuildProblem(const ir::Graph& g, const Plan& plan);

}  // namespace apc::plan
