//===- apc/solver/graph_problem.h - From a graph to a solver Problem -------===//
//
// Builds the solver's Problem from an imported graph, the strategies of its ops and a spec:
//
// - One problem node per placeable graph node, in graph order: inputs, parameters and buffers
//   (their strategies are every placement tuple of their tensor that the mesh can cut), and op
//   nodes that have strategies. Compute costs come from the strategies.
// - Inputs are pinned (group "inputs") to the spec's placement, or to Replicate on every mesh dim
//   by default, as in AutoParallel. A constrained output leaf gets a sink node with one pinned
//   strategy (group "outputs") and an edge that prices the final redistribution.
// - One edge per tensor input whose producer is placeable, with the semantics of apc/cost/edge.h
//   (the rules lowering emits). Its cost for a pair of strategies is the
//   forward redistribution from the producer's output placement to the consumer's input placement,
//   plus, when the value requires grad, the redistribution of the gradient back: the gradient of an
//   input that is Replicate on mesh dim d while the op is sharded or partial on d is Partial on d;
//   it is reduced to the producer's placement with Partial read as Replicate (all-reduce for a
//   replicated parameter as in DDP, reduce-scatter for a sharded one as in FSDP). A parameter's
//   redistributed copy is not kept for backward: its forward redistribution is paid twice (FSDP's
//   re-gather), so the runtime must do the same for measured and priced bytes to agree. Both use
//   the one redistribution planner of lib/cost, so priced collectives are the executed ones.
// - Parameter memory (e): bytes of each parameter's local shard; bounds low/high are fractions of
//   the total parameter bytes, default (0, 1/world size); when uneven dims make 1/world size
//   unreachable (the largest piece is counted), the default high is the least footprint instead.
// - Free outputs: an output leaf without a constraint may end in any placement but Partial. The
//   lowering reduces a Partial output to Replicate at the end of the forward, so a free leaf whose
//   producer has a strategy with a Partial output gets an unpinned sink whose edge prices that
//   final reduction (P -> R on the partial mesh dims, shards kept; forward only: the gradient of a
//   reduction is its broadcast, which costs nothing). S and R end states stay free.
// - Pins (group "pins"): each spec pin is resolved to values (a node pin: the value the name
//   names; a module pin: every tensor a node of the module, or of a module below it, produces and
//   a node outside it or the forward's result uses) and each value gets a pin sink: a node with two
//   strategies, 0 = the pinned placement (edge cost 0 from a producer strategy whose output is that
//   placement, +infinity from any other) and 1 = free (cost 0 from every strategy), pinned to 0.
//   A sink rather than a pin on the producer itself because an op usually has several strategies
//   with the pinned output (they differ in their inputs); the exact reduction folds the sink into
//   the producer's costs, and the infeasibility diagnosis, dropping group "pins", unpins the sinks
//   (strategy 1), so infeasible pins are named. A pin on a graph input that the spec's "inputs" do
//   not place also sets that input's placement (instead of the default Replicate). Nodes that feed
//   a pin sink are never tied by repeated-layer clustering: a pin on layers.3 pins layers.3 only.
// - Shared reads (spec.shared_reads, off by default): the groups of op edges that read one value
//   and can share its redistribution (SharedReads below), for evaluate(gp, .) and the solve.
// - Mixed precision (spec.mixed_precision), as FSDP2's MixedPrecisionPolicy runs it: parameters
//   are cast to param_dtype before they are redistributed (the all-gather moves param_dtype bytes),
//   floating inputs are cast too, so every floating activation and its gradient is param_dtype;
//   parameter gradients are reduced in reduce_dtype (default: param_dtype). Edges are priced in
//   those dtypes. The memory bound (e) and total_param_bytes stay on the STORED parameter bytes
//   (the model's dtype): the sharded parameters that persist between steps are the stored ones,
//   and the cast copies are transient like the gathered ones. Compute costs come from the
//   strategies: enumerate them on computeGraph(g, mp) for a roofline in param_dtype (lib/plan's
//   pipeline does). output_dtype changes nothing here (the cast follows the final redistribution).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "apc/cost/device.h"
#include "apc/cost/edge.h"
#include "apc/ir/graph.h"
#include "apc/solver/ilp.h"
#include "apc/solver/problem.h"
#include "apc/spec/spec.h"
#include "apc/strategy/strategy.h"
#include "apc/support/deadline.h"

namespace apc::solver {

/// Readers of one value served by one redistribution. Lowering makes one redistribution per
/// (value, input placement, gradient placement) and every reader of the value at that placement
/// reads it: its forward runs once and autograd sums the readers' gradients before the one
/// reduction back (q, k and v's projections reading one normalized hidden state). Each reader's
/// edge prices the whole redistribution, so summed over the edges it would be paid once per
/// reader. A group holds the edges from one value's producer to its op readers (not a parameter's,
/// re-gathered per reader in backward; not a tensor list's or a buffer written in place, which are
/// never redistributed); a key is an (input placement, gradient placement) that two or more of
/// them can read at a price above 0, equal from every producer class on every edge.
struct SharedReads {
  uint32_t src = 0;             // the producer's problem node
  std::vector<uint32_t> edges;  // problem edges from it to the readers, in edge order
  /// Per edge, per destination class (ProblemEdge::dst_class's values): the key that class reads,
  /// or -1 when no other edge can read the same redistribution.
  std::vector<std::vector<int32_t>> key_of_class;
  uint32_t num_keys = 0;
};

struct GraphProblem {
  Problem problem;
  /// Per problem node: the graph node it stands for (invalid for output sinks).
  std::vector<ir::NodeId> graph_nodes;
  /// Per problem node: its strategies (leaf nodes and sinks: one output tuple, no inputs).
  /// Nodes with equal lists share one (enumerate's cache, leaves of one shape): see StrategyList.
  std::vector<strategy::StrategyList> strategies;
  /// Per problem edge: the consumer's input index it prices.
  std::vector<uint32_t> edge_input;
  /// Per problem node: the module path of its graph node ("" for sinks); drives layer clustering.
  std::vector<std::string> module_paths;
  double total_param_bytes = 0;
  // The resolved memory budget in bytes is problem.memory (see MemoryBudget::highOr).
  /// The values read by several op nodes, each read's edge priced whole (see SharedReads).
  std::vector<SharedReads> shared_reads;
};

/// Evaluates a choice for the graph problem: evaluate(gp.problem, choice), with a redistribution
/// that several readers of one value read (SharedReads) paid once.
double evaluate(const GraphProblem& gp, const std::vector<uint32_t>& choice);

/// Per problem edge: true where the edge reads a redistribution that an earlier edge of its
/// SharedReads reads under `choice` too (that edge pays for it; this one costs nothing).
std::vector<bool> paidByAnEarlierReader(const GraphProblem& gp,
                                        const std::vector<uint32_t>& choice);

/// Per group of gp.shared_reads, per key, per edge of the group: the share of the key's price a
/// read on that edge pays. A key's shares are >= 0 and sum to at most 1 over its edges.
using ReadShares = std::vector<std::vector<std::vector<double>>>;

/// Each key's price split evenly over the edges that can read it.
ReadShares evenReadShares(const GraphProblem& gp);

/// The problem of pairwise costs in which a read of a shared redistribution costs its share of the
/// price (`shares`); gp's nodes and edges, only costs changed, so the reductions work on it as on
/// gp. A redistribution that a choice reads on the edges R costs there the sum of R's shares
/// times its price, at most the price evaluate(gp, .) charges once: every choice costs there at
/// most evaluate(gp, .), so its optimum is a lower bound of evaluate(gp, .)'s (a Lagrangian
/// relaxation of "paid once when read"), and a choice whose readers' shares sum to 1 for every
/// redistribution it reads costs the same in both. shared_reads is left empty.
/// (An exact pairwise form, a node per shared redistribution, made or not, ties a value's readers
/// together and defeats the reductions: llama3_8b on 2x4 stopped at the 60 s time limit.)
GraphProblem withReadShares(const GraphProblem& gp, const ReadShares& shares);

/// Per group of gp.shared_reads, per key, per edge of the group: whether the edge reads that
/// redistribution under `choice`.
std::vector<std::vector<std::vector<bool>>> sharedReadsOf(const GraphProblem& gp,
                                                          const std::vector<uint32_t>& choice);

/// Every placement tuple of a tensor on the mesh: per mesh dim R or S(d), pruned where a dim would
/// be cut into more pieces than it has elements. Deterministic order, all-Replicate first.
std::vector<mesh::PlacementTuple> leafPlacements(const ir::TensorMeta& t,
                                                 const mesh::DeviceMesh& m);

/// The gradient placement of input `i` under strategy `s`: cost::gradientPlacement with the
/// strategy's own split (apc/cost/edge.h, the one definition lowering uses too).
mesh::PlacementTuple gradientPlacement(const strategy::Strategy& s, size_t input);

/// The graph as it computes under a mixed precision policy (apc/cost/edge.h; lowering and the
/// memory model use it without the solver).
using cost::computeGraph;

/// Builds the problem (see the file comment). `g` is the model as stored (its parameter dtypes
/// define the memory bound); `strategies` may have been enumerated on computeGraph(g, ...). The
/// problem shares their lists (StrategyList), and the nodes of one list share the placement
/// classes of their edges, so the work per repeated layer is a few lookups.
/// Errors: a pin that names no node or module of `g`, a module pin with no tensor output, a pin
/// whose shard dim is out of range for a module output, an input placement the mesh cannot cut;
/// ErrorCode::kDeadline when `deadline` passes while the edges are priced (checked per edge).
Expected<GraphProblem> buildGraphProblem(const ir::Graph& g,
                                         const std::vector<strategy::NodeStrategies>& strategies,
                                         const spec::Spec& spec, const Deadline& deadline = {});

/// How the clustered plan was checked against the unclustered problem (solve_graph_problem.cpp,
/// step 3; SolveGraphOptions::cluster). clusterCheckText says it in words.
enum class ClusterCheck {
  kNone,                   // no clusters (or the check was not run)
  kChainPlanMeetsBound,    // the chain relaxation's plan meets its bound: optimal (3a)
  kChainPlanUnproven,      // the chain relaxation's plan, no time for more (time limit)
  kMeetsBound,             // the clustered plan meets a bound (ReductionStats::check_bound)
  kBoundaryMeetsBound,     // the boundary layers re-solved (3b), then it meets a bound
  kVerifiedByLp,           // the unclustered LP bound proves it
  kVerifiedByIlp,          // the unclustered ILP with it as start proves it
  kVerifiedByElimination,  // the unclustered reduction left nothing: its expansion is optimal
  kResolved,               // the unclustered optimum was cheaper and is returned
  kNotProven,              // not proven; ReductionStats::check_why says why
};

/// The bound a kMeetsBound / kBoundaryMeetsBound plan meets.
enum class CheckBound { kNone, kChain, kFoldedLp };

/// Sizes of the problem handed to CBC, before and after reduction.
struct ReductionStats {
  size_t nodes_before = 0, edges_before = 0, strategies_before = 0;
  size_t nodes_after = 0, edges_after = 0, strategies_after = 0;
  size_t clusters = 0;  // repeated-layer clusters whose variables were tied
  size_t dominated =
      0;  // strategies dropped as dominated (solve_graph_problem.cpp, 1c) before the ILP
  size_t unsupported = 0;  // strategies dropped for an edge that allows none of them (1a)
  ClusterCheck cluster_check = ClusterCheck::kNone;
  CheckBound check_bound = CheckBound::kNone;
  std::string check_why;  // with kNotProven: the status or the size that stopped the check
  double cluster_check_seconds = 0;  // time of that check (reduction, LP, any ILP)
  // The folded bound of the check (solve_graph_problem.cpp, step 3a), a lower bound on every plan;
  // none when it was not computed (no clusters, too few tied instances, no time).
  std::optional<double> folded_bound;
  // Step 0 (lib/solver/memory_search.h), when a memory row binds in part: the memory-free
  // subproblems it solved and the search nodes it expanded; 0 when it did not run. When it proved
  // its plan, the sizes "after" are those of the problem it searched (steps 1-2, the row kept).
  size_t memory_subproblems = 0;
  size_t memory_branches = 0;
  // When step 0 did not prove its plan: the memory (row units, of the full problem) of the root's
  // hull plan that meets the row (MemorySearchResult::hull), 0 when none. A row at exactly this
  // memory is proven at step 0's root (the plan minimizes cost + lambda x memory): callers whose
  // bound is a choice of theirs (the device-memory loop) solve again at it.
  double memory_hull = 0;
  // When step 0 stopped at a tightened row (SolveGraphOptions::memory_tighten_within): that row's
  // high, in the full problem's units; the plan is optimal for it (0: not tightened).
  double memory_tightened = 0;
};

struct SolveGraphOptions {
  SolverOptions solver;
  bool reduce = true;  // exact elimination of followers and leaves before the ILP
  // Tie the variables of repeated layers (with reduce) to find a plan fast, then prove it or
  // improve it on the unclustered problem; this does not restrict the optimum. First of all, with
  // `chain`, the chain relaxation (lib/solver/chain_bound.h) is solved: its plan, when it meets
  // the relaxation's bound, is an optimum and is returned without the tied problem (the common
  // case: llama3_8b on 2x2x2 and 8x8x8). Otherwise its bound is the first one the clustered plan
  // is checked against. The tied problem
  // alone only searches plans that are the same in every layer, and an uneven plan can be cheaper
  // (llama_small on [4] at the default 1/4: 6.98 us with 4 and with 8 layers, where the unreduced
  // optimum differs in the boundary layers; on earlier versions also 5% on mlp_stack 2x4 at
  // high = 0.126 and 3% on gpt2_tiny 8x8 at 0.0157, now equal there). So the clustered plan
  // is checked against a lower bound: first the folded LP bound, whose size follows the distinct
  // layers (the first and last layer apart, the middle ones aggregated), after re-choosing the
  // first and last layers (lib/solver/solve_graph_problem.cpp, steps 3a-3b); failing that, the LP
  // bound of the unclustered reduced problem: when the plan meets a bound it is optimal and
  // returned; otherwise the unclustered problem is solved with the clustered plan as incumbent
  // (step 3; ReductionStats::cluster_check says which). The result is an optimum of the full
  // problem either way (or comes with its proven gap when the time limit or the size of the
  // unclustered LP stops the check). (An earlier option left the first and last layer untied; the
  // check replaces it: it is exact in every case, and the ILP keeps one copy of a layer.)
  bool cluster = true;
  // Run that check (default). Off, the tied problem's plan is returned unproven: an upper bound on
  // the optimum, for callers that only need one (the quality test: a clustered plan no dearer than
  // a baseline implies the optimum is no dearer either).
  bool prove_cluster = true;
  // The chain relaxation first (see `cluster`); off in tests of the paths after it.
  bool chain = true;
  // The check starts with the folded bound (solve_graph_problem.cpp, steps 3a-3b) when the
  // unclustered problem has at least this many nodes per folded node; below, the folded LP would be
  // most of the unclustered one (llama_small_4l on 2x2x2, 4 layers, 1.3: the folded LP and the
  // boundary re-solve took about as long as the unclustered check, which then still ran).
  double fold_min_ratio = 2.0;
  // Step 0 (lib/solver/memory_search.h) for a memory row that binds in part: at most this many
  // memory-free subproblems (and a quarter of the time left); 0 turns it off (tests compare the
  // two paths).
  size_t memory_search_subproblems = 2000;
  // Step 0 searches the unclustered problem; with repeated layers that do not reduce away, its
  // size follows the number of layers (DeepSeek-V3 on 8x8x8: 37.9 M columns, 90 s, 12 GB). When
  // the tied problem after steps 1-2, scaled by the nodes per tied node, has more columns than
  // this, step 0 is skipped and the ILP path (clustering and its check) takes the row
  // (solve_graph_problem.cpp, memorySearchTooLarge). Tests lower it.
  double memory_search_max_columns = 3e6;
  // When step 0 does not prove its plan: return its best plan (status time_limit, its bound)
  // instead of going on to the ILP path (which keeps the rest of the time and rarely closes what
  // step 0 left; llama3_8b at [16,2048] on 8x8 with a 1.5 GiB row: 95 s to a 0.07% gap). Only
  // when step 0 found a plan that meets the row.
  bool memory_search_only = false;
  // Step 0 may stop at its root with a plan proven optimal for a row slightly below the one asked
  // (memorySearch's tighten_within; ReductionStats::memory_tightened): at most this fraction of
  // the plan's cost given up against the row asked. 0: never. For callers whose bound is an
  // estimate of their own (the device-memory loop).
  double memory_tighten_within = 0;
};

/// Repeated-layer clustering: nodes whose module paths are `<prefix>.<i>.<rest>` (the first numeric
/// component names the layer instance, as in `layers.3.attention.wq`) are grouped by instance; the
/// instances of one prefix whose nodes match one by one (same module suffix, same strategies and
/// costs, no pins) are tied to the first of them. Returns, per node, its
/// representative (itself when not tied), and the number of clusters (prefixes with at least two
/// tied instances). `instance` receives, per node, the position of its instance among the tied
/// instances of its prefix in graph order (0 for the representatives' instance and untied nodes);
/// `cluster` receives, per node, the index of its cluster (kNoCluster for untied nodes).
std::vector<uint32_t> repeatedLayerRepresentatives(const GraphProblem& gp,
                                                   size_t* clusters = nullptr,
                                                   std::vector<uint32_t>* instance = nullptr,
                                                   std::vector<uint32_t>* cluster = nullptr);
inline constexpr uint32_t kNoCluster = UINT32_MAX;

/// The problem with every node replaced by its representative: costs and memory summed over the
/// tied nodes, parallel edges summed, edges inside one representative folded onto its diagonal.
/// `index` receives, per node of `full`, its node in the quotient.
Problem quotientProblem(const Problem& full, const std::vector<uint32_t>& rep,
                        std::vector<uint32_t>& index);

/// The check in words ("clustered solution verified by the folded LP bound", "re-solved without
/// clustering", ...); empty for kNone.
std::string clusterCheckText(const ReductionStats& stats);

/// Solves a GraphProblem; when `reduce` is set the ILP sees the reduced problem and the returned
/// choice is expanded back to every node of `gp.problem` (its objective is evaluated on the full
/// problem).
Expected<Solution> solveGraphProblem(const GraphProblem& gp, const SolveGraphOptions& options = {},
                                     ReductionStats* stats = nullptr);

}  // namespace apc::solver
