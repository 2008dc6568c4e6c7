//===- tools/apc/validate.cpp - `apc validate` -----------------------------===//
//
// `apc validate PLAN [MODEL] [--spec SPEC]`: the checks `apc lower` makes before it writes
// anything, without writing: the plan parses (its content hashes to its content_hash), MODEL
// (default: the plan's path) is the file the plan was made from (SHA-256), it imports at the
// plan's input shapes, the graph the plan carries (what apc lower lowers) is that import, the
// plan's spec fits the model (spec::validateSpecAgainstGraph), every node's placements are those
// of its chosen strategy (plan::verifyPlan), and rank 0's program can be made (node count and
// kinds, every redistribution possible, op constants rewritable). With --spec the plan's effective
// spec must equal that spec's (with --mesh / --mesh-names applied as `apc plan` applies them).
// Prints one line "ok: ..." and exits 0, else one line on stderr and exit 2.
//
//===----------------------------------------------------------------------===//
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "apc/ir/proto_io.h"
#include "apc/lower/lower.h"
#include "apc/plan/plan.h"
#include "apc/planner/verify.h"
#include "apc/spec/spec.h"
#include "commands.h"
#include "common.h"

namespace apc::tool {

namespace {

struct ValidateFlags {
  std::string plan;
  std::string model;
  MeshFlags mesh;
};

/// The first top-level key where two spec documents differ.
std::string firstDifference(const nlohmann::json& a, const nlohmann::json& b) {
  for (const auto& [key, value] : a.items())
    if (!b.contains(key) || b[key] != value) return key;
  for (const auto& [key, value] : b.items())
    if (!a.contains(key)) return key;
  return "";
}

int runValidate(const ValidateFlags& f) {
  auto p = plan::readPlanFile(f.plan);
  if (!p.ok()) return report(p.error());
  const std::string model = f.model.empty() ? p->model.model_path : f.model;
  auto g = importForPlan(*p, model);
  if (!g.ok()) return report(g.error().withContext(f.plan));
  if (Status s = spec::validateSpecAgainstGraph(p->spec, *g); !s.ok())
    return report(s.error().withContext(f.plan + ": the plan's spec"));
  if (Status s = plan::verifyPlan(*g, *p); !s.ok()) return report(s.error().withContext(f.plan));
  if (!p->graph_bytes.empty()) {
    // apc lower lowers the graph the plan carries: it must be the model's import (the content
    // hash does not cover it). Compared as bytes, under the planned graph's name (the file stem
    // at planning time: a moved model keeps its graph).
    auto carried = plan::plannedGraph(*p);
    if (!carried.ok()) return report(carried.error().withContext(f.plan));
    ir::Graph imported = *g;
    imported.name = carried->name;
    if (ir::serializeGraph(imported) != p->graph_bytes)
      return report(invalidArgument(
          f.plan + ": the graph the plan carries is not " + model +
          " imported at the plan's input shapes (was the plan edited, or made by another apc?)"));
  }
  if (f.mesh.given()) {
    auto spec = f.mesh.resolve(&*g);
    if (!spec.ok()) return report(spec.error());
    nlohmann::json want = spec::toJson(*spec), have = spec::toJson(p->spec);
    // Input and output placements given on apc plan's command line are part of the plan's spec,
    // not of the file: compare them only when the spec file sets them.
    for (const char* key : {"inputs", "outputs"})
      if (!want.contains(key)) have.erase(key);
    if (std::string key = firstDifference(want, have); !key.empty())
      return report(invalidArgument(f.plan + ": the plan's spec differs from " +
                                    (f.mesh.spec.empty() ? std::string("--mesh") : f.mesh.spec) +
                                    " in '" + key +
                                    "' (plan: " + have.value(key, nlohmann::json()).dump() +
                                    ", given: " + want.value(key, nlohmann::json()).dump() + ")"));
  }
  auto program = lower::lowerRank(*g, *p, 0);
  if (!program.ok()) return report(program.error().withContext(f.plan));
  std::cout << "ok: " << f.plan << " fits " << model << " (" << p->nodes.size()
            << " plan nodes, mesh " << p->spec.mesh.toString() << ", " << p->spec.mesh.worldSize()
            << " ranks; rank 0's program made, nothing written)\n";
  return 0;
}

}  // namespace

Runner addValidateCommand(CLI::App& app) {
  auto f = std::make_shared<ValidateFlags>();
  app.add_option("plan", f->plan, "Plan JSON written by apc plan")
      ->required()
      ->check(nonEmptyPath());
  app.add_option("model", f->model, "The model the plan was made from (default: the plan's path)");
  f->mesh.add(app);
  app.footer(
      "Checks what apc lower checks before writing (content hash, model hash, input shapes, the "
      "plan's spec against the model, every placement against its node's strategy, rank 0's "
      "program) and writes nothing. Exit 0 when the plan fits, 2 "
      "when it does not (one line naming why).");
  return [f] { return runValidate(*f); };
}

}  // namespace apc::tool
