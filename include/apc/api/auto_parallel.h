//===- apc/api/auto_parallel.h - The C++ AutoParallel API ------------------===//
//
// The C++ face of the planner, named after the Python AutoParallel API (meta-pytorch/autoparallel)
// so that a user of one can read the other:
//
//   apc::AutoParallel ap("model.pt", {"x:f32[B=512,128,1024]"}, mesh, mp_policy);
//   ap.add_input_constraints({"S(0),R"});         // one entry per forward input; nullopt: free
//   ap.add_output_constraints({"S(0),R"});        // flat leaves, or a spec::OutputPlacementTree
//   ap.add_parameter_memory_constraint(0, 1.0);   // fractions of all parameter bytes per rank
//   ap.sharding_optimizer().apply_prefetch_discount(0.5);
//   apc::Expected<apc::plan::Plan> plan = ap.optimize_placement(/*verbose=*/true);
//   ap.sharding_optimizer().print_costs_for_node("up.weight");  // like `apc explain --node`
//   apc::Expected<apc::AppliedPlacement> applied = ap.apply_placement(*plan);  // per-rank programs
//   applied->write_artifact("out/toy_block_2x4");                            // for the runtime
//
// It runs the same stages as `apc plan` (import, lib/planner's buildProblem and solveAndPlan), so
// the same model, inputs, mesh and constraints give the byte-identical plan (plan::toJsonText).
//
// Errors. Every fallible call returns apc::Expected<T> or apc::Status (support/error.h) with a
// one-line message; nothing throws and nothing aborts on user input. The constructor does no work
// that can fail: the model is imported on the first call that needs it (any add_* constraint call
// or optimize_placement), and an import error is returned from that call (and from every later
// one).
//
// Differences from the Python API, all on purpose:
// - The model is a TorchScript file (or an already imported ir::Graph), the inputs are shape
//   specs (`name:dtype[d0,B=8]`, as `apc plan --input`) or frontend::InputSpec values (see
//   apc/api/tensor_input.h to make them from sample tensors); an input without a name is the
//   forward argument at its position.
// - There is no context manager: the object is ready after construction.
// - optimize_placement returns a plan::Plan (placements per node and parameter, costs, solver
//   stats) rather than a dict of OpSpecs. With verbose it writes the optimizer log and the
//   summary to AutoParallelOptions::log (std::cout when null), like `apc plan --verbose`.
// - apply_placement does not build a parallel module: it lowers the plan to one program per rank
//   (lib/lower: local shapes, redistributions with their gradients), which the runtime loads from
//   the artifact directory that AppliedPlacement::write_artifact writes (as `apc lower` does).
// - The mixed precision policy prices the plan as FSDP2 runs it (all-gathers in param_dtype,
//   gradient reductions in reduce_dtype, compute in param_dtype; see solver/graph_problem.h).
//   `dynamic` is recorded in the plan's spec (and its content hash) only: the planner prices the
//   shapes it is given, so plan with the largest batch you will run.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstddef>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "apc/frontend/input_spec.h"
#include "apc/ir/graph.h"
#include "apc/mesh/device_mesh.h"
#include "apc/mesh/placement.h"
#include "apc/plan/plan.h"
#include "apc/planner/pipeline.h"
#include "apc/report/diff.h"
#include "apc/report/explain.h"
#include "apc/spec/spec.h"
#include "apc/support/error.h"

namespace apc {
namespace proto {
class Program;  // apc.pb.h
}  // namespace proto

/// The model to plan: a TorchScript archive (imported on first use) or an imported graph.
class ModelSource {
 public:
  ModelSource(std::string path) : path_(std::move(path)) {}  // NOLINT: implicit by design
  ModelSource(const char* path) : path_(path) {}             // NOLINT
  ModelSource(ir::Graph graph)                               // NOLINT
      : graph_(std::make_shared<const ir::Graph>(std::move(graph))) {}

  bool isFile() const { return graph_ == nullptr; }
  const std::string& path() const { return path_; }  // empty for a graph
  const ir::Graph* graph() const { return graph_.get(); }

 private:
  std::string path_;
  std::shared_ptr<const ir::Graph> graph_;
};

/// One forward input's shape and dtype: the `--input` text (`tokens:i64[8,128]`, `x:f32[B=8,16]`)
/// or an InputSpec. Text without a name (`f32[8,16]`) and an InputSpec with an empty name stand
/// for the forward argument at their position in the list.
class InputArg {
 public:
  InputArg(std::string text) : text_(std::move(text)) {}          // NOLINT: implicit by design
  InputArg(const char* text) : text_(text) {}                     // NOLINT
  InputArg(frontend::InputSpec spec) : spec_(std::move(spec)) {}  // NOLINT

  /// The parsed spec (parse errors name the text).
  Expected<frontend::InputSpec> resolve() const;

 private:
  std::optional<std::string> text_;
  std::optional<frontend::InputSpec> spec_;
};

/// A placement tuple to constrain something to, or no constraint (the default, or nullopt).
/// Text ("S(0),R", "[S(0), R]") is parsed when the constraint is added.
class Placements {
 public:
  Placements() = default;                                       // free
  Placements(std::nullopt_t) {}                                 // NOLINT: free
  Placements(mesh::PlacementTuple t) : tuple_(std::move(t)) {}  // NOLINT
  Placements(std::string text) : text_(std::move(text)) {}      // NOLINT
  Placements(const char* text) : text_(std::string(text)) {}    // NOLINT

  bool isFree() const { return !tuple_ && !text_; }
  /// nullopt when free; a parse error names the text.
  Expected<std::optional<mesh::PlacementTuple>> resolve() const;

 private:
  std::optional<mesh::PlacementTuple> tuple_;
  std::optional<std::string> text_;
};

/// Mixed precision: dtypes parameters are computed in, gradients reduced in, outputs cast to
/// (torch.distributed.fsdp.MixedPrecisionPolicy). Absent fields keep the model's dtypes.
using MixedPrecisionPolicy = spec::MixedPrecision;

/// Knobs that are flags of `apc plan`; the defaults are the tool's, so that the API and the tool
/// give the same plan.
struct AutoParallelOptions {
  std::string device = spec::kDefaultDeviceKind;  // cost model device: h100, h200, a100, b200, cpu
  bool dynamic = false;         // dim 0 of every input varies between calls (spec "dynamic_batch")
  double time_limit_s = 60;     // solver time limit (apc plan --time-limit)
  int threads = 1;              // solver threads; 1 is deterministic
  bool reduce = true;           // follow-merging + clustering (--no-reduce)
  std::ostream* log = nullptr;  // where optimize_placement(verbose) writes; null: std::cout
};

/// What apply_placement gives (Python: the parallel module): the plan and the program of every
/// rank (lower::lowerPlan), ready for the runtime.
///
/// The programs are protobuf messages (apc.pb.h); this header does not include the generated code,
/// so a user of the API needs neither it nor protobuf's headers (which LibTorch's wheel shadows):
/// include "apc.pb.h" to read a program.
struct AppliedPlacement {
  plan::Plan plan;

  /// The number of ranks, and the program of one (rank order).
  size_t num_ranks() const;
  const proto::Program& program(size_t rank) const;

  /// Writes the artifact directory (manifest.json and rank_<r>.apcp, artifact::writeArtifact) that
  /// the runtime loads; creates `dir` when missing.
  Status write_artifact(const std::string& dir) const;

 private:
  friend class AutoParallel;
  // Shared, not copied: an AppliedPlacement copies cheaply, and the messages' type can stay
  // incomplete here (the deleter is made where the programs are).
  std::shared_ptr<const std::vector<proto::Program>> programs_;
};

class AutoParallel;

/// The optimizer behind an AutoParallel (Python: `autop.sharding_optimizer`): the last solution,
/// why it chose what it chose, differences between solutions, and the prefetch discount. Owned by
/// its AutoParallel; valid as long as it.
class ShardingOptimizer {
 public:
  /// The plan of the last optimize_placement; an error before the first one.
  Expected<plan::Plan> get_solution() const;

  /// The optimizer log of the last plan (per node `placement=<in> -> <out>` and its (comm,
  /// compute) cost, then totals), as `apc plan --verbose` prints it.
  Expected<std::string> get_log() const;

  /// Every alternative strategy of one node of the last plan priced in the plan's context, with
  /// its status (CHOSEN, TIE, CHEAPER-HERE-BUT-COSTLIER-OVERALL, COSTLIER, UNAVAILABLE; see
  /// apc/report/explain.h). `node` is a plan node name: an input or parameter name, an op's output
  /// value name ("linear_1"), or "output %y". An unknown name is a kNotFound error that suggests
  /// close names.
  Expected<plan::NodeExplanation> explain_placement(const std::string& node) const;

  /// The graph-wide question (Python: explain_placement with a target placement): every node's
  /// chosen strategy against its cheapest strategy whose output is placed `target`, with the
  /// deltas and their node-local total (plan::explainTarget; `apc explain PLAN --target`).
  /// kInvalidArgument when `target` has not one entry per mesh dim.
  Expected<plan::TargetExplanation> explain_placement(const mesh::PlacementTuple& target) const;

  /// The text `apc explain PLAN --node NODE` prints: the node's alternatives (the table of one
  /// node, without the costliest-nodes list), then the collectives each communicating edge into
  /// the node runs in rank 0's lowered program with their mesh dims, bytes and priced times
  /// (apc/report/comm.h). Returned, not printed.
  Expected<std::string> print_costs_for_node(const std::string& node) const;
  /// The redistribution matrix of input `input` of `node` as `apc explain PLAN --node NODE
  /// --matrix --input K` prints it: the planner's price from each producer output placement
  /// (rows) to each placement the node's strategies need (columns), the plan's pair marked.
  Expected<std::string> print_costs_for_node(const std::string& node, uint32_t input) const;

  /// Nodes and parameters whose placements differ between two plans, with the cost delta of each
  /// and in total (apc/report/diff.h; plan::diffText prints it as `apc diff` does).
  plan::PlanDiff diff_solutions(const plan::Plan& a, const plan::Plan& b) const;

  /// Scales the cost of prefetchable communication by `scale` in [0, 1] for the following
  /// optimize_placement calls (0: fully overlapped with compute, 1: no discount, the default).
  /// Prefetchable, as in the Python optimizer: the edges whose producer is parameter-derived (a
  /// parameter, or an op all of whose tensor inputs are parameter-derived, like a transposed
  /// weight). Their cost is the whole communication of the parameter: the all-gather before use,
  /// the re-gather for backward and the gradient's reduce-scatter or all-reduce, all of which can
  /// be overlapped with other layers' compute. The scale becomes the planned spec's
  /// "prefetch_discount" (plan::applyPrefetchDiscount scales those edges' cost matrices before the
  /// solve; `apc plan --prefetch-discount` does the same), so the plan's costs (comm_us, totals,
  /// objective) are the discounted ones, its content hash covers the scale, and `apc explain`
  /// prices alternatives with it. The discount can only lower the optimal objective, never raise
  /// it. A scale outside [0, 1] is a kInvalidArgument error.
  Status apply_prefetch_discount(double scale);

  /// The scale set by apply_prefetch_discount (1 when none).
  double prefetch_discount() const { return prefetch_scale_; }
  /// How many problem edges the last optimize_placement discounted (0 without a discount).
  size_t discounted_edges() const;

 private:
  friend class AutoParallel;
  explicit ShardingOptimizer(const AutoParallel* owner) : owner_(owner) {}
  const AutoParallel* owner_;
  double prefetch_scale_ = 1.0;
};

class AutoParallel {
 public:
  /// Stores the arguments; nothing is imported or checked until a call needs it (see the file
  /// comment). `inputs` override the shapes recorded in the archive (empty: the recorded ones);
  /// for an imported graph they must match its inputs.
  AutoParallel(ModelSource model, std::vector<InputArg> inputs, mesh::DeviceMesh mesh,
               std::optional<MixedPrecisionPolicy> mp_policy = std::nullopt,
               AutoParallelOptions options = {});
  AutoParallel(const AutoParallel&) = delete;
  AutoParallel& operator=(const AutoParallel&) = delete;
  ~AutoParallel();

  /// The imported model (imports it on the first call).
  Expected<const ir::Graph*> graph();

  /// Fixed placements of the forward inputs, one entry per input in order (fewer entries leave
  /// the rest free); a free input is Replicate on every mesh dim, as in AutoParallel. Errors: a
  /// second call, more entries than inputs, a tuple whose length is not the mesh's ndim, a shard
  /// dim beyond the input's rank, malformed text.
  Status add_input_constraints(const std::vector<Placements>& constraints);

  /// Fixed placements of the forward outputs in their structure (tuples and lists as sequences,
  /// dicts by key; free leaves unconstrained). Errors: a second call, a structure that differs
  /// from the model's outputs, bad tuples as for inputs.
  Status add_output_constraints(const spec::OutputPlacementTree& constraints);
  /// The same with the output leaves flattened depth first (one entry per leaf, like
  /// Python's flattened out_shardings); a single-output model takes one entry.
  Status add_output_constraints(const std::vector<Placements>& leaves);

  /// Parameter memory per rank, low <= bytes / all parameter bytes <= high. Defaults as in the
  /// Python API: low 0, high 1 / world size; high = 1 allows full replication. Errors: low < 0,
  /// high outside (0, 1], low > high (naming both). A later call replaces an earlier one.
  Status add_parameter_memory_constraint(std::optional<double> low = std::nullopt,
                                         std::optional<double> high = std::nullopt);

  /// Memory per device in bytes: optimize_placement then gives the fastest plan whose predicted
  /// peak per rank (parameters, gradients, `optimizer`'s state, saved activations, transient
  /// buffers; apc/plan/memory.h) fits, as `apc plan --device-memory` does. Replaces the parameter
  /// memory constraint (and a later add_parameter_memory_constraint replaces this). Errors: bytes
  /// < 1, an optimizer other than "sgd", "momentum" or "adamw".
  Status add_device_memory_constraint(int64_t bytes, const std::string& optimizer = "adamw");

  /// Activation checkpointing, as `apc plan --checkpoint` (apc/planner/checkpointing.h): "auto"
  /// (the default: chosen per repeated module only when the device memory constraint needs it),
  /// "none", "all", or a comma-separated list of modules. Errors: a module that cannot be
  /// checkpointed (named, with the candidates).
  Status set_activation_checkpointing(const std::string& modules);

  /// Pins the output placement of one node (plan node name, as explain_placement takes it), like
  /// a spec's "pins". An unknown node is a kNotFound-like error naming it.
  Status add_node_constraint(const std::string& node, const Placements& placements);

  /// Builds the problem from the constraints so far and solves it (lib/planner's buildProblem and
  /// solveAndPlan with the options' solver settings). Errors: import and constraint errors,
  /// kInfeasible with the solver's diagnosis (which constraint group, the smallest feasible
  /// memory high). May be called again (after more constraints or a prefetch discount).
  Expected<plan::Plan> optimize_placement(bool verbose = false);

  /// A classic plan priced by the same model, for comparison with diff_solutions: "ddp", "fsdp"
  /// (ZeRO-3), "tp" (Megatron on the last mesh dim) or "fsdp+tp" (2-d meshes), as
  /// `apc plan --strategy` makes it (same bytes): the baseline's parameter placements pinned, the
  /// rest of the graph optimized around them, free inputs batch-sharded on the data dims. The
  /// memory constraint does not apply (a classic plan defines its own parameter memory); the
  /// other constraints and a prefetch discount do. Does not change the last solution. Errors: an
  /// unknown name (listing the known ones), fsdp+tp on a 1-d mesh, and as optimize_placement.
  Expected<plan::Plan> baseline_placement(const std::string& strategy);

  /// Applies a plan: checks that it was made for this model, input shapes and mesh, then lowers it
  /// to one program per rank (lower::lowerPlan; its errors name the node). The plan may come from
  /// optimize_placement or from a file (plan::readPlanFile) made by `apc plan` for this model.
  Expected<AppliedPlacement> apply_placement(const plan::Plan& sharding_placement);
  /// The same with the last optimize_placement's plan.
  Expected<AppliedPlacement> apply_placement();

  ShardingOptimizer& sharding_optimizer() { return optimizer_; }
  const ShardingOptimizer& sharding_optimizer() const { return optimizer_; }

  /// The spec the next optimize_placement uses (mesh, device, constraints, mixed precision).
  const spec::Spec& spec() const { return spec_; }

 private:
  friend class ShardingOptimizer;
  struct State;  // the imported graph, the last problem and plan
  struct Solved {
    plan::BuiltProblem built;  // with the discount applied
    plan::Plan plan;
  };

  Status ensureGraph();
  /// Builds and solves the problem of spec_ (or of a baseline's spec), applying the discount.
  Expected<Solved> solve(const std::optional<std::string>& baseline, bool verbose);
  Status checkTuple(const mesh::PlacementTuple& t, const std::string& what) const;

  ModelSource model_;
  std::vector<InputArg> inputs_;
  AutoParallelOptions options_;
  spec::Spec spec_;
  std::string checkpoint_ = "auto";
  bool input_constraints_set_ = false;
  bool output_constraints_set_ = false;
  std::unique_ptr<State> state_;
  ShardingOptimizer optimizer_{this};
};

/// One sample input of the short path: its shape and dtype and, like a DTensor sample in Python,
/// optionally its placements (absent: Replicate on every mesh dim).
struct SampleInput {
  SampleInput(InputArg input, Placements placements = {})  // NOLINT: implicit by design
      : input(std::move(input)), placements(std::move(placements)) {}
  InputArg input;
  Placements placements;
};

/// The short path (Python: `autoparallel.auto_parallel`): AutoParallel with the sample inputs'
/// shapes and placements as input constraints, `out_shardings` as output constraints (a free tree
/// leaves outputs unconstrained), the memory budget when given (low, high), `dynamic` marking the
/// batch dim of every input dynamic (spec "dynamic_batch"), then optimize_placement and
/// apply_placement. Errors as in AutoParallel.
Expected<AppliedPlacement> auto_parallel(
    const ModelSource& model, const mesh::DeviceMesh& mesh,
    const std::vector<SampleInput>& sample_inputs,
    const spec::OutputPlacementTree& out_shardings = spec::OutputPlacementTree::makeFree(),
    std::optional<MixedPrecisionPolicy> mp_policy = std::nullopt,
    std::optional<std::pair<double, double>> parameter_memory_budget = std::nullopt,
    bool dynamic = false, const AutoParallelOptions& options = {});

}  // namespace apc
