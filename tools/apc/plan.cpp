//===- tools/apc/plan.cpp - `apc plan` -------------------------------------===//
//
// Imports a model, applies the command line's overrides to the spec (--in-shardings,
// --out-shardings, --memory-budget, --device), builds and solves the sharding problem (lib/plan's
// pipeline) and writes the plan JSON (-o). With --strategy it makes a classic plan (DDP, FSDP, TP,
// FSDP+TP: solver/baselines.h) priced by the same model instead of optimizing. Prints the summary
// (lib/plan/report.h) and, with --verbose, the optimizer log first. Wall times go to the summary
// and to --timings-json, never into the plan, so that the same inputs give a byte-identical plan.
//
//===----------------------------------------------------------------------===//
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "apc/support/hash.h"
#include "apc/plan/pipeline.h"
#include "apc/plan/report.h"
#include "apc/support/file_io.h"
#include "apc/support/strings.h"
#include "commands.h"
#include "common.h"

namespace apc::tool {

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

struct PlanFlags {
  ModelFlags model;
  MeshFlags mesh;
  std::string in_shardings;
  std::string out_shardings;
  std::string output;
  std::string memory_budget;
  std::string device;
  double time_limit_s = 60;
  int threads = 1;
  bool verbose = false;
  bool no_reduce = false;
  std::string dump_problem;
  std::string timings_json;
  std::string strategy;  // a baseline name (--strategy); empty: the optimizer
  std::string artifact;  // --artifact DIR: also lower the plan (tools/apc/lower.cpp)
};

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// No output of the command is one of its input files.
Status checkOutputs(const PlanFlags& f) {
  std::vector<std::string> inputs = {f.model.model, f.mesh.spec, f.in_shardings, f.out_shardings};
  APC_RETURN_IF_ERROR(checkNotInput(f.output, "-o", inputs));
  APC_RETURN_IF_ERROR(checkNotInput(f.dump_problem, "--dump-problem", inputs));
  APC_RETURN_IF_ERROR(checkNotInput(f.timings_json, "--timings-json", inputs));
  APC_RETURN_IF_ERROR(checkNotInput(f.artifact, "--artifact", inputs));
  if (!f.output.empty() && !f.artifact.empty() &&
      fs::path(f.output).lexically_normal() == fs::path(f.artifact).lexically_normal())
    return invalidArgument("-o and --artifact name the same path " + printable(f.output));
  return Status::success();
}

/// The spec from --spec/--mesh with the other flags applied.
Expected<mesh::Spec> effectiveSpec(const PlanFlags& f, const ir::Graph& g) {
  APC_ASSIGN_OR_RETURN(mesh::Spec spec, f.mesh.resolve(nullptr));
  if (!f.device.empty()) {
    if (!mesh::isKnownDeviceKind(f.device))
      return invalidArgument("--device: unknown device '" + f.device +
                             "' (known: " + join(mesh::knownDeviceKinds(), ", ") + ")");
    spec.device = f.device;
  }
  if (!f.in_shardings.empty()) {
    APC_ASSIGN_OR_RETURN(mesh::InputShardings in,
                         mesh::parseInShardingsFile(f.in_shardings, spec.mesh.ndim()));
    auto resolved = mesh::resolveInShardings(in, g);
    if (!resolved.ok()) return resolved.error().withContext(f.in_shardings);
    for (const auto& [name, t] : *resolved) spec.inputs[name] = t;
  }
  if (!f.out_shardings.empty()) {
    APC_ASSIGN_OR_RETURN(spec.outputs,
                         mesh::parseOutShardingsFile(f.out_shardings, spec.mesh.ndim()));
  }
  if (!f.memory_budget.empty()) {
    APC_ASSIGN_OR_RETURN(spec.memory_budget, plan::parseMemoryBudget(f.memory_budget));
  }
  return spec;
}

int runPlan(const PlanFlags& f) {
  std::optional<solver::Baseline> baseline;
  if (!f.strategy.empty()) {
    auto b = solver::parseBaseline(f.strategy);
    if (!b.ok()) return report(b.error().withContext("--strategy"));
    if (!f.memory_budget.empty())
      return report(invalidArgument(
          "--memory-budget does not apply with --strategy (a classic plan defines its own "
          "parameter memory)"));
    baseline = *b;
  }
  plan::PhaseTimings t;
  auto t0 = Clock::now();
  if (Status s = checkOutputs(f); !s.ok()) return report(s.error());
  // Both outputs are staged first and committed together at the end: -o and --artifact succeed
  // or fail together, and a bad destination fails before the solve.
  std::optional<StagedFile> plan_file;
  if (!f.output.empty()) {
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
  auto graph = f.model.load();
  if (!graph.ok()) return report(graph.error());
  t.import_s = since(t0);
  // --time-limit counts from here: enumeration, construction and the solve share it.
  const auto after_import = Clock::now();
  if (!f.mesh.given())
    return report(invalidArgument("no mesh given: use --mesh (like --mesh 2x4) or --spec"));
  auto spec = effectiveSpec(f, *graph);
  if (!spec.ok()) return report(spec.error());
  if (baseline) {
    if (!solver::baselineApplies(*baseline, spec->mesh.ndim()))
      return report(invalidArgument(std::string("--strategy ") + solver::baselineName(*baseline) +
                                    " needs a mesh of 2 or more dims (data x tensor parallel), "
                                    "got " +
                                    spec->mesh.toString()));
    *spec = plan::baselineSpec(*graph, std::move(*spec), *baseline);
  }

  plan::PlanSource source;
  source.model_path = f.model.model;
  source.model_name = graph->name;
  auto sha = sha256File(f.model.model);
  if (!sha.ok()) return report(sha.error());
  source.model_sha256 = *sha;
  source.inputs = plan::inputShapes(*graph);

  auto built = plan::buildProblem(*graph, *spec, &t);
  if (!built.ok()) return report(built.error());
  for (const std::string& op : built->fallback_ops)
    std::cerr << "apc: warning: no sharding rule for " << op
              << "; it gets the Replicate-only strategy\n";
  if (!f.dump_problem.empty()) {
    Status s = writeFileAtomic(f.dump_problem, solver::toJson(built->gp.problem).dump() + "\n");
    if (!s.ok()) return report(s.error());
  }

  solver::SolveGraphOptions options;
  options.solver.time_limit_s = f.time_limit_s;
  options.solver.deadline =
      after_import + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(std::min(f.time_limit_s, 1e9)));
  options.solver.threads = f.threads;
  options.reduce = !f.no_reduce;
  auto result =
      baseline ? plan::solveBaselineAndPlan(*graph, *built, *spec, source, *baseline, options, &t)
               : plan::solveAndPlan(*graph, *built, *spec, source, options, &t);
  if (!result.ok()) return report(result.error());

  auto tw = Clock::now();
  std::string artifact_summary;
  if (plan_file) {
    Status s = plan_file->write(plan::toJsonText(result->plan));
    if (!s.ok()) return report(s.error());
  }
  if (!f.artifact.empty()) {
    auto staged = stageArtifactFor(*graph, result->plan, f.artifact, &artifact_summary);
    if (!staged.ok()) return report(staged.error());
    artifact_dir.emplace(std::move(staged).value());
  }
  if (artifact_dir) {
    Status s = artifact_dir->commit();
    if (!s.ok()) return report(s.error());
    std::cout << artifact_summary;
  }
  if (plan_file) {
    Status s = plan_file->commit();
    if (!s.ok()) return report(s.error());
  }
  t.write_s = since(tw);
  if (f.verbose) std::cout << plan::optimizerLog(result->plan);
  std::cout << plan::summaryText(result->plan, &t);
  std::cout << plan::randomnessNote(*graph);
  std::cout << (f.output.empty() ? std::string("plan not written (no -o)") : "wrote " + f.output)
            << "\n";
  if (!f.timings_json.empty()) {
    nlohmann::json j = {{"import_s", t.import_s},
                        {"enumerate_s", t.enumerate_s},
                        {"build_s", t.build_s},
                        {"solve_s", t.solve_s},
                        {"solver_s", t.solver_s},
                        {"write_s", t.write_s},
                        {"content_hash", result->plan.content_hash}};
    Status s = writeFileAtomic(f.timings_json, j.dump(2) + "\n");
    if (!s.ok()) return report(s.error());
  }
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
  app.add_option("-o,--output", f->output, "Write the plan JSON here");
  app.add_option("--artifact", f->artifact,
                 "Also lower the plan: write per-rank programs and manifest.json to this directory "
                 "(an existing artifact there is replaced as a whole; -o and --artifact are "
                 "written both or neither)");
  app.add_option("--memory-budget", f->memory_budget,
                 "Parameter memory per rank as LOW,HIGH fractions of all parameter bytes "
                 "(default 0,1/world size; HIGH = 1 allows full replication)");
  app.add_option("--device", f->device,
                 "Device kind for the cost model (h100, h200, a100, b200, "
                 "cpu); overrides the spec's");
  app.add_option(
         "--time-limit", f->time_limit_s,
         "Time limit in seconds after import (enumeration, construction and solve); "
         "reached, the best plan found is written with status time_limit and its proven gap")
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", f->threads, "Solver threads")->check(CLI::PositiveNumber);
  app.add_flag("--verbose", f->verbose,
               "Print the optimizer log: every node's placement and (comm, compute) cost");
  app.add_flag("--no-reduce", f->no_reduce,
               "Solve the full problem (no follow-merging or repeated-layer clustering)");
  app.add_option("--dump-problem", f->dump_problem,
                 "Write the solver's problem (JSON, before reduction) here");
  app.add_option("--strategy", f->strategy,
                 "Make a classic plan instead of optimizing: ddp, fsdp, tp (Megatron on the last "
                 "mesh dim) or fsdp+tp (2-d meshes), priced by the same cost model; inputs the "
                 "spec does not place are batch-sharded as that plan does (tp: replicated)");
  app.add_option("--timings-json", f->timings_json,
                 "Write the wall time of each phase here (JSON; not part of the plan)");
  return [f]() { return runPlan(*f); };
}

}  // namespace apc::tool
