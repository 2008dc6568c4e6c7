//===- tools/apc/inspect.cpp - `apc inspect` -------------------------------===//
//
// Imports a model and prints every node (index, op, module path, output shapes and dtypes) and the
// totals; `--json` prints the same as JSON.
//
//===----------------------------------------------------------------------===//
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "apc/frontend/torchscript.h"
#include "apc/ir/printer.h"
#include "commands.h"

namespace apc::tool {

namespace {
struct InspectFlags {
  std::string model;
  std::vector<std::string> inputs;
  bool json = false;
};

int runInspect(const InspectFlags& f) {
  frontend::ImportOptions options;
  for (const std::string& text : f.inputs) {
    auto spec = frontend::parseInputSpec(text);
    if (!spec.ok()) return report(spec.error());
    options.inputs.push_back(*spec);
  }
  frontend::ImportTimings t;
  auto graph = frontend::importTorchScript(f.model, options, &t);
  if (!graph.ok()) return report(graph.error());
  double import_s = t.load_s + t.inline_s + t.interpret_s;
  if (f.json) {
    nlohmann::json j = ir::graphToJson(*graph);
    j["import_seconds"] = {{"load", t.load_s}, {"inline", t.inline_s}, {"interpret", t.interpret_s}};
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << "model: " << f.model << "\n";
  ir::printGraph(*graph, std::cout);
  ir::printStats(ir::computeStats(*graph), std::cout);
  char line[160];
  std::snprintf(line, sizeof line, "import: %.3f s (load %.3f, inline %.3f, shapes %.3f)\n", import_s,
                t.load_s, t.inline_s, t.interpret_s);
  std::cout << line;
  return 0;
}
}  // namespace

Runner addInspectCommand(CLI::App& app) {
  auto f = std::make_shared<InspectFlags>();
  app.add_option("model", f->model, "TorchScript archive (.pt) written by torch.jit.save")->required();
  app.add_option("--input", f->inputs,
                 "Input shape override, name:dtype[d0,d1,...] (e.g. tokens:i64[8,128]; a symbolic dim "
                 "as B=8); repeatable. Defaults to the shapes recorded in the archive");
  app.add_flag("--json", f->json, "Print the graph and totals as JSON");
  return [f]() { return runInspect(*f); };
}

}  // namespace apc::tool
