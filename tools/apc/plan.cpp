//===- tools/apc/plan.cpp - `apc plan` -------------------------------------===//
//
// Imports a model, applies the command line's overrides to the spec (--in-shardings,
// --out-shardings, --memory-budget, --device), builds and solves the sharding problem (lib/plan's
// pipeline) and writes the plan JSON (-o). With --strategy it makes a classic plan (DDP, FSDP, TP,
// FSDP+TP: solver/baselines.h) priced by the same model instead of optimizing. Prints the summary
// (apc/report/report.h) and, with --verbose, the optimizer log first. Wall times go to the summary
// and to --timings-json, never into the plan, so that the same inputs give a byte-identical plan.
//
//===----------------------------------------------------------------------===//
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <future>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>

#include "apc/cost/device.h"
#include "apc/ir/proto_io.h"
#include "apc/plan/memory.h"
#include "apc/planner/pipeline.h"
#include "apc/report/comm.h"
#include "apc/report/report.h"
#include "apc/support/clock.h"
#include "apc/support/deadline.h"
#include "apc/support/file_io.h"
#include "apc/support/hash.h"
#include "apc/support/json_reader.h"
#include "apc/support/strings.h"
#include "commands.h"
#include "common.h"

namespace apc::tool {

namespace {

/// A warning for stderr when the written plan is not proven optimal (a time limit, a feasible
/// solve without proof): the status and the proven gap, and what to do; empty for optimal plans
/// and classic baselines (priced, not solved).
std::string unprovenWarning(const plan::Plan& p, double time_limit_s) {
  if (!p.solver.unproven()) return {};
  const std::string status = p.solver.statusText();
  std::string gap = "no proven bound";
  if (p.solver.bound && p.solver.objective > 0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "proven gap %.3g%%",
                  100.0 * (p.solver.objective - *p.solver.bound) / p.solver.objective);
    gap = buf;
  }
  // Shared reads solved within the limit: the gap is the relaxation's (solveGraphProblem), which
  // more time does not close.
  if (p.spec.shared_reads && p.solver.status == plan::PlanStatus::kFeasible)
    return "apc: note: the plan is not proven optimal (solver status " + status + ", " + gap +
           "): with --shared-reads the bound is a relaxation's; the plan is no dearer than the "
           "one that pays each read whole\n";
  char limit[64];
  std::snprintf(limit, sizeof limit, "%g", time_limit_s);
  return "apc: warning: the plan is not proven optimal (solver status " + status + ", " + gap +
         "): it is the best found within --time-limit " + limit +
         " s; a longer limit may find a faster plan or prove this one\n";
}

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

struct PlanFlags {
  ModelFlags model;
  MeshFlags mesh;
  std::string in_shardings;
  std::string out_shardings;
  std::string output;
  std::string memory_budget;
  std::string device_memory;
  std::string checkpoint;  // --checkpoint: auto (default), none, all or modules
  std::string optimizer;
  std::string mixed_precision;  // --mixed-precision param=bf16,reduce=f32
  std::string device;
  std::string cluster;  // --cluster FILE (apc calibrate's profile)
  double time_limit_s = 60;
  int threads = 1;
  bool verbose = false;
  bool quiet = false;  // --quiet: nothing on stdout, no progress
  bool json = false;   // --json: the summary as JSON on stdout
  bool no_reduce = false;
  std::string dump_problem;
  std::string timings_json;
  std::string strategy;  // a baseline name (--strategy); empty: the optimizer
  std::string artifact;  // --artifact DIR: also lower the plan (tools/apc/lower.cpp)
  /// --prefetch-discount: the spec's prefetch_discount, a number or "schedule"
  std::optional<std::string> prefetch_discount;
  bool shared_reads = false;  // --shared-reads: the spec's shared_reads
};

/// No output of the command is one of its input files, the artifact directory (replaced as a
/// whole) holds no input, and no other output lies in it.
Status checkOutputs(const PlanFlags& f) {
  std::vector<std::string> inputs = {f.model.model, f.mesh.spec, f.in_shardings, f.out_shardings,
                                     f.cluster};
  APC_RETURN_IF_ERROR(checkNotInput(f.output, "-o", inputs));
  APC_RETURN_IF_ERROR(checkNotInput(f.dump_problem, "--dump-problem", inputs));
  APC_RETURN_IF_ERROR(checkNotInput(f.timings_json, "--timings-json", inputs));
  APC_RETURN_IF_ERROR(checkNotInput(f.artifact, "--artifact", inputs));
  if (!f.output.empty() && !f.artifact.empty() &&
      fs::path(f.output).lexically_normal() == fs::path(f.artifact).lexically_normal())
    return invalidArgument("-o and --artifact name the same path " + printable(f.output));
  APC_RETURN_IF_ERROR(checkNoInputWithin(f.artifact, "--artifact", inputs));
  for (const auto& [flag, path] : {std::pair<const char*, const std::string&>{"-o", f.output},
                                   {"--dump-problem", f.dump_problem},
                                   {"--timings-json", f.timings_json}})
    if (isWithinDirectory(path, f.artifact))
      return invalidArgument(std::string(flag) + " " + printable(path, 1024) +
                             " is inside --artifact " + printable(f.artifact, 1024) +
                             ", which is replaced as a whole; write it elsewhere");
  // The side outputs are written after the plan: their destinations are checked now (a device, a
  // directory, a missing directory), so that a bad one fails before the plan is written, not after.
  for (const std::string* side : {&f.dump_problem, &f.timings_json})
    if (!side->empty()) APC_RETURN_IF_ERROR(StagedFile::create(*side));
  return Status::success();
}

/// The JSON document of --in-shardings / --out-shardings: a file, or the flag's text itself when
/// no such file exists and the text starts like JSON (`[`, `{` or `null`).
Expected<nlohmann::json> shardingDocument(const std::string& arg, const std::string& flag) {
  std::error_code ec;
  std::string_view text = trim(arg);
  const bool looks_inline =
      !text.empty() && (text.front() == '[' || text.front() == '{' || text == "null");
  if (looks_inline && !fs::exists(arg, ec)) {
    auto j = parseJsonText(text);
    if (!j.ok()) return j.error().withContext(flag + " (inline JSON)");
    return j;
  }
  auto j = readJsonFile(arg);
  if (!j.ok()) return j.error().withContext(flag);
  return j;
}

/// A sharding document that is a whole spec (an object with a mesh).
bool isWholeSpec(const nlohmann::json& j) {
  return j.is_object() && j.contains("mesh");
}

/// The output placements in the structure of the graph's outputs: a list of one placement per
/// output leaf (depth first) is accepted for any structure, including `[["S(0)","R"]]` for a
/// single output; a tree that already matches is kept.
spec::OutputPlacementTree shapeOutputs(spec::OutputPlacementTree t, const ir::Graph& g) {
  using Tree = spec::OutputPlacementTree;
  if (t.kind != Tree::Kind::kSequence) return t;
  const ir::OutputTree& outputs = g.outputs();
  const bool flat = std::all_of(t.children.begin(), t.children.end(), [](const Tree& c) {
    return c.kind == Tree::Kind::kLeaf || c.kind == Tree::Kind::kFree;
  });
  if (!flat || t.children.size() != outputs.leaves().size()) return t;
  const bool same_shape =
      (outputs.kind == ir::OutputTree::Kind::kTuple ||
       outputs.kind == ir::OutputTree::Kind::kList) &&
      std::all_of(outputs.children.begin(), outputs.children.end(),
                  [](const ir::OutputTree& c) { return c.kind == ir::OutputTree::Kind::kLeaf; });
  if (same_shape) return t;
  size_t next = 0;
  std::function<Tree(const ir::OutputTree&)> build = [&](const ir::OutputTree& o) -> Tree {
    switch (o.kind) {
      case ir::OutputTree::Kind::kLeaf:
        return t.children[next++];
      case ir::OutputTree::Kind::kTuple:
      case ir::OutputTree::Kind::kList: {
        std::vector<Tree> children;
        for (const ir::OutputTree& c : o.children) children.push_back(build(c));
        return Tree::makeSequence(std::move(children));
      }
      case ir::OutputTree::Kind::kDict: {
        std::map<std::string, Tree> entries;
        for (size_t i = 0; i < o.children.size(); ++i) entries[o.keys[i]] = build(o.children[i]);
        return Tree::makeDict(std::move(entries));
      }
    }
    return Tree::makeFree();
  };
  return build(outputs);
}

/// The spec from --spec/--mesh with the other flags applied.
Expected<spec::Spec> effectiveSpec(const PlanFlags& f, const ir::Graph& g) {
  std::optional<nlohmann::json> in_doc, out_doc;
  if (!f.in_shardings.empty()) {
    APC_ASSIGN_OR_RETURN(in_doc, shardingDocument(f.in_shardings, "--in-shardings"));
  }
  if (!f.out_shardings.empty()) {
    APC_ASSIGN_OR_RETURN(out_doc, shardingDocument(f.out_shardings, "--out-shardings"));
  }
  // A whole spec given as a sharding file: without --spec it serves as the spec (the other flags
  // override it as usual); with --spec only its inputs or outputs are taken. Either way a note.
  std::optional<spec::Spec> whole_in, whole_out;
  for (auto [doc, flag, arg, whole] :
       {std::tuple{&in_doc, "--in-shardings", &f.in_shardings, &whole_in},
        std::tuple{&out_doc, "--out-shardings", &f.out_shardings, &whole_out}}) {
    if (!*doc || !isWholeSpec(**doc)) continue;
    auto parsed = spec::parseSpec(**doc);
    if (!parsed.ok()) return parsed.error().withContext(std::string(flag) + " " + printable(*arg));
    *whole = std::move(parsed).value();
  }
  const spec::Spec* base = nullptr;
  if (f.mesh.spec.empty()) base = whole_in ? &*whole_in : whole_out ? &*whole_out : nullptr;
  APC_ASSIGN_OR_RETURN(spec::Spec spec, f.mesh.resolve(nullptr, base));
  for (auto [whole, flag, arg, section] :
       {std::tuple{&whole_in, "--in-shardings", &f.in_shardings, "inputs"},
        std::tuple{&whole_out, "--out-shardings", &f.out_shardings, "outputs"}}) {
    if (!*whole) continue;
    std::cerr << "apc: note: " << flag << " " << printable(*arg)
              << " is a whole spec (it has a mesh); "
              << (base == &**whole
                      ? std::string(
                            "it is used as the spec, as --spec would use it (--mesh and the "
                            "other flags override its sections)")
                      : "only its " + std::string(section) + " are used (the spec is " +
                            (f.mesh.spec.empty() ? std::string("the other flag's")
                                                 : "--spec " + printable(f.mesh.spec)) +
                            ")")
              << "\n";
  }
  std::optional<int64_t> cluster_memory;  // what calibration measured, when it did
  if (!f.cluster.empty()) {
    APC_ASSIGN_OR_RETURN(spec::ClusterProfile cluster, spec::readClusterProfile(f.cluster));
    cluster_memory = cluster.device_memory;
    if (Status st = spec::applyClusterProfile(cluster, spec); !st.ok())
      return st.error().withContext("--cluster " + f.cluster);
    if (!f.device.empty() && f.device != spec.device)
      return invalidArgument("--device " + f.device + " and --cluster " + f.cluster +
                             " (a measured " + spec.device +
                             ") both name the device: give one of them");
  }
  if (!f.device.empty()) spec.device = f.device;  // checked by plan::buildProblem
  if (in_doc) {
    spec::InputShardings in;
    if (whole_in) {
      in.by_name = whole_in->inputs;
    } else {
      auto parsed = spec::parseInShardings(*in_doc, spec.mesh.ndim());
      if (!parsed.ok())
        return parsed.error().withContext("--in-shardings " + printable(f.in_shardings));
      in = std::move(parsed).value();
    }
    auto resolved = spec::resolveInShardings(in, g);
    if (!resolved.ok()) return resolved.error().withContext(f.in_shardings);
    for (const auto& [name, t] : *resolved) spec.inputs[name] = t;
  }
  if (out_doc) {
    if (whole_out) {
      if (!whole_out->outputs.isFree()) spec.outputs = whole_out->outputs;
    } else {
      auto parsed = spec::parseOutShardings(*out_doc, spec.mesh.ndim());
      if (!parsed.ok())
        return parsed.error().withContext("--out-shardings " + printable(f.out_shardings));
      spec.outputs = std::move(parsed).value();
    }
  }
  spec.outputs = shapeOutputs(std::move(spec.outputs), g);
  if (!f.memory_budget.empty()) {
    APC_ASSIGN_OR_RETURN(spec.memory_budget, plan::parseMemoryBudget(f.memory_budget));
  }
  if (!f.device_memory.empty()) {
    if (!f.memory_budget.empty())
      return invalidArgument(
          "give either --device-memory (bytes per device) or --memory-budget (fractions of the "
          "parameter bytes), not both");
    auto bytes = parseByteSize(f.device_memory);
    if (!bytes.ok()) return bytes.error().withContext("--device-memory");
    spec.device_memory = *bytes;
    spec.memory_budget = {};
  } else if (!f.memory_budget.empty()) {
    spec.device_memory.reset();
  }
  if (!f.optimizer.empty()) {
    if (auto k = plan::optimizerStateFactor(f.optimizer); !k.ok())
      return k.error().withContext("--optimizer");
    spec.optimizer = f.optimizer;
  }
  if (!f.mixed_precision.empty()) {
    APC_ASSIGN_OR_RETURN(spec.mixed_precision, spec::parseMixedPrecisionText(f.mixed_precision));
  }
  if (f.shared_reads) spec.shared_reads = true;
  if (f.prefetch_discount) {
    spec.schedule_discount = *f.prefetch_discount == "schedule";
    spec.prefetch_discount = spec.schedule_discount ? 1.0 : std::stod(*f.prefetch_discount);
  }
  // Issue 29: with a named device (--device, --cluster, a spec's device other than the default)
  // and no budget given, the plan is the fastest that fits the device's memory: a calibrated
  // profile's measured memory per rank, else the device kind's datasheet memory. Without a named
  // device (the default kind is a guess) the budget stays AutoParallel's parameter fraction.
  const bool device_named =
      !f.device.empty() || !f.cluster.empty() || spec.device != spec::kDefaultDeviceKind;
  if (device_named && f.memory_budget.empty() && !spec.device_memory &&
      spec.memory_budget == spec::MemoryBudget{}) {
    std::optional<int64_t> memory = cluster_memory;
    if (!memory) {
      APC_ASSIGN_OR_RETURN(cost::DeviceSpec d, cost::deviceByName(spec.device));
      if (d.memory_gb > 0) memory = static_cast<int64_t>(d.memory_gb * 1e9);
    }
    if (memory) {
      spec.device_memory = *memory;
      std::cerr << "apc: note: planning to fit " << humanBytes(static_cast<double>(*memory))
                << " per rank, the " << (cluster_memory ? "measured memory" : "memory")
                << " of the named device " << spec.device
                << " (give --memory-budget LOW,HIGH for AutoParallel's parameter fraction, or "
                   "--device-memory)\n";
    }
  }
  return spec;
}

/// The plan file written when -o is not given: `<model stem>.plan.json`
/// (`<stem>.<strategy>.plan.json` for a classic plan) in the current directory.
std::string defaultPlanPath(const PlanFlags& f) {
  std::string stem = fs::path(f.model.model).stem().string();
  if (stem.empty()) stem = "model";
  std::string strategy = f.strategy;
  std::replace(strategy.begin(), strategy.end(), '+', '_');
  return stem + (strategy.empty() ? "" : "." + strategy) + ".plan.json";
}

/// The machine-readable summary of `apc plan --json`.
nlohmann::json summaryJson(const plan::Plan& p, const plan::PhaseTimings& t,
                           const std::string& output, const std::string& artifact) {
  const plan::PlanTotals& tt = p.totals;
  nlohmann::json j = {
      {"plan", output},
      {"artifact", artifact.empty() ? nlohmann::json(nullptr) : nlohmann::json(artifact)},
      {"content_hash", p.content_hash},
      {"model", p.model.model_path},
      {"mesh", p.spec.mesh.toString()},
      {"status", p.solver.statusText()},
      {"objective_us", p.solver.objective},
      {"step_us", {{"total", tt.total_us}, {"compute", tt.compute_us}, {"comm", tt.comm_us}}},
      {"param_bytes", {{"per_rank", tt.param_bytes_per_rank}, {"total", tt.param_bytes_total}}},
      {"param_memory_fraction", tt.param_memory_fraction},
      {"nodes", p.nodes.size()},
      {"seconds",
       {{"import", t.import_s},
        {"enumerate", t.enumerate_s},
        {"build", t.build_s},
        {"solve", t.solve_s},
        {"write", t.write_s}}}};
  if (!p.solver.baseline.empty()) j["baseline"] = p.solver.baseline;
  std::string note = plan::budgetNote(p);
  if (!note.empty()) j["budget_note"] = note;
  return j;
}

int runPlan(const PlanFlags& flags) {
  PlanFlags f = flags;
  const bool default_output = f.output.empty();
  if (default_output) f.output = defaultPlanPath(f);
  Progress progress(!f.quiet && !f.json);
  std::optional<solver::Baseline> baseline;
  if (!f.strategy.empty()) {
    auto b = solver::parseBaseline(f.strategy);
    if (!b.ok()) return report(b.error().withContext("--strategy"));
    if (!f.memory_budget.empty() || !f.device_memory.empty())
      return report(invalidArgument(
          std::string(f.memory_budget.empty() ? "--device-memory" : "--memory-budget") +
          " does not apply with --strategy (a classic plan defines its own parameter memory)"));
    baseline = *b;
  }
  plan::PhaseTimings t;
  auto t0 = Clock::now();
  if (Status s = checkOutputs(f); !s.ok()) return report(s.error());
  // Both outputs are staged first and committed together at the end: -o and --artifact succeed
  // or fail together, and a bad destination fails before the solve.
  std::optional<StagedFile> plan_file;
  {
    auto staged = StagedFile::create(f.output);
    if (!staged.ok()) return report(staged.error());
    plan_file.emplace(std::move(staged).value());
  }
  std::optional<StagedDirectory> artifact_dir;
  if (!f.artifact.empty()) {
    // Checks the destination now; the lowered programs go into a fresh staging directory later.
    auto probe = StagedDirectory::create(f.artifact, "manifest.json");
    if (!probe.ok()) return report(probe.error());
  }
  progress.phase("importing " + f.model.model);
  auto graph = f.model.load();
  if (!graph.ok()) return report(graph.error());
  t.import_s = secondsSince(t0);
  // The plan's copy of the graph (its bytes are half of makePlan's time on a 126-layer LLaMA),
  // serialized on a second thread while the model is hashed and the problem built and solved
  // (plan::PlanRequest::graph_bytes; the future's destructor waits on every return path).
  const std::shared_future<std::string> graph_bytes =
      std::async(std::launch::async, [&g = *graph] { return ir::serializeGraph(g); }).share();
  // --time-limit counts from here: enumeration, construction and the solve share it.
  const auto after_import = Clock::now();
  auto spec = effectiveSpec(f, *graph);
  if (!spec.ok()) return report(spec.error());

  plan::PlanSource source;
  source.model_path = f.model.model;
  source.model_name = graph->name;
  progress.phase("hashing " + f.model.model);
  auto sha = sha256File(f.model.model);
  if (!sha.ok()) return report(sha.error());
  source.model_sha256 = *sha;
  source.inputs = plan::inputShapes(*graph);

  plan::PlanRequest request;
  request.graph_bytes = graph_bytes;
  request.baseline = baseline;
  request.options.solver.time_limit_s = f.time_limit_s;
  request.options.solver.deadline = Deadline::after(after_import, f.time_limit_s);
  request.options.solver.threads = f.threads;
  request.options.reduce = !f.no_reduce;
  if (!f.checkpoint.empty()) request.checkpoint = f.checkpoint;
  progress.phase("enumerating strategies and pricing edges");
  auto result = plan::buildPlanProblem(*graph, std::move(spec).value(), request, &t);
  if (!result.ok()) return report(result.error());
  progress.done();
  std::cerr << plan::buildNotes(result->built, result->spec);
  if (!f.dump_problem.empty() && !result->built.complete) {
    std::cerr << "apc: note: no problem dumped to " << f.dump_problem
              << ": its construction stopped at the time limit\n";
  } else if (!f.dump_problem.empty()) {
    Status s =
        writeFileAtomic(f.dump_problem, solver::toJson(result->built.gp.problem).dump() + "\n");
    if (!s.ok()) return report(s.error());
  }
  progress.phase(baseline ? "pricing the classic plan" : "solving");
  if (Status s = plan::solvePlanProblem(*graph, source, request, *result, &t); !s.ok())
    return report(s.error());
  if (!result->result.note.empty()) std::cerr << "apc: note: " << result->result.note << "\n";
  if (const std::string w = unprovenWarning(result->result.plan, f.time_limit_s); !w.empty())
    std::cerr << w;

  auto tw = Clock::now();
  std::string artifact_summary;
  progress.phase("writing");
  Status written = plan_file->write(plan::toJsonText(result->result.plan));
  if (!written.ok()) return report(written.error());
  if (!f.artifact.empty()) {
    progress.phase("lowering to " + f.artifact);
    auto staged = stageArtifactFor(*graph, result->result.plan, f.artifact, &artifact_summary);
    if (!staged.ok()) return report(staged.error());
    artifact_dir.emplace(std::move(staged).value());
  }
  if (artifact_dir) {
    Status s = artifact_dir->commit();
    if (!s.ok()) return report(s.error());
  }
  if (Status s = plan_file->commit(); !s.ok()) return report(s.error());
  progress.done();
  t.write_s = secondsSince(tw);
  if (f.json) {
    nlohmann::json j = summaryJson(result->result.plan, t, f.output, f.artifact);
    if (!result->result.note.empty()) j["note"] = result->result.note;
    std::cout << j.dump(2) << "\n";
  } else if (!f.quiet) {
    std::cout << artifact_summary;
    if (f.verbose) {
      std::cout << plan::optimizerLog(result->result.plan);
      auto comms = plan::edgeComms(*graph, result->result.plan);
      if (comms.ok())
        std::cout << plan::commSection(*comms, result->result.plan.spec.mesh);
      else
        std::cout << "communication: not shown (" << comms.error().message() << ")\n";
    }
    std::cout << plan::summaryText(result->result.plan, &t);
    std::cout << plan::randomnessNote(*graph);
    std::cout << "wrote " << f.output
              << (default_output ? " (the default name; -o names another)" : "") << "\n";
  }
  if (!f.timings_json.empty()) {
    nlohmann::json j = {{"import_s", t.import_s},
                        {"enumerate_s", t.enumerate_s},
                        {"build_s", t.build_s},
                        {"solve_s", t.solve_s},
                        {"solver_s", t.solver_s},
                        {"write_s", t.write_s},
                        {"content_hash", result->result.plan.content_hash}};
    Status s = writeFileAtomic(f.timings_json, j.dump(2) + "\n");
    if (!s.ok()) return report(s.error());
  }
  leaveToExit(std::move(result));
  leaveToExit(std::move(graph));
  return 0;
}

}  // namespace

Runner addPlanCommand(CLI::App& app) {
  auto f = std::make_shared<PlanFlags>();
  f->model.add(app);
  f->mesh.add(app);
  app.add_option("--in-shardings", f->in_shardings,
                 "Input placements (JSON): a list with one placement list per input "
                 "([[\"S(0)\",\"R\"]]; null keeps the spec's or the default, Replicate) or an "
                 "object by input name; overrides the spec's inputs");
  app.add_option("--out-shardings", f->out_shardings,
                 "Output placements (JSON) in the forward's output structure; overrides the "
                 "spec's outputs");
  app.add_option("-o,--output", f->output,
                 "Write the plan JSON here (default: <model stem>.plan.json in the current "
                 "directory; the summary's last line names the file)")
      ->check(nonEmptyPath());
  app.add_option("--artifact", f->artifact,
                 "Also lower the plan: write per-rank programs and manifest.json to this directory "
                 "(an existing artifact there is replaced as a whole; -o and --artifact are "
                 "written both or neither)")
      ->check(nonEmptyPath());
  app.add_option("--mixed-precision", f->mixed_precision,
                 "Compute parameters and reduce gradients in other dtypes: "
                 "param=bf16,reduce=f32[,output=f32] (the spec's mixed_precision; this flag "
                 "replaces it)");
  app.add_option("--memory-budget", f->memory_budget,
                 "Parameter memory per rank as LOW,HIGH fractions of all parameter bytes "
                 "(default 0,1/world size; HIGH = 1 allows full replication)");
  app.add_option("--device-memory", f->device_memory,
                 "Memory per device (80GiB, 40GB, bytes): the plan is the fastest whose predicted "
                 "peak per rank (parameters, gradients, optimizer state, activations, transient "
                 "buffers) fits; replaces --memory-budget");
  app.add_option(
      "--checkpoint", f->checkpoint,
      "Activation checkpointing: auto (default: chosen per repeated module only when "
      "--device-memory needs it), none, all (every repeated module) or a comma-separated "
      "list of modules (layers.0,layers.1)");
  app.add_option("--optimizer", f->optimizer,
                 "The optimizer the memory model counts: sgd, momentum or adamw (default adamw)");
  app.add_option("--device", f->device,
                 "Device kind for the cost model (h100, h200, a100, b200, "
                 "cpu); overrides the spec's");
  app.add_option("--cluster", f->cluster,
                 "Cluster profile of apc calibrate: its measured device and links price the "
                 "plan (they replace the spec's device and mesh links)")
      ->check(nonEmptyPath());
  app.add_option(
         "--time-limit", f->time_limit_s,
         "Time limit in seconds after import (enumeration, construction and solve); "
         "reached, the best plan found is written with status time_limit and its proven gap")
      ->check(numberAbove(0.0, 1e7));
  app.add_option("--threads", f->threads, "Solver threads")->check(integerIn(1, 1024));
  app.add_flag("--verbose", f->verbose,
               "Print the optimizer log: every node's placement and (comm, compute) cost");
  app.add_flag("--quiet,-q", f->quiet,
               "Print nothing on stdout and no progress (warnings and errors still go to stderr)");
  app.add_flag("--json", f->json,
               "Print a machine-readable summary (JSON: plan file, hash, step time, memory, "
               "status, phase seconds) on stdout instead of the text summary");
  app.add_flag("--no-reduce", f->no_reduce,
               "Solve the full problem (no follow-merging or repeated-layer clustering)");
  app.add_option("--dump-problem", f->dump_problem,
                 "Write the solver's problem (JSON, before reduction) here")
      ->check(nonEmptyPath());
  app.add_option("--strategy", f->strategy,
                 "Make a classic plan instead of optimizing: ddp, fsdp, tp (Megatron on the last "
                 "mesh dim) or fsdp+tp (2-d meshes), priced by the same cost model; inputs the "
                 "spec does not place are batch-sharded as that plan does (tp: replicated)");
  app.add_flag(
      "--shared-reads", f->shared_reads,
      "Charge a redistribution that several readers of one value share (q, k and v "
      "reading one hidden state) once, as the program runs it, not once per reader; the "
      "plan may then be proven only to a gap (default: the spec's shared_reads, else off)");
  app.add_option("--prefetch-discount", f->prefetch_discount,
                 "Scale in [0, 1] of the priced communication of parameters (all-gathers, "
                 "re-gathers, gradient reductions), which can overlap other layers' compute: 0 "
                 "fully overlapped, 1 no discount; or 'schedule': the share the runtime's overlap "
                 "schedule hides, replayed on the plan (default: the spec's prefetch_discount, "
                 "else 1)")
      ->check(CLI::Validator(
          [range = numberIn(0.0, 1.0)](std::string& text) mutable -> std::string {
            if (text == "schedule") return {};
            std::string e = range(text);  // "must be a finite number in [0, 1], got 'x'"
            if (const size_t at = e.find(", got"); at != std::string::npos)
              e.insert(at, " or 'schedule'");
            return e;
          },
          "range [0, 1] or 'schedule'"));
  app.add_option("--timings-json", f->timings_json,
                 "Write the wall time of each phase here (JSON; not part of the plan)")
      ->check(nonEmptyPath());
  return [f]() { return runPlan(*f); };
}

}  // namespace apc::tool
