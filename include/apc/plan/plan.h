//===- apc/plan/plan.h - The plan: chosen strategies, costs, solver stats --===//
//
// A Plan is what `apc plan` writes: per problem node the chosen strategy with its placements and
// costs, per parameter its placement and bytes per rank, the totals, the solver's statistics, and
// where it came from (apc version, model name, path and hash, the input shapes, the effective
// spec) and the planned graph itself, so that explaining and lowering a plan need no model file. It
// is made from a solved GraphProblem (makePlan, apc/planner/pipeline.h), written as canonical JSON
// (toJsonText) and read back (planFromJson, readPlanFile). schemas/plan.schema.json describes the
// JSON.
//
// Costs. A node's compute_us is its chosen strategy's compute cost (forward + backward); its
// comm_us is the sum of the chosen costs of its in-edges (the forward redistribution of each input
// into the placement the strategy needs plus the gradient's way back, as the solver priced them);
// cost_us = compute_us + comm_us. Summed over nodes they give the totals, and total_us equals the
// solver's objective evaluated on the full (unreduced) problem.
//
// Determinism. The same inputs give byte-identical files: objects are written with sorted keys,
// nodes in problem order (graph order, output sinks last), parameters in graph order, every real
// number rounded to 12 significant digits (canonicalNumber) before it is written, and nothing that
// varies between runs is stored: the solver's wall time is written as `"seconds": null` (the
// printed summary and `apc plan --timings-json` carry the times). The `content_hash` is the
// SHA-256 of the apc version, the model file's SHA-256, the input shapes, the canonical JSON of
// the effective spec, the reduce option (contentHash) and the chosen strategies; two plans with
// the same hash were made from the same inputs and place every node alike (--threads or
// --time-limit change the hash only when they change a placement). planFromJson recomputes it
// (planContentHash) and refuses a file whose content does not hash to it; what the hash does not
// cover (placements, the carried graph) is checked against the graph by verifyPlan
// (apc/planner/verify.h) and `apc validate`. Byte identity also needs a deterministic solve: the
// default single-thread CBC run is; with --threads > 1 CBC may return a different optimum of
// equal cost.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "apc/ir/graph.h"
#include "apc/spec/spec.h"
#include "apc/support/error.h"

namespace apc::plan {

/// Version of the plan JSON layout; planFromJson rejects other versions.
inline constexpr int kPlanFormatVersion = 1;

/// The apc version ("0.2.0"), from the CMake project version.
const char* apcVersion();

/// Placements are typed in memory (mesh::PlacementTuple: one Placement per mesh dim); the plan
/// JSON writes each as its text ("S(0)", "R", "P") and planFromJson parses them back.
using mesh::PlacementTuple;

/// Where a plan came from: enough to build its problem again (apc explain --node).
struct PlanSource {
  std::string model_path;    // as given to `apc plan`
  std::string model_name;    // the graph's name (the file stem)
  std::string model_sha256;  // SHA-256 of the model file's bytes, lowercase hex
  /// The forward inputs as planned, in the `--input` syntax ("tokens:i64[8,128]", "x:f32[B=8,16]").
  std::vector<std::string> inputs;

  bool operator==(const PlanSource&) const;  // defaulted in the .cpp (C++17 users)
};

/// The forward inputs of a graph in the `--input` syntax, in graph order.
std::vector<std::string> inputShapes(const ir::Graph& g);

/// One chosen in-edge of a node.
struct PlanEdge {
  uint32_t from = 0;   // the producing plan node
  uint32_t input = 0;  // the consumer's input index
  double cost_us = 0;  // forward + backward redistribution at the chosen pair

  bool operator==(const PlanEdge&) const;  // defaulted in the .cpp (C++17 users)
};

struct PlanNode {
  /// Input/parameter/buffer name, the op's first output value name (`%linear_1` is "linear_1"),
  /// "output %y" for an output sink or "pin %y" for a pin sink (see apc/solver/graph_problem.h).
  /// These are the names spec pins and `apc explain --node` use.
  std::string name;
  std::string kind;         // "input", "parameter", "buffer", "op", "output" or "pin"
  std::string op;           // "aten::linear" (qualified), or the kind for the other nodes
  std::string module_path;  // "layers.0.attention.wq"; empty at the top level
  std::optional<uint32_t> graph_node;  // index in the graph; absent for output sinks
  uint32_t strategy_index = 0;         // the chosen strategy, among num_strategies
  uint32_t num_strategies = 0;
  std::string strategy;  // Strategy::toString of the chosen one ("S(0)R,RS(0) -> S(0)S(0)")
  /// Per node input / output: the placement, or nullopt for non-tensor ones (ints, None).
  std::vector<std::optional<PlacementTuple>> input_placements;
  std::vector<std::optional<PlacementTuple>> outputs;
  std::vector<PlanEdge> in_edges;  // in problem edge order
  double compute_us = 0;
  double comm_us = 0;     // sum of in_edges' cost_us
  double cost_us = 0;     // compute_us + comm_us
  std::string pin_group;  // the constraint group that pins it ("inputs", "outputs"), else empty

  /// The placement of the first tensor output (empty when there is none).
  PlacementTuple outputPlacements() const;
  bool operator==(const PlanNode&) const;  // defaulted in the .cpp (C++17 users)
};

struct PlanParameter {
  std::string name;            // as named_parameters() gives it
  std::string module;          // the name up to its last '.'; empty at the top level
  std::vector<int64_t> shape;  // global sizes
  std::string dtype;           // "f32", "bf16", ...
  PlacementTuple placement;
  int64_t bytes = 0;           // the whole tensor
  int64_t bytes_per_rank = 0;  // the largest local piece
  uint32_t node = 0;           // its plan node

  bool operator==(const PlanParameter&) const;  // defaulted in the .cpp (C++17 users)
};

struct PlanTotals {
  double compute_us = 0;
  double comm_us = 0;
  double total_us = 0;  // compute_us + comm_us + recompute_us
  /// Activation checkpointing's extra forward in backward (Plan::checkpoint; 0 without).
  double recompute_us = 0;
  int64_t param_bytes_per_rank = 0;  // what the memory bound counts for the chosen placements
  int64_t param_bytes_total = 0;     // every parameter, unsharded
  double param_memory_fraction = 0;  // per rank / total (0 without parameters)
  double memory_low = 0;             // the effective budget, as fractions of param_bytes_total
  double memory_high = 1;

  bool operator==(const PlanTotals&) const;  // defaulted in the .cpp (C++17 users)
};

/// What one rank holds at a point of the step, in bytes.
struct MemoryParts {
  int64_t parameters = 0;       // local shards, stored dtype
  int64_t buffers = 0;          // local shards
  int64_t inputs = 0;           // the forward's tensor inputs, local
  int64_t optimizer_state = 0;  // optimizer buffers (after the first step)
  int64_t activations = 0;      // saved for backward and still held
  int64_t gradients = 0;        // parameter gradients made so far
  int64_t transient = 0;        // live values, redistributed copies, gradients in flight

  int64_t total() const {
    return parameters + buffers + inputs + optimizer_state + activations + gradients + transient;
  }
  bool operator==(const MemoryParts&) const;  // defaulted in the .cpp (C++17 users)
};

/// The predicted memory of one rank over a training step (apc/plan/memory.h).
struct MemoryEstimate {
  std::string optimizer;          // as memoryOptimizers() names it
  int64_t peak_bytes = 0;         // the largest total over the step
  std::string phase;              // where the peak is: "forward", "backward" or "optimizer"
  std::string at;                 // the plan node at the peak ("" for the optimizer step)
  MemoryParts at_peak;            // what the peak is made of
  int64_t saved_activations = 0;  // everything saved for backward at the end of the forward
  int64_t persistent_bytes = 0;   // parameters + buffers + inputs + optimizer state
  /// The largest total in each phase of the step (the loss: apc-train's, outside the program).
  int64_t forward_peak = 0, loss_peak = 0, backward_peak = 0, optimizer_peak = 0;
  /// Saved activation bytes by the op that saves them (qualified op name), largest first.
  std::vector<std::pair<std::string, int64_t>> saved_by_op;

  bool operator==(const MemoryEstimate&) const;  // defaulted in the .cpp (C++17 users)
};

/// The sizes of the problem a plan was solved on, before and after the solver's reductions (the
/// part of solver::ReductionStats a plan records).
struct ProblemSizes {
  size_t nodes_before = 0, edges_before = 0, strategies_before = 0;
  size_t nodes_after = 0, edges_after = 0, strategies_after = 0;
  size_t clusters = 0;  // repeated-layer clusters whose variables were tied
  // The memory search's (solver step 0) memory-free subproblems and search nodes; 0 when it did
  // not run.
  size_t memory_subproblems = 0;
  size_t memory_branches = 0;

  bool operator==(const ProblemSizes&) const;  // defaulted in the .cpp (C++17 users)
};

/// How the solve that made a plan ended (solver::SolveStatus, which the plan library does not
/// include, or a classic plan's), typed: code compares these, never text. Its JSON text is
/// solver::statusName's ("optimal", "time_limit", "feasible") or "baseline <name>".
enum class PlanStatus : uint8_t {
  kOptimal,    // proven optimal (within the solver's tolerance)
  kTimeLimit,  // stopped by the time limit or a size limit: the best plan found, with its bound
  kFeasible,   // a plan without proof
  kBaseline,   // a classic plan (SolverStats::baseline): its parameters pinned, priced, not solved
};

struct SolverStats {
  PlanStatus status = PlanStatus::kOptimal;
  double objective = 0;
  std::optional<double> bound;  // the best proven lower bound; nullopt when none is finite
  int64_t variables = 0;
  int64_t constraints = 0;
  ProblemSizes sizes;  // problem sizes before and after reduction
  // The options that shaped the result (part of the content hash).
  double time_limit_s = 0;
  int threads = 1;
  bool reduce = true;
  /// The classic plan this is ("ddp", "fsdp", "tp", "fsdp+tp": apc plan --strategy, its parameters
  /// pinned by solver::applyBaseline, status "baseline <name>"); empty for the optimizer's plan.
  std::string baseline;

  bool operator==(const SolverStats& o) const;
  /// The status as the plan's JSON writes it: "optimal", "time_limit", "feasible" or
  /// "baseline <name>".
  std::string statusText() const;
  /// Whether the plan was solved (not a baseline) and not proven optimal.
  bool unproven() const {
    return status == PlanStatus::kTimeLimit || status == PlanStatus::kFeasible;
  }
};

/// statusText's words back: the status and, for "baseline <name>", the name. Errors: any other
/// text (kInvalidArgument naming what is accepted).
Expected<std::pair<PlanStatus, std::string>> parsePlanStatus(const std::string& text);

struct Plan {
  int format_version = kPlanFormatVersion;
  std::string apc_version;
  std::string content_hash;  // see contentHash
  PlanSource model;
  spec::Spec spec;  // the effective spec: --spec with the command line's overrides applied
  std::vector<PlanNode> nodes;
  std::vector<PlanParameter> parameters;
  PlanTotals totals;
  SolverStats solver;
  /// The graph the plan was made on, as ir::serializeGraph writes it (the JSON holds its base64
  /// under "graph"): `apc explain` and `apc lower` work from it without the model file or an
  /// import. Empty in a plan read from a file without one (the model is imported again then).
  std::string graph_bytes;
  /// The predicted memory of one rank over a training step under each optimizer of
  /// memoryOptimizers() (apc/plan/memory.h), in that order; empty in a plan read from a file
  /// without it.
  std::vector<MemoryEstimate> memory;
  /// Activation checkpointing: the modules whose forward backward runs again instead of keeping
  /// their saved activations (ir::checkpointRange), in node order. Empty: none.
  std::vector<std::string> checkpoint;

  /// The estimate for `optimizer`, or nullptr.
  const MemoryEstimate* memoryFor(std::string_view optimizer) const;
  bool operator==(const Plan&) const;  // defaulted in the .cpp (C++17 users)
};

/// The graph a plan was made on (its graph_bytes). A plan without one is a kNotFound error; bytes
/// that do not parse, or a graph whose inputs are not the plan's model inputs, an error naming
/// what differs.
Expected<ir::Graph> plannedGraph(const Plan& p);

/// SHA-256 (lowercase hex) of the apc version, source.model_sha256, source.inputs, the canonical
/// JSON of the spec, the reduce option (it defines the problem) and the baseline name when there
/// is one (so a baseline's hash differs from the optimizer's). Solver settings that act only
/// through the solution found (time limit, threads) are left out; makePlan
/// (apc/planner/pipeline.h) hashes this together with the chosen strategies, so plans with equal
/// placements for equal inputs have equal hashes.
std::string contentHash(const PlanSource& source, const spec::Spec& spec, bool reduce,
                        std::string_view baseline = {});

/// A plan's content_hash, the one computation makePlan makes and planFromJson checks: contentHash
/// of p.model, p.spec, p.solver.reduce and p.solver.baseline under the apc version the plan
/// records (p.apc_version), hashed together with every node's strategy_index in order.
std::string planContentHash(const Plan& p);

/// Rounds to 12 significant digits (the value that "%.12g" prints); idempotent, so a plan read
/// back and written again gives the same bytes. Non-finite values are returned unchanged (and
/// written as null).
double canonicalNumber(double x);

/// "12.35 us", "4.50 ms", "1.20 s".
std::string formatMicros(double us);

/// The plan as JSON (sorted keys, canonical numbers): toJsonText's text read back (one writer).
nlohmann::json toJson(const Plan& p);
/// The plan's "memory" object: per optimizer, the predicted peak and what it is made of.
nlohmann::json memoryJson(const Plan& p);
/// The canonical text of a plan: toJson laid out with two-space indents, short arrays of scalars
/// on one line, and a final newline. The bytes `apc plan -o` writes.
std::string toJsonText(const Plan& p);
/// Reads a plan; errors are one line starting with the JSON path (`$.nodes[3].cost_us: ...`).
Expected<Plan> planFromJson(const nlohmann::json& j);
/// Reads a plan file; errors are prefixed by the path.
Expected<Plan> readPlanFile(const std::string& path);
/// Writes toJsonText(p) to `path` atomically (a temporary beside it, renamed over it).
Status writePlanFile(const Plan& p, const std::string& path);

/// Writes `j` in the layout of toJsonText (for other deterministic files: explain, diff).
std::string canonicalText(const nlohmann::json& j);

}  // namespace apc::plan
