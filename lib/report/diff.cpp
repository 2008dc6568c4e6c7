//===- lib/report/diff.cpp - Differences between two plans -------------------===//
//
// Matches the nodes of two plans by (kind, name, occurrence) and the parameters by name, and lists
// what differs (see apc/report/diff.h), in plan a's order, then what only plan b has.
//
//===----------------------------------------------------------------------===//
#include "apc/report/diff.h"

#include <cctype>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "apc/mesh/placement_json.h"
#include "apc/report/report.h"
#include "apc/support/strings.h"

namespace apc::plan {

namespace {

/// (kind, name, occurrence) -> node index.
std::map<std::tuple<std::string, std::string, int>, uint32_t> keyed(const Plan& p) {
  std::map<std::tuple<std::string, std::string, int>, uint32_t> out;
  std::map<std::pair<std::string, std::string>, int> seen;
  for (size_t i = 0; i < p.nodes.size(); ++i) {
    const PlanNode& n = p.nodes[i];
    int k = seen[{n.kind, n.name}]++;
    out.emplace(std::tuple(n.kind, n.name, k), static_cast<uint32_t>(i));
  }
  return out;
}

std::string compactOrDash(const PlacementTuple& t) {
  return t.empty() ? std::string("-") : mesh::toCompactString(t);
}

}  // namespace

PlanDiff diffPlans(const Plan& a, const Plan& b) {
  PlanDiff d;
  if (a.model.model_sha256 != b.model.model_sha256 || a.model.inputs != b.model.inputs)
    d.notes.push_back("the plans are of different models or input shapes (" + a.model.model_name +
                      " vs " + b.model.model_name + ")");
  if (!(a.spec.mesh == b.spec.mesh))
    d.notes.push_back("the meshes differ: " + a.spec.mesh.toString() + " vs " +
                      b.spec.mesh.toString());
  if (a.spec.device != b.spec.device || !(a.spec.device_overrides == b.spec.device_overrides))
    d.notes.push_back("the devices differ: " + a.spec.device + " vs " + b.spec.device);
  if (a.checkpoint != b.checkpoint) {
    auto list = [](const Plan& p) {
      if (p.checkpoint.empty()) return std::string("none");
      return std::to_string(p.checkpoint.size()) + " (" + p.checkpoint.front() +
             (p.checkpoint.size() > 1 ? " ... " + p.checkpoint.back() : std::string()) + ")";
    };
    d.notes.push_back("activation checkpointing differs: modules recomputed " + list(a) + " vs " +
                      list(b));
  }
  if (!(a.spec.memory_budget == b.spec.memory_budget))
    d.notes.push_back("the memory budgets differ");

  auto ka = keyed(a);
  auto kb = keyed(b);
  std::map<uint32_t, std::tuple<std::string, std::string, int>> a_keys;
  for (const auto& [k, i] : ka) a_keys.emplace(i, k);
  for (const auto& [i, key] : a_keys) {
    const PlanNode& na = a.nodes[i];
    auto it = kb.find(key);
    NodeChange c;
    c.name = na.name;
    c.kind = na.kind;
    c.op = na.op;
    c.module_path = na.module_path;
    c.index_a = i;
    c.strategy_a = na.strategy;
    c.output_a = na.outputPlacements();
    c.cost_a = na.cost_us;
    if (it != kb.end()) {
      const PlanNode& nb = b.nodes[it->second];
      c.index_b = it->second;
      c.strategy_b = nb.strategy;
      c.output_b = nb.outputPlacements();
      c.cost_b = nb.cost_us;
      c.delta_us = canonicalNumber(c.cost_b - c.cost_a);
      if (na.strategy == nb.strategy && na.input_placements == nb.input_placements &&
          na.outputs == nb.outputs) {
        double scale = std::max(std::abs(c.cost_a), std::abs(c.cost_b));
        if (std::abs(c.cost_b - c.cost_a) > 1e-9 * scale) d.cost_changes.push_back(std::move(c));
        continue;
      }
    } else {
      c.delta_us = canonicalNumber(-c.cost_a);
    }
    d.nodes.push_back(std::move(c));
  }
  std::map<uint32_t, std::tuple<std::string, std::string, int>> b_only;
  for (const auto& [k, i] : kb)
    if (!ka.count(k)) b_only.emplace(i, k);
  for (const auto& [i, key] : b_only) {
    const PlanNode& nb = b.nodes[i];
    NodeChange c;
    c.name = nb.name;
    c.kind = nb.kind;
    c.op = nb.op;
    c.module_path = nb.module_path;
    c.index_b = i;
    c.strategy_b = nb.strategy;
    c.output_b = nb.outputPlacements();
    c.cost_b = nb.cost_us;
    c.delta_us = c.cost_b;
    d.nodes.push_back(std::move(c));
  }
  for (const NodeChange& c : d.nodes) d.changed_delta_us += c.delta_us;
  d.changed_delta_us = canonicalNumber(d.changed_delta_us);
  for (const NodeChange& c : d.cost_changes) d.cost_change_delta_us += c.delta_us;
  d.cost_change_delta_us = canonicalNumber(d.cost_change_delta_us);

  std::map<std::string, const PlanParameter*> pb;
  for (const PlanParameter& q : b.parameters) pb.emplace(q.name, &q);
  for (const PlanParameter& q : a.parameters) {
    auto it = pb.find(q.name);
    if (it != pb.end() && it->second->placement == q.placement) continue;
    ParameterChange c;
    c.name = q.name;
    c.placement_a = q.placement;
    c.bytes_per_rank_a = q.bytes_per_rank;
    if (it != pb.end()) {
      c.placement_b = it->second->placement;
      c.bytes_per_rank_b = it->second->bytes_per_rank;
    }
    d.parameters.push_back(std::move(c));
  }
  std::map<std::string, const PlanParameter*> pa;
  for (const PlanParameter& q : a.parameters) pa.emplace(q.name, &q);
  for (const PlanParameter& q : b.parameters) {
    if (pa.count(q.name)) continue;
    ParameterChange c;
    c.name = q.name;
    c.placement_b = q.placement;
    c.bytes_per_rank_b = q.bytes_per_rank;
    d.parameters.push_back(std::move(c));
  }
  d.totals_a = a.totals;
  d.totals_b = b.totals;
  d.budget_a = budgetNote(a);
  d.budget_b = budgetNote(b);
  d.total_delta_us = canonicalNumber(b.totals.total_us - a.totals.total_us);
  d.peak_optimizer = a.spec.optimizer;
  if (const MemoryEstimate* e = a.memoryFor(d.peak_optimizer)) d.peak_bytes_a = e->peak_bytes;
  if (const MemoryEstimate* e = b.memoryFor(d.peak_optimizer)) d.peak_bytes_b = e->peak_bytes;
  return d;
}

std::vector<ModuleChanges> changesByModule(const PlanDiff& d) {
  std::vector<std::string> order;
  std::map<std::string, std::pair<int, double>> by_group;
  for (const NodeChange& c : d.nodes) {
    const std::string g = moduleGroupOf(c.module_path);
    auto [it, fresh] = by_group.try_emplace(g, 0, 0.0);
    if (fresh) order.push_back(g);
    it->second.first += 1;
    it->second.second += c.delta_us;
  }
  auto stem = [](const std::string& g) {
    const size_t dot = g.rfind('.');
    return dot == std::string::npos ? std::string() : g.substr(0, dot);
  };
  std::vector<ModuleChanges> out;
  for (size_t i = 0; i < order.size();) {
    const auto [count, delta] = by_group[order[i]];
    size_t j = i + 1;
    while (j < order.size() && !stem(order[i]).empty() && stem(order[j]) == stem(order[i]) &&
           by_group[order[j]].first == count &&
           formatSignedMicros(by_group[order[j]].second) == formatSignedMicros(delta))
      ++j;
    ModuleChanges m;
    m.module = order[i];
    if (j - i > 1) m.module += "-" + order[j - 1].substr(stem(order[j - 1]).size() + 1);
    m.layers = static_cast<int>(j - i);
    m.nodes = count;
    m.delta_us = canonicalNumber(delta);
    out.push_back(std::move(m));
    i = j;
  }
  return out;
}

std::string diffText(const PlanDiff& d) {
  std::string out;
  for (const std::string& n : d.notes) out += "note: " + n + "\n";
  // The totals first: a deep model's list of changes runs to hundreds of lines.
  auto totals = [&d](const char* which, const PlanTotals& t, const std::string& budget,
                     int64_t peak) {
    return std::string(which) + ": step " + formatMicros(t.total_us) + " (compute " +
           formatMicros(t.compute_us) + ", comm " + formatMicros(t.comm_us) +
           (t.recompute_us > 0 ? ", recompute " + formatMicros(t.recompute_us) : "") +
           "), parameter memory per rank " +
           humanBytes(static_cast<double>(t.param_bytes_per_rank)) + " of " +
           humanBytes(static_cast<double>(t.param_bytes_total)) + budget +
           (peak > 0 ? ", predicted peak per rank " + humanBytes(static_cast<double>(peak)) + " (" +
                           d.peak_optimizer + ")"
                     : "") +
           "\n";
  };
  out += totals("a", d.totals_a, d.budget_a, d.peak_bytes_a);
  out += totals("b", d.totals_b, d.budget_b, d.peak_bytes_b);
  out += "total delta (b - a): " + formatSignedMicros(d.total_delta_us) + "\n";
  if (!d.nodes.empty()) {
    // Then the changes per module, in model order, with their cost delta.
    out += "changed placements by module:\n";
    for (const ModuleChanges& m : changesByModule(d)) {
      const std::string name =
          m.layers > 1 ? m.module + " (" + std::to_string(m.layers) + " alike, each)" : m.module;
      char line[512];
      std::snprintf(line, sizeof line, "  %-40s %5d node%s %13s\n", name.c_str(), m.nodes,
                    m.nodes == 1 ? " " : "s", formatSignedMicros(m.delta_us).c_str());
      out += line;
    }
  }
  if (d.empty()) {
    out += "no differences in placements\n";
  } else {
    out += std::to_string(d.nodes.size()) + " node" + (d.nodes.size() == 1 ? "" : "s") +
           " with different placements:\n";
    char line[1024];
    std::snprintf(line, sizeof line, "  %-24s %-22s %-26s %-28s %-28s %12s %12s %13s\n", "name",
                  "op", "module", "a", "b", "a_us", "b_us", "delta");
    out += line;
    for (const NodeChange& c : d.nodes) {
      std::string sa = c.index_a ? c.strategy_a : "(absent)";
      std::string sb = c.index_b ? c.strategy_b : "(absent)";
      std::snprintf(line, sizeof line, "  %-24s %-22s %-26s %-28s %-28s %12.3f %12.3f %13s\n",
                    c.name.c_str(), c.op.c_str(),
                    c.module_path.empty() ? "-" : c.module_path.c_str(), sa.c_str(), sb.c_str(),
                    c.cost_a, c.cost_b, formatSignedMicros(c.delta_us).c_str());
      out += line;
    }
    out += "  their cost delta: " + formatSignedMicros(d.changed_delta_us) + "\n";
    if (!d.cost_changes.empty()) {
      out += std::to_string(d.cost_changes.size()) + " node" +
             (d.cost_changes.size() == 1 ? "" : "s") +
             " with the same placements but a different cost (their neighbours moved):\n";
      for (const NodeChange& c : d.cost_changes) {
        std::snprintf(line, sizeof line, "  %-24s %-22s %-26s %-57s %12.3f %12.3f %13s\n",
                      c.name.c_str(), c.op.c_str(),
                      c.module_path.empty() ? "-" : c.module_path.c_str(), c.strategy_a.c_str(),
                      c.cost_a, c.cost_b, formatSignedMicros(c.delta_us).c_str());
        out += line;
      }
      out += "  their cost delta: " + formatSignedMicros(d.cost_change_delta_us) + "\n";
    }
    if (!d.parameters.empty()) {
      out += std::to_string(d.parameters.size()) + " parameter" +
             (d.parameters.size() == 1 ? "" : "s") + " with different placements:\n";
      for (const ParameterChange& c : d.parameters) {
        std::snprintf(line, sizeof line, "  %-40s %-14s %12s  ->  %-14s %12s\n", c.name.c_str(),
                      compactOrDash(c.placement_a).c_str(),
                      humanBytes(static_cast<double>(c.bytes_per_rank_a)).c_str(),
                      compactOrDash(c.placement_b).c_str(),
                      humanBytes(static_cast<double>(c.bytes_per_rank_b)).c_str());
        out += line;
      }
    }
  }
  return out;
}

nlohmann::json toJson(const PlanDiff& d) {
  using nlohmann::json;
  auto num = [](double x) { return std::isfinite(x) ? json(canonicalNumber(x)) : json(nullptr); };
  auto index = [](const std::optional<uint32_t>& i) { return i ? json(*i) : json(nullptr); };
  auto change = [&](const NodeChange& c) {
    return json{{"name", c.name},
                {"kind", c.kind},
                {"op", c.op},
                {"module_path", c.module_path},
                {"index_a", index(c.index_a)},
                {"index_b", index(c.index_b)},
                {"strategy_a", c.index_a ? json(c.strategy_a) : json(nullptr)},
                {"strategy_b", c.index_b ? json(c.strategy_b) : json(nullptr)},
                {"output_placements_a", mesh::toJson(c.output_a)},
                {"output_placements_b", mesh::toJson(c.output_b)},
                {"cost_us_a", num(c.cost_a)},
                {"cost_us_b", num(c.cost_b)},
                {"delta_us", num(c.delta_us)}};
  };
  json nodes = json::array();
  for (const NodeChange& c : d.nodes) nodes.push_back(change(c));
  json cost_changes = json::array();
  for (const NodeChange& c : d.cost_changes) cost_changes.push_back(change(c));
  json params = json::array();
  for (const ParameterChange& c : d.parameters)
    params.push_back({{"name", c.name},
                      {"placement_a", mesh::toJson(c.placement_a)},
                      {"placement_b", mesh::toJson(c.placement_b)},
                      {"bytes_per_rank_a", c.bytes_per_rank_a},
                      {"bytes_per_rank_b", c.bytes_per_rank_b}});
  auto totals = [&](const PlanTotals& t) {
    return json{{"compute_us", num(t.compute_us)},
                {"comm_us", num(t.comm_us)},
                {"total_us", num(t.total_us)},
                {"param_bytes_per_rank", t.param_bytes_per_rank},
                {"param_bytes_total", t.param_bytes_total}};
  };
  json modules = json::array();
  for (const ModuleChanges& m : changesByModule(d))
    modules.push_back({{"module", m.module},
                       {"layers", m.layers},
                       {"nodes", m.nodes},
                       {"delta_us", num(m.delta_us)}});
  return {
      {"notes", d.notes},
      {"by_module", modules},
      {"nodes", nodes},
      {"parameters", params},
      {"totals_a", totals(d.totals_a)},
      {"totals_b", totals(d.totals_b)},
      {"over_budget_a", !d.budget_a.empty()},
      {"over_budget_b", !d.budget_b.empty()},
      {"changed_delta_us", num(d.changed_delta_us)},
      {"cost_changes", cost_changes},
      {"cost_change_delta_us", num(d.cost_change_delta_us)},
      {"total_delta_us", num(d.total_delta_us)},
      {"peak_memory",
       {{"optimizer", d.peak_optimizer}, {"bytes_a", d.peak_bytes_a}, {"bytes_b", d.peak_bytes_b}}},
      {"identical_placements", d.empty()}};
}

}  // namespace apc::plan
