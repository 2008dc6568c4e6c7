//===- tools/apc/lower.cpp - `apc lower` -----------------------------------===//
//
// `apc lower PLAN [MODEL] -o DIR`: lowers the plan over the graph it carries (or, for a plan
// without one, MODEL imported with the plan's input shapes; its SHA-256 must be the plan's) to one
// program per rank (lib/lower) and writes the artifact directory (manifest.json + rank_<r>.apcp).
// `apc plan --artifact DIR` calls the same writeArtifactFor after planning.
//
//===----------------------------------------------------------------------===//
#include <iostream>
#include <memory>
#include <string>

#include "apc/artifact/artifact.h"
#include "apc/frontend/input_spec.h"
#include "apc/frontend/model.h"
#include "apc/lower/lower.h"
#include "apc/planner/verify.h"
#include "apc/support/hash.h"
#include "commands.h"

namespace apc::tool {

Expected<StagedDirectory> stageArtifactFor(const ir::Graph& g, const plan::Plan& p,
                                           const std::string& dir, std::string* summary) {
  // One rank's program in memory at a time: each is written to the staging directory as soon as
  // it is lowered (every rank's at once grew past 18 GB for 65,536 ranks).
  APC_ASSIGN_OR_RETURN(artifact::ArtifactWriter writer,
                       artifact::ArtifactWriter::create(dir, p.spec.mesh.worldSize()));
  if (!p.model.model_path.empty()) writer.setModelPath(p.model.model_path);
  size_t redistributions = 0;
  APC_RETURN_IF_ERROR(lower::lowerEachRank(g, p, [&](const proto::Program& prog) {
    redistributions += static_cast<size_t>(prog.redistributions_size());
    return writer.add(prog);
  }));
  APC_ASSIGN_OR_RETURN(StagedDirectory staged, writer.finish());
  if (summary)
    *summary = "wrote artifact " + dir + ": " + std::to_string(p.spec.mesh.worldSize()) +
               " rank programs, " + std::to_string(redistributions) + " redistributions in all\n";
  return staged;
}

Status writeArtifactFor(const ir::Graph& g, const plan::Plan& p, const std::string& dir) {
  std::string summary;
  APC_ASSIGN_OR_RETURN(StagedDirectory staged, stageArtifactFor(g, p, dir, &summary));
  APC_RETURN_IF_ERROR(staged.commit());
  std::cout << summary;
  return Status::success();
}

namespace {

Status checkModelHash(const plan::Plan& p, const std::string& path) {
  auto sha = sha256File(path);
  if (!sha.ok()) return sha.error().withContext("cannot read the plan's model");
  if (*sha != p.model.model_sha256)
    return invalidArgument("model " + path +
                           " is not the one the plan was made from (its SHA-256 differs)");
  return Status::success();
}

}  // namespace

Expected<ir::Graph> importForPlan(const plan::Plan& p, const std::string& path) {
  APC_RETURN_IF_ERROR(checkModelHash(p, path));
  frontend::ImportOptions options;
  for (const std::string& text : p.model.inputs) {
    APC_ASSIGN_OR_RETURN(frontend::InputSpec s, frontend::parseInputSpec(text));
    options.inputs.push_back(s);
  }
  return frontend::importModel(path, options);
}

Expected<ir::Graph> graphForPlan(const plan::Plan& p, const std::string& model) {
  if (p.graph_bytes.empty()) return importForPlan(p, model.empty() ? p.model.model_path : model);
  if (!model.empty()) APC_RETURN_IF_ERROR(checkModelHash(p, model));
  return plan::plannedGraph(p);
}

namespace {

struct LowerFlags {
  std::string plan;
  std::string model;
  std::string output;
};

int runLower(const LowerFlags& f) {
  Status outputs = checkNotInput(f.output, "-o", {f.plan, f.model});
  if (outputs.ok()) outputs = checkNoInputWithin(f.output, "-o", {f.plan, f.model});
  if (!outputs.ok()) return report(outputs.error());
  auto p = plan::readPlanFile(f.plan);
  if (!p.ok()) return report(p.error());
  if (f.model.empty() && p->graph_bytes.empty())  // the plan's model is read too
    if (Status s = checkNoInputWithin(f.output, "-o", {p->model.model_path}); !s.ok())
      return report(s.error());
  auto g = graphForPlan(*p, f.model);
  if (!g.ok()) return report(g.error());
  if (Status v = plan::verifyPlan(*g, *p); !v.ok()) return report(v.error().withContext(f.plan));
  Status s = writeArtifactFor(*g, *p, f.output);
  if (!s.ok()) return report(s.error());
  return 0;
}

}  // namespace

Runner addLowerCommand(CLI::App& app) {
  auto f = std::make_shared<LowerFlags>();
  app.add_option("plan", f->plan, "Plan JSON written by apc plan")
      ->required()
      ->check(nonEmptyPath());
  app.add_option("model", f->model,
                 "The model the plan was made from: needed only for a plan that carries no graph "
                 "(default: the plan's path); when given, checked against the plan's SHA-256");
  app.add_option("-o,--output", f->output, "Artifact directory to write")
      ->required()
      ->check(nonEmptyPath());
  return [f] { return runLower(*f); };
}

}  // namespace apc::tool
