//===- tools/apc/inspect.cpp - `apc inspect` -------------------------------===//
//
// Imports a model and prints every node (index, op, module path, output shapes and dtypes) and the
// totals; `--json` prints the same as JSON. With a mesh (`--mesh 2x4` or `--spec`) and
// `--strategies` it also enumerates the sharding strategies of every node and lists, per node, how
// many there are and the cheapest few, then the Replicate-only fallbacks and the total.
//
//===----------------------------------------------------------------------===//
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apc/cost/cost_model.h"
#include "apc/cost/device.h"
#include "apc/ir/printer.h"
#include "apc/strategy/strategy.h"
#include "commands.h"
#include "common.h"

namespace apc::tool {

namespace {
struct InspectFlags {
  ModelFlags model;
  MeshFlags mesh;
  bool json = false;
  bool strategies = false;
  int top = 3;
};

/// The `top` cheapest strategies of a node by compute cost (stable: ties keep enumeration order).
std::vector<const strategy::Strategy*> cheapestFirst(const strategy::NodeStrategies& ns, int top) {
  std::vector<const strategy::Strategy*> sorted;
  for (const auto& s : ns.strategies) sorted.push_back(&s);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](auto* a, auto* b) { return a->compute_us < b->compute_us; });
  if (sorted.size() > static_cast<size_t>(top)) sorted.resize(static_cast<size_t>(top));
  return sorted;
}

int runStrategies(const InspectFlags& f, const ir::Graph& g, const spec::Spec& spec, bool json) {
  auto model = cost::costModelFor(spec);
  if (!model.ok()) return report(model.error());
  strategy::EnumerateOptions options;
  options.cost_model = &*model;
  auto t0 = std::chrono::steady_clock::now();
  std::vector<strategy::NodeStrategies> all =
      strategy::enumerate(g, spec.mesh, strategy::defaultRegistry(), options);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<std::string> fallbacks = strategy::fallbackOps(g, all);
  size_t total = 0;
  for (const auto& ns : all) total += ns.strategies.size();
  for (const std::string& op : fallbacks)
    std::cerr << "apc: warning: no sharding rule for " << op
              << "; it gets the Replicate-only strategy\n";
  if (json) {
    nlohmann::json nodes = nlohmann::json::array();
    for (const auto& ns : all) {
      const ir::Node& n = g.node(ns.node);
      std::vector<const strategy::Strategy*> sorted = cheapestFirst(ns, f.top);
      nlohmann::json cheapest = nlohmann::json::array();
      for (size_t i = 0; i < sorted.size(); ++i)
        cheapest.push_back(
            {{"strategy", sorted[i]->toString()}, {"compute_us", sorted[i]->compute_us}});
      nodes.push_back({{"index", n.id.v},
                       {"op", n.qualifiedOp()},
                       {"module_path", n.module_path},
                       {"num_strategies", ns.strategies.size()},
                       {"fallback", ns.fallback},
                       {"cheapest", cheapest}});
    }
    nlohmann::json j = {{"mesh", spec.mesh.toString()},
                        {"device", spec.device},
                        {"nodes", nodes},
                        {"replicate_only_fallbacks", fallbacks},
                        {"total_strategies", total},
                        {"enumerate_seconds", seconds}};
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << "strategies on mesh " << spec.mesh.toString() << ", device " << spec.device << ":\n";
  for (const auto& ns : all) {
    const ir::Node& n = g.node(ns.node);
    std::vector<const strategy::Strategy*> sorted = cheapestFirst(ns, f.top);
    char head[256];
    std::snprintf(head, sizeof head, "%-6u %-28s %-30s %4zu%s", n.id.v, n.qualifiedOp().c_str(),
                  n.module_path.empty() ? "-" : n.module_path.c_str(), ns.strategies.size(),
                  ns.fallback ? " (fallback)" : "");
    std::cout << head;
    for (size_t i = 0; i < sorted.size(); ++i) {
      char c[64];
      std::snprintf(c, sizeof c, " %.2fus", sorted[i]->compute_us);
      std::cout << (i ? " | " : "  ") << sorted[i]->toString() << c;
    }
    std::cout << "\n";
  }
  std::cout << "replicate-only fallbacks: " << fallbacks.size();
  for (const std::string& op : fallbacks) std::cout << " " << op;
  std::cout << "\n";
  char tail[160];
  std::snprintf(tail, sizeof tail, "total strategies: %zu over %zu nodes\nenumerate: %.3f s\n",
                total, all.size(), seconds);
  std::cout << tail;
  return 0;
}

int runInspect(const InspectFlags& f) {
  frontend::ImportTimings t;
  auto graph = f.model.load(&t);
  if (!graph.ok()) return report(graph.error());
  if (f.strategies && !f.mesh.given())
    return report(
        invalidArgument("--strategies needs a mesh: add --mesh (like --mesh 2x4) or --spec"));
  std::optional<spec::Spec> spec;
  if (f.mesh.given()) {
    auto s = f.mesh.resolve(&*graph);
    if (!s.ok()) return report(s.error());
    spec = *s;
  }
  double import_s = t.load_s + t.inline_s + t.interpret_s;
  if (f.strategies) return runStrategies(f, *graph, *spec, f.json);
  if (f.json) {
    nlohmann::json j = ir::graphToJson(*graph);
    j["import_seconds"] = {
        {"load", t.load_s}, {"inline", t.inline_s}, {"interpret", t.interpret_s}};
    if (spec) j["mesh"] = spec->mesh.toString();
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << "model: " << f.model.model << "\n";
  ir::printGraph(*graph, std::cout);
  ir::printStats(ir::computeStats(*graph), std::cout);
  char line[160];
  std::snprintf(line, sizeof line, "import: %.3f s (load %.3f, inline %.3f, shapes %.3f)\n",
                import_s, t.load_s, t.inline_s, t.interpret_s);
  std::cout << line;
  return 0;
}
}  // namespace

Runner addInspectCommand(CLI::App& app) {
  auto f = std::make_shared<InspectFlags>();
  f->model.add(app);
  f->mesh.add(app);
  app.add_flag("--json", f->json, "Print the graph and totals (or the strategies) as JSON");
  app.add_flag("--strategies", f->strategies,
               "Enumerate the sharding strategies of every node on the mesh and list the cheapest");
  app.add_option("--top", f->top,
                 "With --strategies: how many of the cheapest strategies to list per node")
      ->check(integerIn(1, int64_t{1} << 30));
  return [f]() { return runInspect(*f); };
}

}  // namespace apc::tool
