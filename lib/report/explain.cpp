//===- lib/report/explain.cpp - Why the plan chose what it chose -------------===//
//
// Prices every alternative of one node with all other nodes at their chosen strategies (see
// apc/report/explain.h for the statuses), lists the costliest nodes, and draws the plan as
// Graphviz.
//
//===----------------------------------------------------------------------===//
#include "apc/report/explain.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>

#include "apc/cost/redistribute.h"
#include "apc/mesh/placement_json.h"
#include "apc/report/report.h"
#include "apc/support/strings.h"

namespace apc::plan {

namespace {

constexpr double kTieRelative = 1e-9;

bool nearlyEqual(double a, double b) {
  if (a == b) return true;
  if (!std::isfinite(a) || !std::isfinite(b)) return false;
  return std::abs(a - b) <= kTieRelative * std::max({std::abs(a), std::abs(b), 1e-300});
}

std::string us(double v) {
  if (!std::isfinite(v)) return "inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

/// Damerau-free edit distance for suggestions.
size_t editDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  std::iota(prev.begin(), prev.end(), 0);
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string suggestion(const std::string& name, const std::vector<std::string>& candidates) {
  std::vector<std::pair<size_t, std::string>> scored;
  for (const std::string& c : candidates) scored.emplace_back(editDistance(name, c), c);
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string out;
  for (size_t i = 0; i < scored.size() && i < 3; ++i) {
    if (scored[i].first > std::max<size_t>(3, name.size() / 2)) break;
    out += (out.empty() ? "" : ", ") + scored[i].second;
  }
  return out.empty() ? "" : " (did you mean " + out + "?)";
}

PlacementTuple firstOutput(const strategy::Strategy& s) {
  for (const auto& o : s.outputs)
    if (o) return *o;
  return {};
}

/// Why an edge between two strategies of token-local region nodes is closed (the solver takes a
/// region with one variant on all its nodes, apc/strategy/token_local.h), or empty.
std::string regionReason(const strategy::Strategy& from, const strategy::Strategy& to) {
  if (from.region_variant == to.region_variant || (!from.regionLocal() && !to.regionLocal()))
    return {};
  auto name = [](const strategy::Strategy& st) {
    return st.regionLocal() ? "token-local variant " + std::to_string(st.region_variant)
                            : std::string("a rule's strategy");
  };
  return "both ends are in a token-local region, which takes one variant on all its nodes (" +
         name(from) + " feeds " + name(to) + ")";
}

/// Why a producer's placement cannot reach what the consumer needs, when the graph is at hand.
std::string impossibleReason(const ir::Graph* g, const solver::GraphProblem& gp, uint32_t src,
                             uint32_t src_choice, uint32_t dst, uint32_t dst_choice, uint32_t input,
                             const mesh::DeviceMesh& m) {
  if (!g || !gp.graph_nodes[dst].valid()) return {};
  const ir::Node& consumer = g->node(gp.graph_nodes[dst]);
  if (input >= consumer.inputs.size()) return {};
  const ir::Value& v = g->value(consumer.inputs[input]);
  const auto& from_opt = gp.strategies[src][src_choice].outputs;
  const auto& to_opt = gp.strategies[dst][dst_choice].inputs;
  if (v.producer_output >= from_opt.size() || input >= to_opt.size()) return {};
  if (!from_opt[v.producer_output] || !to_opt[input]) return {};
  const ir::TensorMeta* meta = v.tensor             ? &*v.tensor
                               : v.elements.empty() ? nullptr
                                                    : &v.elements[0];
  if (!meta) return {};
  auto plan = cost::planRedistribution(*meta, *from_opt[v.producer_output], *to_opt[input], m);
  if (!plan.ok()) return plan.error().message();
  return plan->feasible ? std::string() : plan->infeasible_reason;
}

}  // namespace

const char* statusName(AlternativeStatus s) {
  switch (s) {
    case AlternativeStatus::kChosen:
      return "CHOSEN";
    case AlternativeStatus::kTie:
      return "TIE";
    case AlternativeStatus::kCheaperHereCostlierOverall:
      return "CHEAPER-HERE-BUT-COSTLIER-OVERALL";
    case AlternativeStatus::kCostlier:
      return "COSTLIER";
    case AlternativeStatus::kCheaperInContext:
      return "CHEAPER-IN-CONTEXT";
    case AlternativeStatus::kUnavailable:
      return "UNAVAILABLE";
  }
  return "?";
}

Expected<uint32_t> findNode(const Plan& p, const std::string& name) {
  for (size_t i = 0; i < p.nodes.size(); ++i)
    if (p.nodes[i].name == name) return static_cast<uint32_t>(i);
  // Accept "%name" as printed in logs.
  if (!name.empty() && name[0] == '%') return findNode(p, name.substr(1));
  std::vector<std::string> names;
  for (const PlanNode& n : p.nodes) names.push_back(n.name);
  return notFound("the plan has no node named '" + name + "'" + suggestion(name, names));
}

Expected<uint32_t> findModuleNode(const Plan& p, const std::string& path) {
  std::optional<uint32_t> best;
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    const std::string& m = p.nodes[i].module_path;
    bool under = m == path || (m.size() > path.size() && m.compare(0, path.size(), path) == 0 &&
                               m[path.size()] == '.');
    if (!under || p.nodes[i].kind == "parameter" || p.nodes[i].kind == "buffer") continue;
    if (!best || p.nodes[i].cost_us > p.nodes[*best].cost_us) best = static_cast<uint32_t>(i);
  }
  if (best) return *best;
  std::vector<std::string> modules;
  for (const PlanNode& n : p.nodes)
    if (!n.module_path.empty() && (modules.empty() || modules.back() != n.module_path))
      modules.push_back(n.module_path);
  std::sort(modules.begin(), modules.end());
  modules.erase(std::unique(modules.begin(), modules.end()), modules.end());
  return notFound("the plan has no op in module '" + path + "'" + suggestion(path, modules));
}

std::vector<uint32_t> costliestNodes(const Plan& p, size_t n) {
  std::vector<uint32_t> idx(p.nodes.size());
  std::iota(idx.begin(), idx.end(), 0u);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](uint32_t a, uint32_t b) { return p.nodes[a].cost_us > p.nodes[b].cost_us; });
  if (idx.size() > n) idx.resize(n);
  return idx;
}

Expected<NodeExplanation> explainNode(const Plan& p, const solver::GraphProblem& gp, uint32_t v,
                                      const ir::Graph* g) {
  const solver::Problem& prob = gp.problem;
  if (v >= p.nodes.size() || prob.nodes.size() != p.nodes.size())
    return invalidArgument("node " + std::to_string(v) + " is not in the plan's problem");
  std::vector<uint32_t> choice;
  for (const PlanNode& n : p.nodes) choice.push_back(n.strategy_index);
  for (size_t i = 0; i < choice.size(); ++i)
    if (choice[i] >= prob.nodes[i].numStrategies())
      return invalidArgument("the plan's choice for node " + std::to_string(i) +
                             " is out of range for the problem");
  const solver::ProblemNode& pn = prob.nodes[v];
  const PlanNode& node = p.nodes[v];
  NodeExplanation ex;
  ex.node = v;
  ex.name = node.name;
  ex.op = node.op;
  ex.module_path = node.module_path;

  double mem_now = solver::memoryOf(prob, choice);
  for (uint32_t s = 0; s < pn.numStrategies(); ++s) {
    Alternative a;
    a.index = s;
    const strategy::Strategy& st = gp.strategies[v][s];
    a.strategy = std::string(trim(st.toString()));
    a.output_placements = firstOutput(st);
    a.compute_us = pn.costs[s];
    std::string blocked;
    for (size_t k = 0; k < prob.edges.size(); ++k) {
      const solver::ProblemEdge& e = prob.edges[k];
      if (e.dst == v) {
        double c = e.cost(choice[e.src], s, pn.numStrategies());
        a.in_comm_us += c;
        if (!std::isfinite(c) && blocked.empty()) {
          const auto& need =
              st.inputs.size() > gp.edge_input[k] ? st.inputs[gp.edge_input[k]] : std::nullopt;
          blocked = "input " + std::to_string(gp.edge_input[k]) + " from " +
                    displayName(p.nodes[e.src]) + " (" +
                    mesh::toCompactString(p.nodes[e.src].outputPlacements()) + ") cannot become " +
                    (need ? mesh::toCompactString(*need) : std::string("a tensor"));
          std::string r = regionReason(gp.strategies[e.src][choice[e.src]], st);
          if (r.empty())
            r = impossibleReason(g, gp, e.src, choice[e.src], v, s, gp.edge_input[k], p.spec.mesh);
          if (!r.empty()) blocked += ": " + r;
        }
      }
      if (e.src == v) {
        size_t nt = prob.nodes[e.dst].numStrategies();
        double c = e.cost(s, choice[e.dst], nt);
        a.out_comm_us += c;
        if (!std::isfinite(c) && blocked.empty()) {
          const auto& need = gp.strategies[e.dst][choice[e.dst]].inputs;
          uint32_t in = gp.edge_input[k];
          blocked = displayName(p.nodes[e.dst]) + " (input " + std::to_string(in) + ") needs " +
                    (in < need.size() && need[in] ? mesh::toCompactString(*need[in])
                                                  : std::string("another placement")) +
                    ", which cannot be made from " + mesh::toCompactString(a.output_placements);
          std::string r = regionReason(st, gp.strategies[e.dst][choice[e.dst]]);
          if (r.empty()) r = impossibleReason(g, gp, v, s, e.dst, choice[e.dst], in, p.spec.mesh);
          if (!r.empty()) blocked += ": " + r;
        }
      }
    }
    a.here_us = a.compute_us + a.in_comm_us;
    a.context_us = a.here_us + a.out_comm_us;
    if (!pn.memory.empty()) a.param_bytes_per_rank = std::llround(pn.memory[s]);

    if (s == choice[v]) {
      a.status = AlternativeStatus::kChosen;
      a.why = "the plan's choice";
      if (pn.pinned) a.why += " (pinned by the '" + pn.pin_group + "' constraints)";
    } else if (pn.pinned && *pn.pinned != s) {
      a.status = AlternativeStatus::kUnavailable;
      a.why = "pinned to " + std::string(trim(gp.strategies[v][*pn.pinned].toString())) +
              " by the '" + (pn.pin_group.empty() ? "pins" : pn.pin_group) + "' constraints";
    } else if (!std::isfinite(a.compute_us)) {
      a.status = AlternativeStatus::kUnavailable;
      a.why = "no finite compute cost";
    } else if (!blocked.empty()) {
      a.status = AlternativeStatus::kUnavailable;
      a.why = blocked;
    } else if (prob.memory && !pn.memory.empty()) {
      double mem = mem_now - pn.memory[choice[v]] + pn.memory[s];
      if (mem > prob.memory->high * (1 + 1e-12) || mem < prob.memory->low * (1 - 1e-12)) {
        a.status = AlternativeStatus::kUnavailable;
        a.why = "parameter memory would be " + humanBytes(mem) + " per rank, outside the budget [" +
                humanBytes(prob.memory->low) + ", " + humanBytes(prob.memory->high) + "]";
      }
    }
    ex.alternatives.push_back(std::move(a));
  }

  const Alternative& chosen = ex.alternatives[choice[v]];
  for (Alternative& a : ex.alternatives) {
    a.delta_us = a.status == AlternativeStatus::kUnavailable ? solver::kInfinity
                                                             : a.context_us - chosen.context_us;
    if (a.index == chosen.index || a.status == AlternativeStatus::kUnavailable) continue;
    if (nearlyEqual(a.context_us, chosen.context_us)) {
      a.status = AlternativeStatus::kTie;
      a.why = "the same cost in context as the chosen strategy";
    } else if (a.context_us < chosen.context_us) {
      a.status = AlternativeStatus::kCheaperInContext;
      a.why =
          formatSignedMicros(a.delta_us) + " in context; the solver's status is '" +
          p.solver.statusText() + "'" +
          (p.solver.status == PlanStatus::kOptimal ? " (a tie within the solver's tolerance)" : "");
    } else if (a.here_us < chosen.here_us && !nearlyEqual(a.here_us, chosen.here_us)) {
      a.status = AlternativeStatus::kCheaperHereCostlierOverall;
      a.why = formatSignedMicros(a.here_us - chosen.here_us) + " here, but the consumers pay " +
              formatSignedMicros(a.out_comm_us - chosen.out_comm_us) +
              " to redistribute its output: " + formatSignedMicros(a.delta_us) + " overall";
    } else {
      a.status = AlternativeStatus::kCostlier;
      a.why = "compute " + formatSignedMicros(a.compute_us - chosen.compute_us) + ", comm in " +
              formatSignedMicros(a.in_comm_us - chosen.in_comm_us) + ", comm out " +
              formatSignedMicros(a.out_comm_us - chosen.out_comm_us);
    }
  }
  uint32_t chosen_index = chosen.index;
  std::stable_sort(ex.alternatives.begin(), ex.alternatives.end(),
                   [&](const Alternative& a, const Alternative& b) {
                     auto key = [&](const Alternative& x) {
                       int rank = x.index == chosen_index                       ? 0
                                  : x.status == AlternativeStatus::kUnavailable ? 2
                                                                                : 1;
                       return std::pair(
                           rank, x.status == AlternativeStatus::kUnavailable ? 0.0 : x.context_us);
                     };
                     return key(a) < key(b);
                   });
  return ex;
}

std::string topNodesText(const Plan& p, size_t n) {
  std::string out;
  const PlanTotals& t = p.totals;
  out += "plan of " + p.model.model_name + " on " + p.spec.mesh.toString() + ": step " +
         formatMicros(t.total_us) + " (compute " + formatMicros(t.compute_us) + ", comm " +
         formatMicros(t.comm_us) +
         (t.recompute_us > 0 ? ", recompute " + formatMicros(t.recompute_us) : "") + "), solver " +
         p.solver.statusText() + "\n";
  std::vector<uint32_t> top = costliestNodes(p, n);
  out += "costliest " + std::to_string(top.size()) + " of " + std::to_string(p.nodes.size()) +
         " nodes:\n";
  char line[1024];
  std::snprintf(line, sizeof line, "  %-6s %-24s %-24s %-28s %-24s %12s %12s %12s %6s\n", "node",
                "name", "op", "module", "placement", "compute_us", "comm_us", "cost_us", "share");
  out += line;
  for (uint32_t i : top) {
    const PlanNode& x = p.nodes[i];
    double share = t.total_us > 0 ? 100 * x.cost_us / t.total_us : 0;
    std::snprintf(
        line, sizeof line, "  #%-5u %-24s %-24s %-28s %-24s %12.3f %12.3f %12.3f %5.1f%%\n", i,
        displayName(x).c_str(), x.op.c_str(), x.module_path.empty() ? "-" : x.module_path.c_str(),
        x.strategy.c_str(), x.compute_us, x.comm_us, x.cost_us, share);
    out += line;
  }
  return out;
}

std::vector<ModuleCost> costliestModules(const Plan& p, size_t n) {
  // Row key: the stem of a repeated layer ("layers" of "layers.3"), else the first component.
  std::vector<std::string> order;
  std::map<std::string, ModuleCost> rows;
  std::map<std::string, std::vector<std::string>> layers;  // row -> its layers, in order
  for (const PlanNode& x : p.nodes) {
    const std::string layer = repeatedLayerOf(x.module_path);
    const std::string key =
        layer.empty() ? moduleGroupOf(x.module_path) : layer.substr(0, layer.rfind('.')) + ".#";
    auto [it, fresh] = rows.try_emplace(key);
    if (fresh) order.push_back(key);
    ModuleCost& r = it->second;
    ++r.nodes;
    r.compute_us += x.compute_us;
    r.comm_us += x.comm_us;
    r.cost_us += x.cost_us;
    if (!layer.empty()) {
      auto& ls = layers[key];
      if (std::find(ls.begin(), ls.end(), layer) == ls.end()) ls.push_back(layer);
    }
  }
  std::vector<ModuleCost> out;
  for (const std::string& key : order) {
    ModuleCost r = rows[key];
    r.module = key;
    if (auto it = layers.find(key); it != layers.end()) {
      const std::string stem = key.substr(0, key.size() - 2);
      auto index = [&](const std::string& l) { return l.substr(stem.size() + 1); };
      r.layers = static_cast<int>(it->second.size());
      r.module = it->second.size() == 1
                     ? it->second.front()
                     : stem + "." + index(it->second.front()) + "-" + index(it->second.back());
    }
    out.push_back(std::move(r));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const ModuleCost& a, const ModuleCost& b) { return a.cost_us > b.cost_us; });
  if (out.size() > n) out.resize(n);
  return out;
}

std::string topModulesText(const Plan& p, size_t n) {
  const PlanTotals& t = p.totals;
  std::string out = "plan of " + p.model.model_name + " on " + p.spec.mesh.toString() + ": step " +
                    formatMicros(t.total_us) + " (compute " + formatMicros(t.compute_us) +
                    ", comm " + formatMicros(t.comm_us) +
                    (t.recompute_us > 0 ? ", recompute " + formatMicros(t.recompute_us) : "") +
                    "), solver " + p.solver.statusText() + "\n";
  std::vector<ModuleCost> rows = costliestModules(p, n);
  out += "costliest " + std::to_string(rows.size()) +
         " modules (a stack of repeated layers is "
         "one row):\n";
  char line[1024];
  std::snprintf(line, sizeof line, "  %-32s %7s %7s %14s %14s %14s %6s\n", "module", "layers",
                "nodes", "compute_us", "comm_us", "cost_us", "share");
  out += line;
  for (const ModuleCost& r : rows) {
    const double share = t.total_us > 0 ? 100 * r.cost_us / t.total_us : 0;
    std::snprintf(line, sizeof line, "  %-32s %7d %7d %14.3f %14.3f %14.3f %5.1f%%\n",
                  r.module.c_str(), r.layers, r.nodes, r.compute_us, r.comm_us, r.cost_us, share);
    out += line;
  }
  return out;
}

std::string explanationText(const Plan& p, const NodeExplanation& e) {
  const PlanNode& n = p.nodes[e.node];
  std::string out = "node #" + std::to_string(e.node) + " " + displayName(n) + "  " + e.op + "  " +
                    (e.module_path.empty() ? "-" : e.module_path) + ": " +
                    std::to_string(e.alternatives.size()) + " strateg" +
                    (e.alternatives.size() == 1 ? "y" : "ies") + ", chosen " + n.strategy + "\n";
  out +=
      "  costs in context: every other node keeps its chosen strategy; here = compute + comm "
      "in, context = here + comm out\n";
  char line[1024];
  std::snprintf(line, sizeof line, "  %-34s %-36s %11s %11s %11s %11s %12s  %s\n", "status",
                "strategy", "compute", "comm_in", "comm_out", "context", "delta", "why");
  out += line;
  for (const Alternative& a : e.alternatives) {
    std::snprintf(
        line, sizeof line, "  %-34s %-36s %11s %11s %11s %11s %12s  %s\n", statusName(a.status),
        a.strategy.c_str(), us(a.compute_us).c_str(), us(a.in_comm_us).c_str(),
        us(a.out_comm_us).c_str(), us(a.context_us).c_str(),
        a.status == AlternativeStatus::kChosen ? "-" : formatSignedMicros(a.delta_us).c_str(),
        a.why.c_str());
    out += line;
  }
  return out;
}

nlohmann::json explainJson(const Plan& p, size_t top, const NodeExplanation* e) {
  using nlohmann::json;
  auto num = [](double x) { return std::isfinite(x) ? json(canonicalNumber(x)) : json(nullptr); };
  json top_list = json::array();
  for (uint32_t i : costliestNodes(p, top)) {
    const PlanNode& n = p.nodes[i];
    top_list.push_back({{"index", i},
                        {"name", n.name},
                        {"op", n.op},
                        {"module_path", n.module_path},
                        {"strategy", n.strategy},
                        {"output_placements", mesh::toJson(n.outputPlacements())},
                        {"compute_us", num(n.compute_us)},
                        {"comm_us", num(n.comm_us)},
                        {"cost_us", num(n.cost_us)}});
  }
  json j = {{"model", p.model.model_name},
            {"content_hash", p.content_hash},
            {"totals",
             {{"compute_us", num(p.totals.compute_us)},
              {"comm_us", num(p.totals.comm_us)},
              {"total_us", num(p.totals.total_us)}}},
            {"top", top_list}};
  if (e) {
    json alts = json::array();
    for (const Alternative& a : e->alternatives) {
      json x = {{"index", a.index},
                {"strategy", a.strategy},
                {"output_placements", mesh::toJson(a.output_placements)},
                {"compute_us", num(a.compute_us)},
                {"in_comm_us", num(a.in_comm_us)},
                {"out_comm_us", num(a.out_comm_us)},
                {"here_us", num(a.here_us)},
                {"context_us", num(a.context_us)},
                {"delta_us", num(a.delta_us)},
                {"status", statusName(a.status)},
                {"why", a.why}};
      if (a.param_bytes_per_rank) x["param_bytes_per_rank"] = *a.param_bytes_per_rank;
      alts.push_back(std::move(x));
    }
    j["node"] = {{"index", e->node},
                 {"name", e->name},
                 {"op", e->op},
                 {"module_path", e->module_path},
                 {"alternatives", alts}};
  }
  return j;
}

Expected<TargetExplanation> explainTarget(const Plan& p, const solver::GraphProblem& gp,
                                          const PlacementTuple& target) {
  const solver::Problem& prob = gp.problem;
  if (target.size() != p.spec.mesh.ndim())
    return invalidArgument(
        "target " + mesh::toCompactString(target) + " has " + std::to_string(target.size()) +
        " entr" + (target.size() == 1 ? "y" : "ies") + " but the mesh " + p.spec.mesh.toString() +
        " has " + std::to_string(p.spec.mesh.ndim()) + " dims");
  if (prob.nodes.size() != p.nodes.size() || gp.strategies.size() != p.nodes.size())
    return invalidArgument("the problem does not match the plan");
  std::vector<uint32_t> choice;
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    choice.push_back(p.nodes[i].strategy_index);
    if (choice[i] >= prob.nodes[i].numStrategies())
      return invalidArgument("the plan's choice for node " + std::to_string(i) +
                             " is out of range for the problem");
  }
  // Each node's edges, once: in-edges price a strategy here, out-edges say whether the chosen
  // consumers can still be fed.
  std::vector<std::vector<size_t>> in_edges(p.nodes.size()), out_edges(p.nodes.size());
  for (size_t k = 0; k < prob.edges.size(); ++k) {
    in_edges[prob.edges[k].dst].push_back(k);
    out_edges[prob.edges[k].src].push_back(k);
  }
  const double mem_now = solver::memoryOf(prob, choice);
  TargetExplanation out;
  out.target = target;
  for (uint32_t v = 0; v < p.nodes.size(); ++v) {
    const solver::ProblemNode& pn = prob.nodes[v];
    const size_t ns = pn.numStrategies();
    auto here = [&](uint32_t s) {
      double c = pn.costs[s];
      for (size_t k : in_edges[v]) {
        const solver::ProblemEdge& e = prob.edges[k];
        c += e.cost(choice[e.src], s, ns);
      }
      return c;
    };
    // Why strategy s cannot be taken with the neighbours at their choices ("" when it can).
    auto blocked = [&](uint32_t s, double here_us) -> std::string {
      if (pn.pinned && *pn.pinned != s)
        return "pinned by the '" + (pn.pin_group.empty() ? std::string("pins") : pn.pin_group) +
               "' constraints";
      if (!std::isfinite(here_us)) return "no finite cost with its producers' placements";
      for (size_t k : out_edges[v]) {
        const solver::ProblemEdge& e = prob.edges[k];
        if (!std::isfinite(e.cost(s, choice[e.dst], prob.nodes[e.dst].numStrategies())))
          return displayName(p.nodes[e.dst]) + " cannot take that output";
      }
      if (prob.memory && !pn.memory.empty()) {
        const double mem = mem_now - pn.memory[choice[v]] + pn.memory[s];
        if (mem > prob.memory->high * (1 + 1e-12) || mem < prob.memory->low * (1 - 1e-12))
          return "parameter memory would leave the budget";
      }
      return {};
    };
    const PlanNode& n = p.nodes[v];
    TargetRow r;
    r.node = v;
    r.name = displayName(n);
    r.op = n.op;
    r.module_path = n.module_path;
    r.chosen_strategy = n.strategy;
    r.current_us = here(choice[v]);
    r.already = firstOutput(gp.strategies[v][choice[v]]) == target;
    std::string first_block;
    bool any = false;
    for (uint32_t s = 0; s < ns; ++s) {
      if (!(firstOutput(gp.strategies[v][s]) == target)) continue;
      any = true;
      const double c = here(s);
      if (std::string b = blocked(s, c); !b.empty()) {
        if (first_block.empty()) first_block = b;
        continue;
      }
      if (!r.target_index || c < r.target_us) {
        r.target_index = s;
        r.target_us = c;
      }
    }
    if (r.target_index) {
      r.target_strategy = std::string(trim(gp.strategies[v][*r.target_index].toString()));
      r.delta_us = r.target_us - r.current_us;
      out.total_delta_us += r.delta_us;
      ++out.can;
    } else {
      r.why = !any ? "no strategy outputs " + mesh::toCompactString(target)
                   : "every strategy that outputs " + mesh::toCompactString(target) +
                         " is unavailable (" + first_block + ")";
    }
    out.already += r.already;
    out.current_us += r.current_us;
    out.rows.push_back(std::move(r));
  }
  return out;
}

std::string targetText(const TargetExplanation& t) {
  const std::string target = mesh::toCompactString(t.target);
  std::string out = "target " + target + ": " + std::to_string(t.can) + " of " +
                    std::to_string(t.rows.size()) + " nodes can output it (" +
                    std::to_string(t.already) + " already do); node by node, " + "total delta " +
                    formatSignedMicros(t.total_delta_us) + " on a step of " +
                    formatMicros(t.current_us) + "\n";
  out +=
      "  node-local: each node priced alone with every other node at its chosen strategy (cost = "
      "compute + comm in);\n  what consumers would pay to take the new output is not counted, "
      "so the total is not a plan's step\n";
  char line[1024];
  std::snprintf(line, sizeof line, "  %-6s %-24s %-22s %-30s %12s %-30s %12s %12s  %s\n", "node",
                "name", "op", "chosen", "current_us", "target strategy", "target_us", "delta",
                "why");
  out += line;
  for (const TargetRow& r : t.rows) {
    std::snprintf(line, sizeof line, "  #%-5u %-24s %-22s %-30s %12s %-30s %12s %12s  %s\n", r.node,
                  r.name.c_str(), r.op.c_str(), r.chosen_strategy.c_str(), us(r.current_us).c_str(),
                  r.target_index ? r.target_strategy.c_str() : "-",
                  r.target_index ? us(r.target_us).c_str() : "-",
                  r.target_index ? formatSignedMicros(r.delta_us).c_str() : "-",
                  r.already ? "already outputs it" : r.why.c_str());
    out += line;
  }
  return out;
}

nlohmann::json targetJson(const Plan& p, const TargetExplanation& t) {
  using nlohmann::json;
  auto num = [](double x) { return std::isfinite(x) ? json(canonicalNumber(x)) : json(nullptr); };
  json rows = json::array();
  for (const TargetRow& r : t.rows) {
    json x = {{"index", r.node},
              {"name", p.nodes[r.node].name},
              {"op", r.op},
              {"module_path", r.module_path},
              {"chosen_strategy", r.chosen_strategy},
              {"current_us", num(r.current_us)},
              {"already", r.already},
              {"target_strategy", r.target_index ? json(r.target_strategy) : json(nullptr)},
              {"target_us", r.target_index ? num(r.target_us) : json(nullptr)},
              {"delta_us", r.target_index ? num(r.delta_us) : json(nullptr)}};
    if (!r.why.empty()) x["why"] = r.why;
    rows.push_back(std::move(x));
  }
  return {{"model", p.model.model_name},
          {"content_hash", p.content_hash},
          {"target", mesh::toCompactString(t.target)},
          {"node_local", true},
          {"nodes_that_can", t.can},
          {"nodes_already", t.already},
          {"current_us", num(t.current_us)},
          {"total_delta_us", num(t.total_delta_us)},
          {"nodes", rows}};
}

Expected<RedistributionMatrix> redistributionMatrix(const Plan& p, const solver::GraphProblem& gp,
                                                    uint32_t v, uint32_t input,
                                                    const ir::Graph* g) {
  const solver::Problem& prob = gp.problem;
  if (v >= p.nodes.size() || prob.nodes.size() != p.nodes.size())
    return invalidArgument("node " + std::to_string(v) + " is not in the plan's problem");
  std::optional<size_t> edge;
  std::vector<uint32_t> inputs;  // the node's inputs that have a producer edge
  for (size_t k = 0; k < prob.edges.size(); ++k) {
    if (prob.edges[k].dst != v) continue;
    inputs.push_back(gp.edge_input[k]);
    if (gp.edge_input[k] == input && !edge) edge = k;
  }
  const PlanNode& n = p.nodes[v];
  if (!edge) {
    std::sort(inputs.begin(), inputs.end());
    return notFound("input " + std::to_string(input) + " of " + displayName(n) +
                    " has no producer to redistribute from" +
                    (inputs.empty() ? std::string(" (the node has no tensor inputs)")
                                    : " (inputs with one: " + joinMap(inputs, ", ", [](uint32_t i) {
                                        return std::to_string(i);
                                      }) + ")"));
  }
  const solver::ProblemEdge& e = prob.edges[*edge];
  const size_t nt = prob.nodes[v].numStrategies();
  const uint32_t src = e.src;
  const uint32_t cs = p.nodes[src].strategy_index, ct = n.strategy_index;
  if (cs >= prob.nodes[src].numStrategies() || ct >= nt)
    return invalidArgument("the plan's choices are out of range for the problem");
  // The producer output that feeds this input: the graph says which, else its first.
  std::optional<size_t> fed;
  if (g && gp.graph_nodes[v].valid()) {
    const ir::Node& consumer = g->node(gp.graph_nodes[v]);
    if (input < consumer.inputs.size()) fed = g->value(consumer.inputs[input]).producer_output;
  }
  auto outputOf = [&](uint32_t s) {
    const auto& outs = gp.strategies[src][s].outputs;
    if (fed && *fed < outs.size() && outs[*fed]) return *outs[*fed];
    return firstOutput(gp.strategies[src][s]);
  };
  auto needOf = [&](uint32_t t) {
    const auto& ins = gp.strategies[v][t].inputs;
    return input < ins.size() && ins[input] ? *ins[input] : PlacementTuple{};
  };
  RedistributionMatrix m;
  m.node = v;
  m.input = input;
  m.producer = src;
  // Rows and columns by distinct placement, the chosen strategies' first so that the chosen
  // pair's cell holds exactly the chosen pair's price.
  std::map<PlacementTuple, size_t> row_of, col_of;
  std::vector<uint32_t> row_strategy, col_strategy;
  auto addRow = [&](uint32_t s) {
    if (row_of.emplace(outputOf(s), m.rows.size()).second) {
      m.rows.push_back(outputOf(s));
      row_strategy.push_back(s);
    }
  };
  auto addCol = [&](uint32_t t) {
    if (col_of.emplace(needOf(t), m.columns.size()).second) {
      m.columns.push_back(needOf(t));
      col_strategy.push_back(t);
    }
  };
  addRow(cs);
  addCol(ct);
  for (uint32_t s = 0; s < prob.nodes[src].numStrategies(); ++s) addRow(s);
  for (uint32_t t = 0; t < nt; ++t) addCol(t);
  // Rows and columns sorted by placement (deterministic), the chosen pair found again after.
  std::vector<size_t> ro(m.rows.size()), co(m.columns.size());
  std::iota(ro.begin(), ro.end(), 0);
  std::iota(co.begin(), co.end(), 0);
  std::sort(ro.begin(), ro.end(), [&](size_t a, size_t b) { return m.rows[a] < m.rows[b]; });
  std::sort(co.begin(), co.end(), [&](size_t a, size_t b) { return m.columns[a] < m.columns[b]; });
  RedistributionMatrix sorted = m;
  sorted.rows.clear();
  sorted.columns.clear();
  for (size_t i = 0; i < ro.size(); ++i) {
    sorted.rows.push_back(m.rows[ro[i]]);
    if (ro[i] == 0) sorted.chosen_row = i;
  }
  for (size_t j = 0; j < co.size(); ++j) {
    sorted.columns.push_back(m.columns[co[j]]);
    if (co[j] == 0) sorted.chosen_column = j;
  }
  sorted.us.assign(ro.size(), std::vector<double>(co.size(), 0));
  for (size_t i = 0; i < ro.size(); ++i)
    for (size_t j = 0; j < co.size(); ++j)
      sorted.us[i][j] = e.cost(row_strategy[ro[i]], col_strategy[co[j]], nt);
  sorted.charged_us = 0;
  for (const PlanEdge& pe : n.in_edges)
    if (pe.from == src && pe.input == input) sorted.charged_us = pe.cost_us;
  return sorted;
}

std::string matrixText(const Plan& p, const RedistributionMatrix& m) {
  const PlanNode& n = p.nodes[m.node];
  std::string out = "redistribution into input " + std::to_string(m.input) + " of #" +
                    std::to_string(m.node) + " " + displayName(n) + " (" + n.op + ") from #" +
                    std::to_string(m.producer) + " " + displayName(p.nodes[m.producer]) +
                    ", us (forward + backward):\n";
  out += "  rows: the producer's output placement; columns: the placement " + displayName(n) +
         "'s strategies need; * the plan's pair (charged " + us(m.charged_us) + " us)\n";
  size_t w = 10;
  for (const PlacementTuple& t : m.rows) w = std::max(w, mesh::toCompactString(t).size());
  size_t cw = 11;
  for (const PlacementTuple& t : m.columns) cw = std::max(cw, mesh::toCompactString(t).size() + 1);
  char cell[128];
  std::snprintf(cell, sizeof cell, "  %-*s", static_cast<int>(w), "from \\ to");
  out += cell;
  for (const PlacementTuple& t : m.columns) {
    std::snprintf(cell, sizeof cell, " %*s", static_cast<int>(cw),
                  mesh::toCompactString(t).c_str());
    out += cell;
  }
  out += "\n";
  for (size_t i = 0; i < m.rows.size(); ++i) {
    std::snprintf(cell, sizeof cell, "  %-*s", static_cast<int>(w),
                  mesh::toCompactString(m.rows[i]).c_str());
    out += cell;
    for (size_t j = 0; j < m.columns.size(); ++j) {
      const bool chosen = i == m.chosen_row && j == m.chosen_column;
      std::snprintf(cell, sizeof cell, " %*s", static_cast<int>(cw),
                    (us(m.us[i][j]) + (chosen ? "*" : "")).c_str());
      out += cell;
    }
    out += "\n";
  }
  return out;
}

nlohmann::json matrixJson(const Plan& p, const RedistributionMatrix& m) {
  using nlohmann::json;
  auto num = [](double x) { return std::isfinite(x) ? json(canonicalNumber(x)) : json(nullptr); };
  json rows = json::array(), cols = json::array(), cells = json::array();
  for (const PlacementTuple& t : m.rows) rows.push_back(mesh::toCompactString(t));
  for (const PlacementTuple& t : m.columns) cols.push_back(mesh::toCompactString(t));
  for (const auto& r : m.us) {
    json row = json::array();
    for (double x : r) row.push_back(num(x));
    cells.push_back(std::move(row));
  }
  return {{"node", {{"index", m.node}, {"name", p.nodes[m.node].name}}},
          {"input", m.input},
          {"producer", {{"index", m.producer}, {"name", p.nodes[m.producer].name}}},
          {"rows", rows},
          {"columns", cols},
          {"us", cells},
          {"chosen", {{"row", m.chosen_row}, {"column", m.chosen_column}}},
          {"charged_us", num(m.charged_us)}};
}

namespace {

std::string dotEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

namespace {

/// The first `depth` components of a module path ("layers.0.attention", 2 -> "layers.0").
std::string truncatePath(const std::string& path, size_t depth) {
  if (depth == 0 || path.empty()) return path;
  size_t pos = 0;
  for (size_t k = 0; k < depth; ++k) {
    pos = path.find('.', pos);
    if (pos == std::string::npos) return path;
    if (k + 1 < depth) ++pos;
  }
  return path.substr(0, pos);
}

/// A module path's parent ("layers.0.attention" -> "layers.0"; "layers" -> "").
std::string parentPath(const std::string& path) {
  size_t dot = path.rfind('.');
  return dot == std::string::npos ? std::string() : path.substr(0, dot);
}

}  // namespace

std::string placementColour(const std::string& placement) {
  // By the placement's entries, not a hash (a hash into 12 colours gave S(0)S(0) and S(1)S(1) one
  // blue in the 8B plan). Each entry is a digit, mesh dim 0 first: R 0, S(0)-S(2) 1-3, S(3+) 4,
  // P 5; the code is the digits in base 6 (0-35 on a 2-d mesh, taken modulo 36 beyond). Code k
  // has hue (k mod 12) * 5 mod 12 steps of 30 degrees (stride 5, coprime with 12, puts
  // neighbouring codes far apart) and one of three lightnesses by k / 12: every placement of a 1-d
  // or 2-d mesh has a colour of its own. Replicated is grey, none white.
  if (placement.empty() || placement == "-") return "#ffffff";
  if (placement.find_first_not_of('R') == std::string::npos) return "#d9d9d9";
  size_t code = 0;
  for (size_t i = 0; i < placement.size(); ++i) {
    const char ch = placement[i];
    int d = -1;
    if (ch == 'R') {
      d = 0;
    } else if (ch == 'S' || ch == 'P') {
      d = 5;
      if (ch == 'S') {
        d = 4;
        if (i + 2 < placement.size() && std::isdigit(static_cast<unsigned char>(placement[i + 2])))
          d = std::min(4, 1 + std::atoi(placement.c_str() + i + 2));
      }
      if (i + 1 < placement.size() && placement[i + 1] == '(')
        if (size_t close = placement.find(')', i); close != std::string::npos) i = close;
    }
    if (d >= 0) code = (code * 6 + static_cast<size_t>(d)) % 36;
  }
  const double hue = 30.0 * static_cast<double>((code % 12) * 5 % 12);
  const double light = code < 12 ? 0.84 : code < 24 ? 0.72 : 0.6, sat = 0.65;
  // HSL to RGB.
  const double c = (1 - std::fabs(2 * light - 1)) * sat;
  const double hp = hue / 60.0;
  const double x = c * (1 - std::fabs(std::fmod(hp, 2.0) - 1));
  double r = 0, g = 0, b = 0;
  if (hp < 1) {
    r = c, g = x;
  } else if (hp < 2) {
    r = x, g = c;
  } else if (hp < 3) {
    g = c, b = x;
  } else if (hp < 4) {
    g = x, b = c;
  } else if (hp < 5) {
    r = x, b = c;
  } else {
    r = c, b = x;
  }
  const double m = light - c / 2;
  auto byte = [&](double v) { return static_cast<int>(std::lround((v + m) * 255)); };
  char out[8];
  std::snprintf(out, sizeof out, "#%02x%02x%02x", byte(r), byte(g), byte(b));
  return out;
}

std::vector<std::string> pictureMarks() {
  return {
      "Placement, one entry per mesh dim, mesh dim 0 first (S(0)R): S(d): tensor dim d split over "
      "that mesh dim; R: replicated; P: partial sums (P(max): partial maxima).",
      "Colour: the node's output placement, one colour per placement of a 1-d or 2-d mesh, the "
      "same in every plan (grey replicated).",
      "Red border or edge: the node's inputs are redistributed; AG all-gather, AR all-reduce, RS "
      "reduce-scatter, A2A all-to-all, (dp) the mesh dim, bwd in backward; bytes, then us.",
      "Boxes are ops; rounded shapes parameters, buffers, inputs and outputs; a dashed box counts "
      "repeated layers placed like the layer drawn above it.",
  };
}

std::string dotGraph(const Plan& p, const DotOptions& options) {
  auto isParam = [](const PlanNode& n) { return n.kind == "parameter" || n.kind == "buffer"; };
  auto shown = [&](const PlanNode& n) { return options.parameters || !isParam(n); };
  std::set<std::string> colour;  // the output placements drawn, for the legend
  for (const PlanNode& n : p.nodes)
    if (shown(n)) colour.insert(mesh::toCompactString(n.outputPlacements()));

  // Which box each node is drawn in: itself ("n<i>"), or, when its module path is deeper than
  // collapse_depth, the box of its module truncated to that depth ("m<k>").
  std::vector<std::string> box(p.nodes.size());
  struct Collapsed {
    size_t ops = 0;
    double cost_us = 0;
  };
  std::map<std::string, Collapsed> collapsed;  // truncated module path -> totals
  std::vector<std::string> box_path(p.nodes.size());
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    const PlanNode& n = p.nodes[i];
    box[i] = "n" + std::to_string(i);
    if (options.collapse_depth == 0 || n.module_path.empty()) continue;
    std::string top = truncatePath(n.module_path, options.collapse_depth);
    if (top == n.module_path) continue;
    Collapsed& c = collapsed[top];
    if (n.kind == "op") ++c.ops;
    c.cost_us += n.cost_us;
    box_path[i] = top;
  }
  {
    std::map<std::string, std::string> ids;
    size_t m = 0;
    for (const auto& [path, c] : collapsed) ids[path] = "m" + std::to_string(m++);
    for (size_t i = 0; i < p.nodes.size(); ++i)
      if (!box_path[i].empty()) box[i] = ids[box_path[i]];
  }

  // Module clusters: every drawn node or collapsed box under its module path (and the paths
  // above it, nested).
  std::map<std::string, std::vector<std::string>> members;  // module path -> node statements
  std::set<std::string> paths;
  std::map<std::string, size_t> first_seen;  // module path -> order of first appearance
  auto addPath = [&](std::string path) {
    while (!path.empty()) {
      paths.insert(path);
      first_seen.emplace(path, first_seen.size());
      path = parentPath(path);
    }
  };
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    const PlanNode& n = p.nodes[i];
    if (!shown(n) || box[i][0] != 'n') continue;
    std::string placement = mesh::toCompactString(n.outputPlacements());
    std::string label = dotEscape(displayName(n));
    if (!isParam(n)) label += "\\n" + dotEscape(n.op);
    label += "\\n" + dotEscape(placement);
    if (n.cost_us > 0) label += "  " + dotEscape(formatMicros(n.cost_us));
    std::string shape = n.kind == "op" ? ""
                        : isParam(n)   ? ", shape=ellipse, fontsize=8"
                                       : ", shape=ellipse";
    std::string stmt = box[i] + " [label=\"" + label + "\", fillcolor=\"" +
                       placementColour(placement) + "\"" + shape + "];";
    std::string where = options.modules ? n.module_path : std::string();
    members[where].push_back(stmt);
    if (options.modules) addPath(where);
  }
  {
    size_t m = 0;
    for (const auto& [path, c] : collapsed) {
      std::string label = dotEscape(path) + "\\n" + std::to_string(c.ops) + " ops  " +
                          dotEscape(formatMicros(c.cost_us));
      std::string stmt = "m" + std::to_string(m++) + " [label=\"" + label +
                         "\", shape=box3d, fillcolor=\"#eeeeee\"];";
      std::string where = options.modules ? path : std::string();
      members[where].push_back(stmt);
      if (options.modules) addPath(where);
    }
  }

  std::string out = "digraph plan {\n";
  out += "  label=\"" +
         dotEscape(p.model.model_name + " on " + p.spec.mesh.toString() + ": " +
                   formatMicros(p.totals.total_us) + " per step") +
         "\";\n  labelloc=t;\n  rankdir=TB;\n  compound=true;\n";
  out += "  node [shape=box, style=\"rounded,filled\", fontname=\"Helvetica\", fontsize=10];\n";
  out += "  edge [fontname=\"Helvetica\", fontsize=9];\n";
  for (const std::string& stmt : members[""]) out += "  " + stmt + "\n";
  // Nested clusters: emit each top-level path with its children recursively, in model order (the
  // order the nodes appear in the plan: layers.2 before layers.10).
  auto inModelOrder = [&](const std::string& parent) {
    std::vector<std::string> children;
    for (const std::string& path : paths)
      if (parentPath(path) == parent) children.push_back(path);
    std::sort(children.begin(), children.end(), [&](const std::string& a, const std::string& b) {
      return first_seen.at(a) < first_seen.at(b);
    });
    return children;
  };
  size_t cluster = 0;
  std::function<void(const std::string&, const std::string&)> emit =
      [&](const std::string& path, const std::string& indent) {
        out += indent + "subgraph cluster_" + std::to_string(cluster++) + " {\n";
        out +=
            indent + "  label=\"" + dotEscape(path) + "\"; style=\"rounded\"; color=\"#999999\";\n";
        for (const std::string& stmt : members[path]) out += indent + "  " + stmt + "\n";
        for (const std::string& child : inModelOrder(path)) emit(child, indent + "  ");
        out += indent + "}\n";
      };
  for (const std::string& path : inModelOrder("")) emit(path, "  ");

  std::set<std::pair<std::string, std::string>> drawn;  // collapsed boxes: one edge per pair
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    if (!shown(p.nodes[i])) continue;
    for (const PlanEdge& e : p.nodes[i].in_edges) {
      if (!shown(p.nodes[e.from])) continue;
      const std::string& from = box[e.from];
      const std::string& to = box[i];
      if (from == to) continue;
      std::string label;
      if (p.nodes[i].graph_node) {
        if (auto it = options.edge_labels.find({*p.nodes[i].graph_node, e.input});
            it != options.edge_labels.end())
          label = it->second;
      } else if (auto it = options.sink_labels.find(p.nodes[i].name);
                 it != options.sink_labels.end()) {
        label = it->second;
      }
      if (label.empty() && e.cost_us > 0) label = formatMicros(e.cost_us);
      if ((from[0] == 'm' || to[0] == 'm') && label.empty() && !drawn.insert({from, to}).second)
        continue;
      out += "  " + from + " -> " + to;
      if (!label.empty())
        out += " [label=\"" + dotEscape(label) + "\", color=red, fontcolor=red]";
      else if (isParam(p.nodes[e.from]))
        out += " [color=\"#aaaaaa\"]";
      out += ";\n";
    }
  }
  out += "  subgraph cluster_legend {\n    label=\"output placement\";\n";
  size_t j = 0;
  for (const std::string& placement : colour)
    out += "    legend" + std::to_string(j++) + " [label=\"" + dotEscape(placement) +
           "\", fillcolor=\"" + placementColour(placement) + "\"];\n";
  std::string marks;
  for (const std::string& line : pictureMarks()) marks += dotEscape(line) + "\\l";
  out +=
      "    legend_marks [shape=note, style=\"filled\", fillcolor=\"#ffffff\", fontsize=9, "
      "label=\"" +
      marks + "\"];\n";
  out += "  }\n}\n";
  return out;
}

}  // namespace apc::plan
