//===- tools/apc/explain.cpp - `apc explain` -------------------------------===//
//
// Reads a plan and prints its costliest nodes; with --node or --module, also every alternative of
// one node priced in the plan's context (apc/report/explain.h). Alternatives need the problem the
// plan was solved on: it is rebuilt from the graph the plan carries and the plan's spec (for a
// plan without a graph, the model is imported again from the path stored in the plan, or
// --model, with the plan's input shapes, checked against the stored SHA-256). --format json prints
// the same as canonical JSON; --format dot prints a Graphviz graph of the plan coloured by output
// placement. --target PLACEMENT compares every node's choice with its cheapest strategy that
// outputs PLACEMENT; --node N --matrix [--input K] prints the redistribution matrix of one input.
//
//===----------------------------------------------------------------------===//
#include <algorithm>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "apc/planner/pipeline.h"
#include "apc/report/comm.h"
#include "apc/report/explain.h"
#include "apc/report/report.h"
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
  bool top_given = false;
  std::string by = "node";     // --by node|module: the costliest table's rows
  bool no_parameters = false;  // dot: leave parameters out
  size_t collapse_depth = 0;   // dot: draw deeper modules as one box each
  std::string target;          // --target: every node against its cheapest strategy with it
  bool matrix = false;         // --matrix: the redistribution matrix of one input of the node
  uint32_t input = 0;          // --input: which input for --matrix
  bool input_given = false;
};

int runExplain(const ExplainFlags& f) {
  auto p = plan::readPlanFile(f.plan);
  if (!p.ok()) return report(p.error());
  if (f.format != "text" && f.format != "json" && f.format != "dot" && f.format != "svg" &&
      f.format != "html")
    return report(
        invalidArgument("--format: expected text, json, dot, svg or html, got '" + f.format + "'"));
  if (f.by != "node" && f.by != "module")
    return report(invalidArgument("--by: expected node or module, got '" + f.by + "'"));
  if (!f.node.empty() && !f.module.empty())
    return report(invalidArgument("give at most one of --node and --module"));
  if (!f.target.empty() && (!f.node.empty() || !f.module.empty()))
    return report(
        invalidArgument("--target covers every node: give it without --node and --module"));
  if (f.matrix && f.node.empty() && f.module.empty())
    return report(
        invalidArgument("--matrix needs --node or --module (the node whose input it shows)"));
  if (f.input_given && !f.matrix) return report(invalidArgument("--input goes with --matrix"));
  if ((!f.target.empty() || f.matrix) && f.format != "text" && f.format != "json")
    return report(invalidArgument("--target and --matrix print text or json, not " + f.format));
  std::optional<mesh::PlacementTuple> target;
  if (!f.target.empty()) {
    auto t = mesh::parsePlacementTuple(f.target);
    if (!t.ok()) return report(invalidArgument("--target: " + t.error().message()));
    target = std::move(t).value();
  }
  // The collectives of each communicating edge come from the lowered program, which needs the
  // model: without it (moved, no --model) the output says so and shows costs only.
  std::optional<ir::Graph> graph;
  std::vector<plan::EdgeComm> comms;
  std::string no_comm;  // why the collectives are not shown
  {
    auto g = graphForPlan(*p, f.model);
    if (g.ok()) {
      graph = std::move(g).value();
      auto c = plan::edgeComms(*graph, *p);
      if (c.ok())
        comms = std::move(c).value();
      else
        no_comm = c.error().message();
    } else {
      no_comm = g.error().message();
    }
  }
  if (f.format == "dot") {
    plan::DotOptions options;
    options.edge_labels = plan::edgeLabels(comms, p->spec.mesh);
    options.sink_labels = plan::sinkLabels(comms, p->spec.mesh);
    options.parameters = !f.no_parameters;
    options.collapse_depth = f.collapse_depth;
    if (!no_comm.empty())
      std::cerr << "apc: note: edges show costs only, not collectives: " << no_comm << "\n";
    std::cout << plan::dotGraph(*p, options);
    return 0;
  }
  if (f.format == "svg" || f.format == "html") {
    plan::PictureOptions options;
    options.edge_labels = plan::edgeLabels(comms, p->spec.mesh);
    options.sink_labels = plan::sinkLabels(comms, p->spec.mesh);
    if (!no_comm.empty())
      std::cerr << "apc: note: edges show costs only, not collectives: " << no_comm << "\n";
    std::cout << (f.format == "svg" ? plan::svgPicture(*p, options)
                                    : plan::htmlPicture(*p, options));
    return 0;
  }
  if (target) {
    if (!graph) return report(graphForPlan(*p, f.model).error());
    auto built = plan::rebuildProblem(*graph, *p);
    if (!built.ok()) return report(built.error());
    auto t = plan::explainTarget(*p, built->gp, *target);
    if (!t.ok()) return report(t.error());
    if (f.format == "json")
      std::cout << plan::canonicalText(plan::targetJson(*p, *t));
    else
      std::cout << plan::targetText(*t);
    return 0;
  }
  std::optional<plan::NodeExplanation> e;
  if (!f.node.empty() || !f.module.empty()) {
    auto index = f.node.empty() ? plan::findModuleNode(*p, f.module) : plan::findNode(*p, f.node);
    if (!index.ok()) return report(index.error());
    if (!graph) return report(graphForPlan(*p, f.model).error());
    auto built = plan::rebuildProblem(*graph, *p);
    if (!built.ok()) return report(built.error());
    if (f.matrix) {
      auto m = plan::redistributionMatrix(*p, built->gp, *index, f.input, &*graph);
      if (!m.ok()) return report(m.error());
      if (f.format == "json")
        std::cout << plan::canonicalText(plan::matrixJson(*p, *m));
      else
        std::cout << plan::matrixText(*p, *m);
      return 0;
    }
    auto ex = plan::explainNode(*p, built->gp, *index, &*graph);
    if (!ex.ok()) return report(ex.error());
    e = std::move(ex).value();
  }
  // The graph nodes whose incoming communication is shown: the explained node, else the listed
  // costliest nodes.
  std::vector<uint32_t> shown;
  auto addShown = [&](uint32_t plan_node) {
    if (const auto& gn = p->nodes[plan_node].graph_node) shown.push_back(*gn);
  };
  if (e) addShown(e->node);
  if (!e || f.top_given)
    for (uint32_t i : plan::costliestNodes(*p, f.top)) addShown(i);
  if (f.format == "json") {
    nlohmann::json j = plan::explainJson(*p, f.top, e ? &*e : nullptr);
    if (!p->memory.empty()) j["memory"] = plan::memoryJson(*p);
    if (no_comm.empty()) {
      nlohmann::json edges = nlohmann::json::array();
      for (const plan::EdgeComm& c : comms)
        if (c.graph_node && std::find(shown.begin(), shown.end(), *c.graph_node) != shown.end())
          edges.push_back(plan::toJson(c, p->spec.mesh));
      j["communication"] = edges;
    } else {
      j["communication"] = nullptr;
      j["communication_unavailable"] = no_comm;
    }
    std::cout << plan::canonicalText(j);
    return 0;
  }
  // The node asked about comes first; the costliest-nodes table follows only when --top is given.
  auto topText = [&] {
    return f.by == "module" ? plan::topModulesText(*p, f.top) : plan::topNodesText(*p, f.top);
  };
  if (e) {
    std::cout << plan::explanationText(*p, *e);
    if (f.top_given) std::cout << "\n" << topText();
  } else {
    std::cout << topText();
    if (std::string mem = plan::memoryText(*p); !mem.empty()) std::cout << "\n" << mem;
  }
  std::cout << plan::commSectionOrWhy(comms, no_comm, p->spec.mesh, &shown);
  return 0;
}

}  // namespace

Runner addExplainCommand(CLI::App& app) {
  auto f = std::make_shared<ExplainFlags>();
  app.add_option("plan", f->plan, "Plan JSON written by apc plan")
      ->required()
      ->check(nonEmptyPath());
  CLI::Option* top = app.add_option("--top", f->top,
                                    "How many of the costliest nodes to list (default 20; with "
                                    "--node or --module the table is printed only when given)")
                         ->check(integerIn(0, int64_t{1} << 30));
  app.add_option("--by", f->by,
                 "Rows of the costliest table: node (default) or module (each stack of repeated "
                 "layers summed as one row: where a deep model's step goes)");
  app.add_option("--node", f->node,
                 "Explain this node: every alternative strategy with its cost and status (names "
                 "as in the plan: input/parameter names, op output values like linear_1)");
  app.add_option("--module", f->module,
                 "Explain the costliest op of this module path (like layers.0.attention)");
  app.add_option("--format", f->format,
                 "text, json, dot (Graphviz: modules as clusters, parameters as ellipses, "
                 "colours by placement, communicating edges labelled with their collectives), "
                 "svg (a picture: per-module cost chart, module boxes, placement colours) or "
                 "html (the same with collapsible modules)");
  app.add_option("--collapse-depth", f->collapse_depth,
                 "dot: draw every module deeper than this many path components as one box (its "
                 "op count and cost), e.g. 2 for layers.0, layers.1, ...")
      ->check(integerIn(0, 1024));
  app.add_flag("--no-parameters", f->no_parameters, "dot: leave parameters and buffers out");
  app.add_option("--target", f->target,
                 "Every node's chosen strategy against its cheapest strategy whose output is "
                 "placed so (like S(0)R, one entry per mesh dim), with the delta and the total "
                 "(node-local: each node priced with the others at their choices)");
  app.add_flag("--matrix", f->matrix,
               "With --node or --module: the redistribution cost of one input (--input) from "
               "each placement its producer can output (rows) into each placement the node's "
               "strategies need (columns), the plan's pair marked *");
  CLI::Option* input = app.add_option("--input", f->input, "The input of --matrix (default 0)")
                           ->check(integerIn(0, int64_t{1} << 20));
  app.add_option("--model", f->model,
                 "The model file, for a plan that carries no graph and whose model moved since "
                 "planning (must have the same SHA-256); checked, not imported, otherwise")
      ->check(nonEmptyPath());
  return [f, top, input]() {
    f->top_given = top->count() > 0;
    f->input_given = input->count() > 0;
    return runExplain(*f);
  };
}

}  // namespace apc::tool
