//===- lib/report/report.cpp - Printed forms of a plan -----------------------===//
//
// The summary and optimizer log of `apc plan` (see apc/report/report.h). Text for people: numbers
// are rounded for reading; the plan file keeps the exact ones.
//
//===----------------------------------------------------------------------===//
#include "apc/report/report.h"
#include <algorithm>
#include <cctype>

#include <cmath>
#include <cstdio>
#include <map>
#include <string_view>

#include "apc/strategy/strategy.h"
#include "apc/support/strings.h"

namespace apc::plan {

namespace {

std::string printf1(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string percent(double fraction) {
  return printf1("%.2f%%", 100 * fraction);
}

std::string shapeText(const std::vector<int64_t>& s) {
  return "[" + joinMap(s, ",", [](int64_t d) { return std::to_string(d); }) + "]";
}

}  // namespace

std::string displayName(const PlanNode& n) {
  return n.kind == "output" || n.kind == "pin" ? n.name : "%" + n.name;
}

std::string formatSignedMicros(double us) {
  if (!std::isfinite(us)) return "+inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%+.3f us", us);
  return buf;
}

std::vector<ir::NodeId> randomNodes(const ir::Graph& g) {
  // Which ops draw is each op's OpInfo::random in the registry (dropout unless p == 0 or in eval,
  // the sampling ops and their in-place forms).
  const strategy::Registry& registry = strategy::defaultRegistry();
  std::vector<ir::NodeId> out;
  for (const ir::Node& n : g.nodes())
    if (registry.drawsRandomNumbers(g, n)) out.push_back(n.id);
  return out;
}

std::string buildNotes(const BuiltProblem& built, const spec::Spec& spec) {
  std::string out;
  for (const std::string& op : built.fallback_ops)
    out += "apc: warning: no sharding rule for " + op + "; it gets the Replicate-only strategy\n";
  if (spec.prefetch_discount != 1.0) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", spec.prefetch_discount);
    out += std::string("apc: note: prefetch discount ") + buf + " on " +
           std::to_string(built.discounted_edges) + " parameter edges\n";
  }
  return out;
}

std::string randomnessNote(const ir::Graph& g) {
  std::vector<ir::NodeId> nodes = randomNodes(g);
  if (nodes.empty()) return "";
  std::map<std::string, int> by_op;
  for (ir::NodeId id : nodes) ++by_op[g.node(id).qualifiedOp()];
  std::string ops = joinMap(by_op, ", ", [](const auto& kv) {
    return kv.first + (kv.second > 1 ? " x" + std::to_string(kv.second) : "");
  });
  const ir::Node& first = g.node(nodes.front());
  return "random: " + std::to_string(nodes.size()) + " node" + (nodes.size() == 1 ? "" : "s") +
         " draw random numbers (" + ops + "; first in " +
         (first.module_path.empty() ? "the top level" : first.module_path) +
         "): each piece of their outputs draws its own (replicas the same), so a sharded run "
         "matches a single-device run in distribution only, not number for number\n";
}

std::string budgetNote(const Plan& p) {
  const PlanTotals& t = p.totals;
  if (t.param_memory_fraction <= t.memory_high + 1e-9 &&
      t.param_memory_fraction >= t.memory_low - 1e-9)
    return "";
  std::string who = p.solver.baseline.empty() ? "this plan" : p.solver.baseline;
  return "; OVER the budget: " + who + " keeps " + percent(t.param_memory_fraction) +
         " per rank, the budget allows " + percent(t.memory_low) + " to " + percent(t.memory_high);
}

std::string repeatedLayerOf(const std::string& module_path) {
  std::string layer;
  for (const std::string& part : split(module_path, '.')) {
    layer += (layer.empty() ? "" : ".") + part;
    if (!part.empty() && std::all_of(part.begin(), part.end(), [](char ch) {
          return std::isdigit(static_cast<unsigned char>(ch)) != 0;
        }))
      return layer;
  }
  return "";
}

std::string moduleGroupOf(const std::string& module_path) {
  if (module_path.empty()) return "-";
  const std::string layer = repeatedLayerOf(module_path);
  return layer.empty() ? module_path.substr(0, module_path.find('.')) : layer;
}

std::string memoryText(const Plan& p) {
  const MemoryEstimate* e = p.memoryFor(p.spec.optimizer);
  if (!e) return "";
  auto b = [](int64_t bytes) { return humanBytes(static_cast<double>(bytes)); };
  std::string out = "predicted peak memory per rank (" + e->optimizer + "): " + b(e->peak_bytes) +
                    " in the " + e->phase + (e->at.empty() ? " step" : " at " + e->at);
  if (p.spec.device_memory)
    out += std::string(e->peak_bytes <= *p.spec.device_memory ? ", fits " : ", OVER ") +
           "the device memory " + b(*p.spec.device_memory);
  const MemoryParts& m = e->at_peak;
  out += "\n  parameters " + b(m.parameters) + ", optimizer state " + b(m.optimizer_state) +
         ", gradients " + b(m.gradients) + ", saved activations " + b(m.activations) +
         ", transient " + b(m.transient) + ", buffers " + b(m.buffers) + ", inputs " + b(m.inputs) +
         "\n";
  std::string others;
  for (const MemoryEstimate& o : p.memory)
    if (o.optimizer != e->optimizer)
      others += (others.empty() ? "" : ", ") + o.optimizer + " " + b(o.peak_bytes);
  if (!others.empty()) out += "  other optimizers: " + others + "\n";
  return out;
}

std::string summaryText(const Plan& p, const PhaseTimings* timings) {
  std::string out;
  const PlanTotals& t = p.totals;
  out += "model: " + p.model.model_name + " (" + p.model.model_path + ")\n";
  out += "mesh: " + p.spec.mesh.toString() + ", world size " +
         std::to_string(p.spec.mesh.worldSize()) + ", device " + p.spec.device + "\n";
  // The inputs as planned (shapes, dynamic dims as B=8) and the precision: what the plan assumed.
  std::vector<std::string> inputs;
  for (const std::string& in : p.model.inputs) {
    const std::string name = in.substr(0, in.find(':'));
    auto placed = p.spec.inputs.find(name);
    inputs.push_back(in + " " +
                     mesh::toCompactString(placed != p.spec.inputs.end()
                                               ? placed->second
                                               : mesh::replicated(p.spec.mesh.ndim())));
  }
  out += "inputs: " + join(inputs, ", ") + "\n";
  if (const spec::MixedPrecision& mp = p.spec.mixed_precision; !mp.empty()) {
    std::string parts;
    auto add = [&](const char* what, const std::optional<ir::DType>& d) {
      if (d) parts += std::string(parts.empty() ? "" : ", ") + what + " " + ir::dtypeName(*d);
    };
    add("parameters", mp.param_dtype);
    add("gradient reductions", mp.reduce_dtype);
    add("outputs", mp.output_dtype);
    out += "mixed precision: " + parts + "\n";
  }
  out += "estimated step time: " + formatMicros(t.total_us) + " (compute " +
         formatMicros(t.compute_us) + ", communication " + formatMicros(t.comm_us) +
         (t.recompute_us > 0 ? ", recompute " + formatMicros(t.recompute_us) : "") + ")\n";
  if (!p.checkpoint.empty()) {
    out += "activation checkpointing: " + std::to_string(p.checkpoint.size()) + " module" +
           (p.checkpoint.size() == 1 ? "" : "s") + " recomputed in backward (" +
           p.checkpoint.front() +
           (p.checkpoint.size() > 1 ? " ... " + p.checkpoint.back() : std::string()) + ")\n";
  }
  out += "parameter memory per rank: " + humanBytes(static_cast<double>(t.param_bytes_per_rank)) +
         " of " + humanBytes(static_cast<double>(t.param_bytes_total)) + " (" +
         percent(t.param_memory_fraction) + "; budget " + percent(t.memory_low) + " to " +
         percent(t.memory_high) + ")" + budgetNote(p) + "\n";
  out += memoryText(p);

  // Parameters grouped by module, modules in order of first appearance; the modules of a
  // repeated layer ("layers.3.attention.wq") under their layer, and consecutive layers whose
  // parameters are placed alike once, with their count.
  std::vector<std::string> modules;
  std::map<std::string, std::vector<const PlanParameter*>> by_module;
  for (const PlanParameter& q : p.parameters) {
    auto [it, fresh] = by_module.try_emplace(q.module);
    if (fresh) modules.push_back(q.module);
    it->second.push_back(&q);
  }
  out += "parameters: " + std::to_string(p.parameters.size()) + " in " +
         std::to_string(modules.size()) + " module" + (modules.size() == 1 ? "" : "s") + "\n";
  // Groups in order: a repeated layer, or a module of its own.
  struct Group {
    std::string name;
    bool layer = false;
    std::vector<const PlanParameter*> params;
  };
  std::vector<Group> groups;
  for (const std::string& m : modules) {
    const std::string layer = repeatedLayerOf(m);
    if (!layer.empty() && !groups.empty() && groups.back().layer && groups.back().name == layer) {
      for (const PlanParameter* q : by_module[m]) groups.back().params.push_back(q);
      continue;
    }
    Group g;
    g.name = layer.empty() ? m : layer;
    g.layer = !layer.empty();
    g.params = by_module[m];
    groups.push_back(std::move(g));
  }
  auto lineOf = [](const std::string& leaf, const PlanParameter& q, int width) {
    char line[512];
    std::snprintf(line, sizeof line, "    %-*s %-6s %-20s %-16s %s/rank\n", width, leaf.c_str(),
                  q.dtype.c_str(), shapeText(q.shape).c_str(),
                  mesh::toCompactString(q.placement).c_str(),
                  humanBytes(static_cast<double>(q.bytes_per_rank)).c_str());
    return std::string(line);
  };
  // A layer's lines relative to the layer (the same text for every alike layer).
  auto layerLines = [&](const Group& g) {
    int width = 16;
    for (const PlanParameter* q : g.params)
      width = std::max(width, static_cast<int>(q->name.size() - g.name.size() - 1));
    std::string text;
    for (const PlanParameter* q : g.params)
      text += lineOf(q->name.substr(g.name.size() + 1), *q, width);
    return text;
  };
  auto stem = [](const std::string& g) { return g.substr(0, g.rfind('.')); };
  for (size_t i = 0; i < groups.size();) {
    const Group& g = groups[i];
    if (!g.layer) {
      out += "  " + (g.name.empty() ? std::string("(top level)") : g.name) + "\n";
      for (const PlanParameter* q : g.params)
        out += lineOf(g.name.empty() ? q->name : q->name.substr(g.name.size() + 1), *q, 16);
      ++i;
      continue;
    }
    const std::string text = layerLines(g);
    size_t j = i + 1;
    while (j < groups.size() && groups[j].layer && stem(groups[j].name) == stem(g.name) &&
           layerLines(groups[j]) == text)
      ++j;
    if (j - i > 1)
      out += "  " + g.name + "-" + groups[j - 1].name.substr(stem(g.name).size() + 1) + " (" +
             std::to_string(j - i) + " layers placed alike, each)\n";
    else
      out += "  " + g.name + "\n";
    out += text;
    i = j;
  }

  const ProblemSizes& z = p.solver.sizes;
  out += "problem: " + withCommas(static_cast<int64_t>(z.nodes_before)) + " nodes, " +
         withCommas(static_cast<int64_t>(z.edges_before)) + " edges, " +
         withCommas(static_cast<int64_t>(z.strategies_before)) + " strategies; ";
  if (p.solver.reduce)
    out += "after reduction " + withCommas(static_cast<int64_t>(z.nodes_after)) + " nodes, " +
           withCommas(static_cast<int64_t>(z.edges_after)) + " edges, " +
           withCommas(static_cast<int64_t>(z.strategies_after)) + " strategies (" +
           std::to_string(z.clusters) + " repeated-layer cluster" + (z.clusters == 1 ? "" : "s") +
           ")\n";
  else
    out += "not reduced (--no-reduce)\n";
  std::string gap;
  if (p.solver.status != PlanStatus::kOptimal && p.solver.bound && p.solver.objective > 0)
    gap = printf1(" (proven gap %.3g%%)",
                  100.0 * (p.solver.objective - *p.solver.bound) / p.solver.objective);
  out +=
      "solver: " + p.solver.statusText() + ", objective " + printf1("%.6g", p.solver.objective) +
      ", bound " + (p.solver.bound ? printf1("%.6g", *p.solver.bound) : std::string("none")) + gap +
      ", " +
      // Step 0 (lib/solver/memory_search.h) and the reductions can decide every choice
      // before the ILP: say how, not "0 variables".
      (z.memory_subproblems > 0 && p.solver.variables == 0
           ? "no integer program: the memory row by Lagrangian relaxation and branch and bound (" +
                 withCommas(static_cast<int64_t>(z.memory_subproblems)) +
                 " memory-free subproblems, " +
                 withCommas(static_cast<int64_t>(z.memory_branches)) + " search node" +
                 (z.memory_branches == 1 ? "" : "s") + ")"
       : p.solver.variables == 0 && p.solver.reduce
           ? std::string("no integer program left (the reductions decided every choice)")
           : withCommas(p.solver.variables) + " variables, " + withCommas(p.solver.constraints) +
                 " constraints");
  if (timings) out += ", " + printf1("%.3f s", timings->solver_s);
  out += "\n";
  if (timings) {
    char line[256];
    std::snprintf(line, sizeof line,
                  "time: import %.3f s, enumerate %.3f s, build %.3f s, solve %.3f s, write %.3f "
                  "s (total %.3f s)\n",
                  timings->import_s, timings->enumerate_s, timings->build_s, timings->solve_s,
                  timings->write_s,
                  timings->import_s + timings->enumerate_s + timings->build_s + timings->solve_s +
                      timings->write_s);
    out += line;
  }
  return out;
}

std::string optimizerLog(const Plan& p) {
  std::string out;
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    const PlanNode& n = p.nodes[i];
    char line[1024];
    std::snprintf(line, sizeof line,
                  "#%-5zu %-25s %-28s %-28s placement=%s  cost=(comm %.3f, compute %.3f)\n", i,
                  displayName(n).c_str(), n.op.c_str(),
                  n.module_path.empty() ? "-" : n.module_path.c_str(),
                  std::string(trim(mesh::toSignatureString(n.input_placements, n.outputs))).c_str(),
                  n.comm_us, n.compute_us);
    out += line;
  }
  out += "total: comm " + formatMicros(p.totals.comm_us) + ", compute " +
         formatMicros(p.totals.compute_us) + ", step " + formatMicros(p.totals.total_us) + "\n";
  return out;
}

}  // namespace apc::plan
