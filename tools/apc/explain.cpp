//===- tools/apc/explain.cpp - `apc explain` -------------------------------===//
//
// Reads a plan and prints its costliest nodes; with --node or --module, also every alternative of
// one node priced in the plan's context (lib/plan/explain.h). Alternatives need the problem the
// plan was solved on: the model is imported again from the path stored in the plan (or --model)
// with the plan's input shapes, checked against the stored SHA-256, and the problem is rebuilt from
// the plan's spec. --format json prints the same as canonical JSON; --format dot prints a Graphviz
// graph of the plan coloured by output placement.
//
//===----------------------------------------------------------------------===//
#include <memory>
#include <optional>
#include <string>

#include "apc/frontend/input_spec.h"
#include "apc/frontend/model.h"
#include "apc/plan/explain.h"
#include "apc/support/hash.h"
#include "apc/plan/pipeline.h"
#include "commands.h"

namespace apc::tool {

namespace {

struct ExplainFlags {
  std::string plan;
  size_t top = 20;
  std::string node;
  std::string module;
  std::string format = "text";
  std::string model;  // overrides the plan's model path
};

Expected<ir::Graph> importForPlan(const plan::Plan& p, const std::string& model_override) {
  std::string path = model_override.empty() ? p.model.model_path : model_override;
  auto sha = sha256File(path);
  if (!sha.ok())
    return sha.error().withContext("cannot read the plan's model (use --model to point at it)");
  if (*sha != p.model.model_sha256)
    return invalidArgument("model " + path +
                           " is not the one the plan was made from (its SHA-256 differs)");
  frontend::ImportOptions options;
  for (const std::string& text : p.model.inputs) {
    APC_ASSIGN_OR_RETURN(frontend::InputSpec s, frontend::parseInputSpec(text));
    options.inputs.push_back(s);
  }
  return frontend::importModel(path, options);
}

int runExplain(const ExplainFlags& f) {
  auto p = plan::readPlanFile(f.plan);
  if (!p.ok()) return report(p.error());
  if (f.format != "text" && f.format != "json" && f.format != "dot")
    return report(invalidArgument("--format: expected text, json or dot, got '" + f.format + "'"));
  if (!f.node.empty() && !f.module.empty())
    return report(invalidArgument("give at most one of --node and --module"));
  if (f.format == "dot") {
    std::cout << plan::dotGraph(*p);
    return 0;
  }
  std::optional<plan::NodeExplanation> e;
  if (!f.node.empty() || !f.module.empty()) {
    auto index = f.node.empty() ? plan::findModuleNode(*p, f.module) : plan::findNode(*p, f.node);
    if (!index.ok()) return report(index.error());
    auto graph = importForPlan(*p, f.model);
    if (!graph.ok()) return report(graph.error());
    auto built = plan::rebuildProblem(*graph, *p);
    if (!built.ok()) return report(built.error());
    auto ex = plan::explainNode(*p, built->gp, *index, &*graph);
    if (!ex.ok()) return report(ex.error());
    e = std::move(ex).value();
  }
  if (f.format == "json") {
    std::cout << plan::canonicalText(plan::explainJson(*p, f.top, e ? &*e : nullptr));
    return 0;
  }
  std::cout << plan::topNodesText(*p, f.top);
  if (e) std::cout << "\n" << plan::explanationText(*p, *e);
  return 0;
}

}  // namespace

Runner addExplainCommand(CLI::App& app) {
  auto f = std::make_shared<ExplainFlags>();
  app.add_option("plan", f->plan, "Plan JSON written by apc plan")->required();
  app.add_option("--top", f->top, "How many of the costliest nodes to list")
      ->check(CLI::Range(size_t{0}, size_t{1} << 30));
  app.add_option("--node", f->node,
                 "Explain this node: every alternative strategy with its cost and status (names "
                 "as in the plan: input/parameter names, op output values like linear_1)");
  app.add_option("--module", f->module,
                 "Explain the costliest op of this module path (like layers.0.attention)");
  app.add_option("--format", f->format, "text, json or dot (Graphviz, coloured by placement)");
  app.add_option("--model", f->model,
                 "The model file, when it moved since planning (must have the same SHA-256)");
  return [f]() { return runExplain(*f); };
}

}  // namespace apc::tool
