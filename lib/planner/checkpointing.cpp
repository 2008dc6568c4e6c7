//===- lib/planner/checkpointing.cpp - Activation checkpointing as a planning choice -===//
//
// See apc/planner/checkpointing.h.
//
//===----------------------------------------------------------------------===//
#include "apc/planner/checkpointing.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "apc/cost/compute.h"
#include "apc/lower/lower.h"
#include "apc/plan/memory.h"
#include "apc/strategy/strategy.h"
#include "apc/support/strings.h"

namespace apc::plan {

namespace {

/// "a.b.c" -> {"a", "a.b", "a.b.c"}.
std::vector<std::string> prefixes(const std::string& path) {
  std::vector<std::string> out;
  for (size_t i = 0; i <= path.size(); ++i)
    if (i == path.size() || path[i] == '.') out.push_back(path.substr(0, i));
  if (!path.empty() && out.back() != path) out.push_back(path);
  return out;
}

std::string parentOf(const std::string& module) {
  const size_t dot = module.rfind('.');
  return dot == std::string::npos ? "" : module.substr(0, dot);
}

}  // namespace

std::vector<std::string> checkpointCandidates(const ir::Graph& g) {
  // Per module (every prefix of an op's module path): a fingerprint of its op sequence, its op
  // count and its first node.
  struct Info {
    uint64_t signature = 1469598103934665603ull;  // FNV offset basis
    size_t ops = 0;
    uint32_t first = 0;
  };
  std::map<std::string, Info> modules;
  for (const ir::Node& n : g.nodes()) {
    // Size arithmetic is left out: an export computes a size once and the later layers reuse it,
    // so the first layer has ops the others lack.
    if (n.kind != ir::NodeKind::kOp || n.module_path.empty() || g.isShapeNode(n.id)) continue;
    const uint64_t h = std::hash<std::string>{}(n.qualifiedOp());
    for (const std::string& m : prefixes(n.module_path)) {
      auto [it, fresh] = modules.try_emplace(m);
      if (fresh) it->second.first = n.id.v;
      it->second.signature = (it->second.signature ^ h) * 1099511628211ull;
      ++it->second.ops;
    }
  }
  // Siblings with the same op sequence: the repeated modules.
  std::map<std::tuple<std::string, uint64_t, size_t>, std::vector<std::string>> groups;
  for (const auto& [m, info] : modules)
    groups[{parentOf(m), info.signature, info.ops}].push_back(m);
  std::set<std::string> repeated;
  for (const auto& [key, members] : groups)
    if (members.size() >= 2 && std::get<2>(key) >= 2)
      for (const std::string& m : members) repeated.insert(m);
  // Outermost first (shorter paths are ancestors): a module under a chosen one is not offered.
  std::vector<std::string> order(repeated.begin(), repeated.end());
  std::stable_sort(order.begin(), order.end(), [](const std::string& a, const std::string& b) {
    return std::count(a.begin(), a.end(), '.') < std::count(b.begin(), b.end(), '.');
  });
  std::vector<std::string> chosen;
  for (const std::string& m : order) {
    bool under = false;
    for (const std::string& c : chosen) under = under || ir::inModule(m, c);
    if (under || !ir::checkpointRange(g, m)) continue;
    chosen.push_back(m);
  }
  std::sort(chosen.begin(), chosen.end(), [&](const std::string& a, const std::string& b) {
    return modules.at(a).first < modules.at(b).first;
  });
  return chosen;
}

Expected<double> recomputeUs(const ir::Graph& g, const Plan& p, std::string_view module) {
  const std::optional<ir::NodeRange> r = ir::checkpointRange(g, module);
  if (!r)
    return invalidArgument("module '" + std::string(module) +
                           "' cannot be checkpointed (its nodes are not contiguous, it updates "
                           "state in place, or it passes a non-tensor value on)");
  const strategy::Registry& registry = strategy::defaultRegistry();
  double us = 0;
  for (const PlanNode& pn : p.nodes) {
    if (!pn.graph_node || *pn.graph_node < r->first || *pn.graph_node > r->last) continue;
    us += pn.compute_us * registry.forwardShare(g, g.node(ir::NodeId(*pn.graph_node)));
    for (const PlanEdge& e : pn.in_edges)
      if (e.from < p.nodes.size() && p.nodes[e.from].kind != "parameter") us += e.cost_us / 2;
  }
  return us;
}

Status applyCheckpointing(const ir::Graph& g, Plan& p, std::vector<std::string> modules) {
  std::vector<std::pair<ir::NodeRange, std::string>> ranges;
  double recompute = 0;
  for (std::string& m : modules) {
    APC_ASSIGN_OR_RETURN(const double us, recomputeUs(g, p, m));
    recompute += us;
    ranges.emplace_back(*ir::checkpointRange(g, m), std::move(m));
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const auto& a, const auto& b) { return a.first.first < b.first.first; });
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first.first <= ranges[i - 1].first.last)
      return invalidArgument("checkpointed modules '" + ranges[i - 1].second + "' and '" +
                             ranges[i].second +
                             "' overlap (name each module once, not a module "
                             "and one inside it)");
  p.checkpoint.clear();
  for (auto& [range, m] : ranges) p.checkpoint.push_back(std::move(m));
  PlanTotals& t = p.totals;
  t.recompute_us = canonicalNumber(recompute);
  t.total_us = canonicalNumber(t.compute_us + t.comm_us + t.recompute_us);
  APC_ASSIGN_OR_RETURN(p.memory, lower::predictRuntimeMemory(g, p));
  p.content_hash = planContentHash(p);
  return Status::success();
}

Expected<std::vector<std::string>> parseCheckpointModules(const ir::Graph& g,
                                                          std::string_view text) {
  const std::string t(trim(text));
  if (t == "none") return std::vector<std::string>{};
  std::vector<std::string> candidates = checkpointCandidates(g);
  if (t == "all") {
    if (candidates.empty())
      return invalidArgument(
          "--checkpoint all: the model has no module to checkpoint (no repeated module whose "
          "nodes are contiguous, with no in-place update of outside state)");
    return candidates;
  }
  std::vector<std::string> out;
  for (const std::string& piece : split(t, ',')) {
    const std::string m(trim(piece));
    if (m.empty()) return invalidArgument("--checkpoint: an empty module name in '" + t + "'");
    if (!ir::checkpointRange(g, m)) {
      std::string hint;
      if (!candidates.empty())
        hint = " (candidates: " + candidates.front() +
               (candidates.size() > 1 ? " ... " + candidates.back() : "") + ", or 'all')";
      return invalidArgument("--checkpoint: module '" + m +
                             "' cannot be checkpointed: it is not a module of the model, its "
                             "nodes are not contiguous, it updates state in place, or it passes "
                             "a non-tensor value on" +
                             hint);
    }
    out.push_back(m);
  }
  return out;
}

Expected<bool> checkpointToFit(const ir::Graph& g, Plan& p, int64_t device_bytes,
                               std::string_view optimizer) {
  const std::vector<std::string> candidates = checkpointCandidates(g);
  if (candidates.empty()) return false;
  std::vector<std::pair<double, size_t>> order;
  for (size_t i = 0; i < candidates.size(); ++i) {
    APC_ASSIGN_OR_RETURN(const double us, recomputeUs(g, p, candidates[i]));
    order.emplace_back(us, i);
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  auto with = [&](size_t k) -> Expected<Plan> {
    std::vector<std::string> ms;
    for (size_t i = 0; i < k; ++i) ms.push_back(candidates[order[i].second]);
    Plan q = p;
    APC_RETURN_IF_ERROR(applyCheckpointing(g, q, std::move(ms)));
    return q;
  };
  auto fits = [&](const Plan& q) {
    const MemoryEstimate* e = q.memoryFor(optimizer);
    return e && e->peak_bytes <= device_bytes;
  };
  APC_ASSIGN_OR_RETURN(Plan all, with(order.size()));
  if (!fits(all)) return false;
  size_t lo = 0, hi = order.size();  // fits(hi); the smallest such k is in (lo, hi]
  Plan best = std::move(all);
  while (hi - lo > 1) {
    const size_t mid = lo + (hi - lo) / 2;
    APC_ASSIGN_OR_RETURN(Plan q, with(mid));
    if (fits(q)) {
      hi = mid;
      best = std::move(q);
    } else {
      lo = mid;
    }
  }
  p = std::move(best);
  return true;
}

}  // namespace apc::plan
