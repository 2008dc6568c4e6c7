//===- lib/api/auto_parallel.cpp - The C++ AutoParallel API ----------------===//
//
// AutoParallel keeps a spec::Spec that its add_* calls fill in, checking each constraint against
// the imported graph as it arrives; optimize_placement and baseline_placement hand the spec to
// plan::planGraph, the driver `apc plan` runs too (same checks, same messages, same bytes). A
// prefetch discount goes into the spec planned (spec "prefetch_discount", which apc plan
// --prefetch-discount sets).
//
//===----------------------------------------------------------------------===//
#include "apc/api/auto_parallel.h"

#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>

#include "apc/artifact/artifact.h"
#include "apc/frontend/model.h"
#include "apc/ir/proto_io.h"
#include "apc/lower/lower.h"
#include "apc/plan/memory.h"
#include "apc/planner/checkpointing.h"
#include "apc/planner/pipeline.h"
#include "apc/planner/verify.h"
#include "apc/report/comm.h"
#include "apc/report/report.h"
#include "apc/support/hash.h"
#include "apc/support/strings.h"

namespace apc {

namespace {

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string placementList(const mesh::PlacementTuple& t) {
  return "[" + mesh::toString(t) + "]";
}

/// Builds the output tree of `leaves` (depth first) in the structure of the graph's outputs.
spec::OutputPlacementTree treeOf(const ir::OutputTree& t,
                                 const std::vector<std::optional<mesh::PlacementTuple>>& leaves,
                                 size_t& next) {
  using Tree = spec::OutputPlacementTree;
  switch (t.kind) {
    case ir::OutputTree::Kind::kLeaf: {
      const auto& leaf = leaves[next++];
      return leaf ? Tree::makeLeaf(*leaf) : Tree::makeFree();
    }
    case ir::OutputTree::Kind::kTuple:
    case ir::OutputTree::Kind::kList: {
      std::vector<Tree> children;
      for (const ir::OutputTree& c : t.children) children.push_back(treeOf(c, leaves, next));
      return Tree::makeSequence(std::move(children));
    }
    case ir::OutputTree::Kind::kDict: {
      std::map<std::string, Tree> entries;
      for (size_t i = 0; i < t.children.size(); ++i)
        entries[t.keys[i]] = treeOf(t.children[i], leaves, next);
      return Tree::makeDict(std::move(entries));
    }
  }
  return Tree::makeFree();
}

/// Every placement tuple of an output tree, depth first.
void tuplesOf(const spec::OutputPlacementTree& t, std::vector<const mesh::PlacementTuple*>& out) {
  if (t.kind == spec::OutputPlacementTree::Kind::kLeaf) out.push_back(&t.placements);
  for (const auto& c : t.children) tuplesOf(c, out);
}

}  // namespace

// --- argument types ------------------------------------------------------------------------------

Expected<frontend::InputSpec> InputArg::resolve() const {
  frontend::InputSpec s;
  if (spec_) {
    s = *spec_;
  } else {
    const std::string& text = *text_;
    bool named = text.find(':') != std::string::npos;
    auto parsed = frontend::parseInputSpec(named ? text : "_:" + text);
    if (!parsed.ok()) return parsed.error().withContext("input '" + text + "'");
    s = std::move(parsed).value();
    if (!named) s.name.clear();
  }
  if (s.dtype == ir::DType::kUnknown)
    return invalidArgument("input '" + (s.name.empty() ? std::string("?") : s.name) +
                           "': unsupported dtype");
  return s;
}

Expected<std::optional<mesh::PlacementTuple>> Placements::resolve() const {
  if (tuple_) return std::optional<mesh::PlacementTuple>(*tuple_);
  if (!text_) return std::optional<mesh::PlacementTuple>();
  auto t = mesh::parsePlacementTuple(*text_);
  if (!t.ok()) return t.error().withContext("placements '" + *text_ + "'");
  return std::optional<mesh::PlacementTuple>(std::move(t).value());
}

// --- AutoParallel --------------------------------------------------------------------------------

struct AutoParallel::State {
  std::optional<ir::Graph> imported;  // the model imported from a file
  const ir::Graph* graph = nullptr;   // `imported` or the caller's graph
  plan::PlanSource source;
  std::optional<Error> import_error;        // a failed import, returned by every later call
  std::optional<plan::BuiltProblem> built;  // the last problem solved (discount applied)
  std::optional<plan::Plan> plan;           // its plan
};

AutoParallel::AutoParallel(ModelSource model, std::vector<InputArg> inputs, mesh::DeviceMesh mesh,
                           std::optional<MixedPrecisionPolicy> mp_policy,
                           AutoParallelOptions options)
    : model_(std::move(model)),
      inputs_(std::move(inputs)),
      options_(std::move(options)),
      state_(std::make_unique<State>()) {
  spec_.mesh = std::move(mesh);
  spec_.device = options_.device;
  spec_.dynamic_batch = options_.dynamic;
  if (mp_policy) spec_.mixed_precision = *mp_policy;
}

AutoParallel::~AutoParallel() = default;

Status AutoParallel::ensureGraph() {
  State& st = *state_;
  if (st.graph) return Status::success();
  if (st.import_error) return *st.import_error;
  auto fail = [&](Error e) -> Status {
    st.import_error = e;
    return e;
  };
  std::vector<frontend::InputSpec> specs;
  for (const InputArg& a : inputs_) {
    auto s = a.resolve();
    if (!s.ok()) return fail(s.error());
    specs.push_back(std::move(s).value());
  }
  if (model_.isFile()) {
    const std::string& path = model_.path();
    bool positional = false;
    for (const auto& s : specs) positional = positional || s.name.empty();
    if (positional) {
      auto recorded = frontend::recordedModelInputs(path);
      if (!recorded.ok()) return fail(recorded.error());
      for (size_t i = 0; i < specs.size(); ++i) {
        if (!specs[i].name.empty()) continue;
        if (i >= recorded->size())
          return fail(invalidArgument("input " + std::to_string(i) + " has no name and " + path +
                                      " has only " + std::to_string(recorded->size()) +
                                      " forward inputs"));
        specs[i].name = (*recorded)[i].name;
      }
    }
    frontend::ImportOptions options;
    options.inputs = specs;
    auto g = frontend::importModel(path, options);
    if (!g.ok()) return fail(g.error());
    auto sha = sha256File(path);
    if (!sha.ok()) return fail(sha.error());
    st.imported = std::move(g).value();
    st.graph = &*st.imported;
    st.source.model_path = path;
    st.source.model_sha256 = *sha;
  } else {
    const ir::Graph& g = *model_.graph();
    std::vector<ir::NodeId> graph_inputs = g.nodesOfKind(ir::NodeKind::kInput);
    for (size_t i = 0; i < specs.size(); ++i) {
      const frontend::InputSpec& s = specs[i];
      ir::NodeId id;  // invalid when the graph has no such input
      if (s.name.empty()) {
        if (i < graph_inputs.size()) id = graph_inputs[i];
      } else if (auto found = g.findInput(s.name)) {
        id = *found;
      }
      std::string label = s.name.empty() ? "input " + std::to_string(i) : "input '" + s.name + "'";
      if (!id.valid()) return fail(notFound(label + ": the graph has no such input"));
      const ir::Node& n = g.node(id);
      const ir::Value& v = g.value(n.outputs.at(0));
      if (!v.tensor || v.tensor->dtype != s.dtype || v.tensor->shape != s.shape)
        return fail(invalidArgument(
            label + ": an imported graph has fixed input shapes; it has " +
            (v.tensor ? std::string(ir::dtypeName(v.tensor->dtype)) + ir::toString(v.tensor->shape)
                      : std::string("a non-tensor")) +
            ", not " + ir::dtypeName(s.dtype) + ir::toString(s.shape)));
    }
    st.graph = &g;
    // No file: the model hash is the SHA-256 of the graph's protobuf serialization.
    st.source.model_sha256 = sha256Hex(ir::serializeGraph(g));
  }
  st.source.model_name = st.graph->name;
  st.source.inputs = plan::inputShapes(*st.graph);
  return Status::success();
}

Expected<const ir::Graph*> AutoParallel::graph() {
  APC_RETURN_IF_ERROR(ensureGraph());
  return state_->graph;
}

Status AutoParallel::checkTuple(const mesh::PlacementTuple& t, const std::string& what) const {
  if (t.size() != spec_.mesh.ndim())
    return invalidArgument(what + ": " + placementList(t) + " has " + std::to_string(t.size()) +
                           " entries but the mesh " + spec_.mesh.toString() + " has " +
                           std::to_string(spec_.mesh.ndim()) + " dims");
  return Status::success();
}

Status AutoParallel::add_input_constraints(const std::vector<Placements>& constraints) {
  const char* kWhat = "add_input_constraints";
  APC_RETURN_IF_ERROR(ensureGraph());
  if (input_constraints_set_)
    return invalidArgument(std::string(kWhat) + ": input constraints have already been set");
  const ir::Graph& g = *state_->graph;
  std::vector<ir::NodeId> graph_inputs = g.nodesOfKind(ir::NodeKind::kInput);
  if (constraints.size() > graph_inputs.size())
    return invalidArgument(std::string(kWhat) + ": " + std::to_string(constraints.size()) +
                           " constraints but the model has " + std::to_string(graph_inputs.size()) +
                           " inputs");
  spec::InputShardings in;
  in.by_position.resize(graph_inputs.size());
  for (size_t i = 0; i < constraints.size(); ++i) {
    std::string what = std::string(kWhat) + ": input " + std::to_string(i) + " (" +
                       g.node(graph_inputs[i]).name + ")";
    auto t = constraints[i].resolve();
    if (!t.ok()) return t.error().withContext(what);
    if (*t) APC_RETURN_IF_ERROR(checkTuple(**t, what));
    in.by_position[i] = *t;
  }
  auto resolved = spec::resolveInShardings(in, g);
  if (!resolved.ok()) return resolved.error().withContext(kWhat);
  spec::Spec trial = spec_;
  for (const auto& [name, t] : *resolved) trial.inputs[name] = t;
  Status ok = spec::validateSpecAgainstGraph(trial, g);
  if (!ok.ok()) return ok.error().withContext(kWhat);
  spec_ = std::move(trial);
  input_constraints_set_ = true;
  return Status::success();
}

Status AutoParallel::add_output_constraints(const spec::OutputPlacementTree& constraints) {
  const char* kWhat = "add_output_constraints";
  APC_RETURN_IF_ERROR(ensureGraph());
  if (output_constraints_set_)
    return invalidArgument(std::string(kWhat) + ": output constraints have already been set");
  std::vector<const mesh::PlacementTuple*> tuples;
  tuplesOf(constraints, tuples);
  for (const mesh::PlacementTuple* t : tuples) APC_RETURN_IF_ERROR(checkTuple(*t, kWhat));
  spec::Spec trial = spec_;
  trial.outputs = constraints;
  Status ok = spec::validateSpecAgainstGraph(trial, *state_->graph);
  if (!ok.ok()) return ok.error().withContext(kWhat);
  spec_ = std::move(trial);
  output_constraints_set_ = true;
  return Status::success();
}

Status AutoParallel::add_output_constraints(const std::vector<Placements>& leaves) {
  const char* kWhat = "add_output_constraints";
  APC_RETURN_IF_ERROR(ensureGraph());
  const ir::OutputTree& outputs = state_->graph->outputs();
  size_t n = outputs.leaves().size();
  if (leaves.size() != n)
    return invalidArgument(std::string(kWhat) + ": " + std::to_string(leaves.size()) +
                           " output placements but the model has " + std::to_string(n) +
                           " output leaves");
  std::vector<std::optional<mesh::PlacementTuple>> tuples;
  for (size_t i = 0; i < leaves.size(); ++i) {
    auto t = leaves[i].resolve();
    if (!t.ok()) return t.error().withContext(std::string(kWhat) + ": output " + std::to_string(i));
    tuples.push_back(std::move(t).value());
  }
  size_t next = 0;
  return add_output_constraints(treeOf(outputs, tuples, next));
}

Status AutoParallel::add_parameter_memory_constraint(std::optional<double> low,
                                                     std::optional<double> high) {
  const std::string what = "add_parameter_memory_constraint";
  spec::Spec trial = spec_;
  trial.memory_budget.low = low.value_or(0.0);
  trial.memory_budget.high = high;
  if (auto v = trial.memory_budget.violation()) return invalidArgument(what + ": " + v->text());
  auto budget = plan::effectiveBudget(trial);  // low > high, naming both
  if (!budget.ok()) return budget.error().withContext(what);
  trial.device_memory.reset();
  spec_ = std::move(trial);
  return Status::success();
}

Status AutoParallel::add_device_memory_constraint(int64_t bytes, const std::string& optimizer) {
  const std::string what = "add_device_memory_constraint";
  if (bytes < 1)
    return invalidArgument(what + ": bytes must be >= 1, got " + std::to_string(bytes));
  if (auto k = plan::optimizerStateFactor(optimizer); !k.ok()) return k.error().withContext(what);
  spec_.device_memory = bytes;
  spec_.optimizer = optimizer;
  spec_.memory_budget = {};
  return Status::success();
}

Status AutoParallel::set_activation_checkpointing(const std::string& modules) {
  APC_RETURN_IF_ERROR(ensureGraph());
  if (modules != "auto") {
    auto parsed = plan::parseCheckpointModules(*state_->graph, modules);
    if (!parsed.ok()) return parsed.error().withContext("set_activation_checkpointing");
  }
  checkpoint_ = modules;
  return Status::success();
}

Status AutoParallel::add_node_constraint(const std::string& node, const Placements& placements) {
  const std::string what = "add_node_constraint '" + node + "'";
  APC_RETURN_IF_ERROR(ensureGraph());
  auto t = placements.resolve();
  if (!t.ok()) return t.error().withContext(what);
  if (!*t) return invalidArgument(what + ": a node constraint needs placements");
  APC_RETURN_IF_ERROR(checkTuple(**t, what));
  spec::Spec trial = spec_;
  spec::Pin pin;
  pin.target = spec::Pin::Target::kNode;
  pin.name = node;
  pin.placements = **t;
  trial.pins.push_back(std::move(pin));
  Status ok = spec::validateSpecAgainstGraph(trial, *state_->graph);
  if (!ok.ok()) return ok.error().withContext(what);
  spec_ = std::move(trial);
  return Status::success();
}

Expected<AutoParallel::Solved> AutoParallel::solve(const std::optional<std::string>& baseline,
                                                   bool verbose) {
  APC_RETURN_IF_ERROR(ensureGraph());
  const State& st = *state_;
  const ir::Graph& g = *st.graph;
  spec::Spec spec = spec_;
  spec.prefetch_discount = optimizer_.prefetch_scale_;
  plan::PlanRequest request;
  if (baseline) {
    auto parsed = solver::parseBaseline(*baseline);
    if (!parsed.ok()) return parsed.error().withContext("baseline_placement");
    request.baseline = *parsed;
  }
  request.options.solver.time_limit_s = options_.time_limit_s;
  request.options.solver.threads = options_.threads;
  request.options.reduce = options_.reduce;
  request.checkpoint = checkpoint_;
  plan::PhaseTimings timings;
  auto run = plan::planGraph(g, std::move(spec), st.source, request, &timings);
  if (!run.ok()) return baseline ? run.error().withContext("baseline_placement") : run.error();
  Solved out;
  out.built = std::move(run->built);
  out.plan = std::move(run->result.plan);
  if (verbose) {
    std::ostream& log = options_.log ? *options_.log : std::cout;
    log << plan::buildNotes(out.built, run->spec) << plan::optimizerLog(out.plan)
        << plan::summaryText(out.plan, &timings);
  }
  return out;
}

Expected<plan::Plan> AutoParallel::optimize_placement(bool verbose) {
  APC_ASSIGN_OR_RETURN(Solved solved, solve(std::nullopt, verbose));
  state_->built = std::move(solved.built);
  state_->plan = solved.plan;
  return std::move(solved.plan);
}

Expected<plan::Plan> AutoParallel::baseline_placement(const std::string& strategy) {
  APC_ASSIGN_OR_RETURN(Solved solved, solve(strategy, false));
  return std::move(solved.plan);
}

Expected<AppliedPlacement> AutoParallel::apply_placement(const plan::Plan& sharding_placement) {
  const std::string what = "apply_placement";
  APC_RETURN_IF_ERROR(ensureGraph());
  const State& st = *state_;
  const plan::Plan& p = sharding_placement;
  if (p.model.model_sha256 != st.source.model_sha256)
    return invalidArgument(what + ": the plan was made from another model (" +
                           (p.model.model_path.empty() ? p.model.model_name : p.model.model_path) +
                           ")");
  if (p.model.inputs != st.source.inputs)
    return invalidArgument(what + ": the plan was made for other input shapes (" +
                           join(p.model.inputs, " ") + ")");
  if (p.spec.mesh.shape() != spec_.mesh.shape())
    return invalidArgument(what + ": the plan is for mesh " + p.spec.mesh.toString() +
                           ", this AutoParallel's is " + spec_.mesh.toString());
  if (Status v = plan::verifyPlan(*st.graph, p); !v.ok()) return v.error().withContext(what);
  AppliedPlacement applied;
  auto programs = lower::lowerPlan(*st.graph, p);
  if (!programs.ok()) return programs.error().withContext(what);
  applied.plan = p;
  applied.programs_ =
      std::make_shared<const std::vector<proto::Program>>(std::move(programs).value());
  return applied;
}

Expected<AppliedPlacement> AutoParallel::apply_placement() {
  if (!state_->plan)
    return invalidArgument("apply_placement: no plan yet: call optimize_placement first");
  plan::Plan p = *state_->plan;
  return apply_placement(p);
}

size_t AppliedPlacement::num_ranks() const {
  return programs_ ? programs_->size() : 0;
}

const proto::Program& AppliedPlacement::program(size_t rank) const {
  return programs_->at(rank);
}

Status AppliedPlacement::write_artifact(const std::string& dir) const {
  if (!programs_)
    return Error(ErrorCode::kInvalidArgument,
                 "no programs to write: this AppliedPlacement did not come from apply_placement");
  return artifact::writeArtifact(dir, *programs_, plan.model.model_path);
}

// --- ShardingOptimizer ---------------------------------------------------------------------------

namespace {
Error noSolution(const std::string& what) {
  return invalidArgument(what + ": no solution yet: call optimize_placement first");
}
}  // namespace

Expected<plan::Plan> ShardingOptimizer::get_solution() const {
  if (!owner_->state_->plan) return noSolution("get_solution");
  return *owner_->state_->plan;
}

Expected<std::string> ShardingOptimizer::get_log() const {
  if (!owner_->state_->plan) return noSolution("get_log");
  return plan::optimizerLog(*owner_->state_->plan);
}

Expected<plan::NodeExplanation> ShardingOptimizer::explain_placement(
    const std::string& node) const {
  const auto& st = *owner_->state_;
  if (!st.plan || !st.built) return noSolution("explain_placement");
  APC_ASSIGN_OR_RETURN(uint32_t index, plan::findNode(*st.plan, node));
  return plan::explainNode(*st.plan, st.built->gp, index, st.graph);
}

Expected<std::string> ShardingOptimizer::print_costs_for_node(const std::string& node) const {
  APC_ASSIGN_OR_RETURN(plan::NodeExplanation e, explain_placement(node));
  // The table, then the collectives of the edges into the node in rank 0's lowered program, as
  // `apc explain --node` prints them.
  const auto& st = *owner_->state_;
  if (!st.graph) return plan::explanationText(*st.plan, e);
  return plan::nodeExplanationText(*st.plan, e, *st.graph);
}

Expected<plan::TargetExplanation> ShardingOptimizer::explain_placement(
    const mesh::PlacementTuple& target) const {
  const auto& st = *owner_->state_;
  if (!st.plan || !st.built) return noSolution("explain_placement");
  return plan::explainTarget(*st.plan, st.built->gp, target);
}

Expected<std::string> ShardingOptimizer::print_costs_for_node(const std::string& node,
                                                              uint32_t input) const {
  const auto& st = *owner_->state_;
  if (!st.plan || !st.built) return noSolution("print_costs_for_node");
  APC_ASSIGN_OR_RETURN(uint32_t index, plan::findNode(*st.plan, node));
  APC_ASSIGN_OR_RETURN(plan::RedistributionMatrix m,
                       plan::redistributionMatrix(*st.plan, st.built->gp, index, input, st.graph));
  return plan::matrixText(*st.plan, m);
}

plan::PlanDiff ShardingOptimizer::diff_solutions(const plan::Plan& a, const plan::Plan& b) const {
  return plan::diffPlans(a, b);
}

size_t ShardingOptimizer::discounted_edges() const {
  return owner_->state_->built ? owner_->state_->built->discounted_edges : 0;
}

Status ShardingOptimizer::apply_prefetch_discount(double scale) {
  if (!std::isfinite(scale) || scale < 0 || scale > 1)
    return invalidArgument("apply_prefetch_discount: scale must be in [0, 1], got " + fmt(scale));
  prefetch_scale_ = scale;
  return Status::success();
}

// --- the short path ------------------------------------------------------------------------------

Expected<AppliedPlacement> auto_parallel(
    const ModelSource& model, const mesh::DeviceMesh& mesh,
    const std::vector<SampleInput>& sample_inputs, const spec::OutputPlacementTree& out_shardings,
    std::optional<MixedPrecisionPolicy> mp_policy,
    std::optional<std::pair<double, double>> parameter_memory_budget, bool dynamic,
    const AutoParallelOptions& options) {
  std::vector<InputArg> inputs;
  std::vector<Placements> placements;
  for (const SampleInput& s : sample_inputs) {
    inputs.push_back(s.input);
    placements.push_back(s.placements);
  }
  AutoParallelOptions o = options;
  o.dynamic = o.dynamic || dynamic;
  AutoParallel ap(model, std::move(inputs), mesh, std::move(mp_policy), std::move(o));
  APC_RETURN_IF_ERROR(ap.add_input_constraints(placements));
  if (!out_shardings.isFree()) APC_RETURN_IF_ERROR(ap.add_output_constraints(out_shardings));
  if (parameter_memory_budget)
    APC_RETURN_IF_ERROR(ap.add_parameter_memory_constraint(parameter_memory_budget->first,
                                                           parameter_memory_budget->second));
  APC_ASSIGN_OR_RETURN(plan::Plan p, ap.optimize_placement(false));
  return ap.apply_placement(p);
}

}  // namespace apc
