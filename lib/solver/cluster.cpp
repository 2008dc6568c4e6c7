//===- lib/solver/cluster.cpp - Repeated-layer clustering ------------------===//
//
// Ties the strategy variables of structurally identical layer instances (see graph_problem.h):
// the ILP then has one copy of a transformer block instead of 32, with its costs scaled by the
// repeat count. The quotient problem is a restriction to layer-symmetric plans; solveGraphProblem
// then proves its plan optimal with the LP bound of the unclustered problem or re-solves without
// clustering (lib/solver/solve_graph_problem.cpp, step 3), so the optimum is unchanged
// (tests/solver check it on the samples, also where no symmetric optimum exists).
//
//===----------------------------------------------------------------------===//
#include <algorithm>
#include <cctype>
#include <map>

#include "apc/solver/graph_problem.h"
#include "apc/support/strings.h"
#include "edge_table.h"

namespace apc::solver {

namespace {

struct InstanceKey {
  std::string prefix;  // "layers"
  std::string index;   // "3"
  std::string suffix;  // "attention.wq" ("" for the layer module itself)
};

std::optional<InstanceKey> splitInstance(const std::string& path) {
  std::vector<std::string> parts = split(path, '.');
  for (size_t k = 1; k < parts.size(); ++k) {
    const std::string& c = parts[k];
    if (c.empty() ||
        !std::all_of(c.begin(), c.end(), [](unsigned char ch) { return std::isdigit(ch); }))
      continue;
    InstanceKey key;
    key.prefix =
        join(std::vector<std::string>(parts.begin(), parts.begin() + static_cast<long>(k)), ".");
    key.index = c;
    key.suffix =
        join(std::vector<std::string>(parts.begin() + static_cast<long>(k) + 1, parts.end()), ".");
    return key;
  }
  return std::nullopt;
}

/// What must agree between tied nodes: module suffix, costs, memory and strategies. Compared
/// directly (a string signature per node cost a third of a second on llama3_8b).
bool sameNode(const GraphProblem& gp, uint32_t a, const std::string& suffix_a, uint32_t b,
              const std::string& suffix_b) {
  const ProblemNode& x = gp.problem.nodes[a];
  const ProblemNode& y = gp.problem.nodes[b];
  return suffix_a == suffix_b && x.costs == y.costs && x.memory == y.memory &&
         gp.strategies[a] == gp.strategies[b];
}

}  // namespace

std::vector<uint32_t> repeatedLayerRepresentatives(const GraphProblem& gp, size_t* clusters,
                                                   std::vector<uint32_t>* instance,
                                                   std::vector<uint32_t>* cluster) {
  const size_t n = gp.problem.nodes.size();
  std::vector<uint32_t> rep(n);
  for (uint32_t i = 0; i < n; ++i) rep[i] = i;
  if (instance) instance->assign(n, 0);
  if (cluster) cluster->assign(n, kNoCluster);
  // prefix -> instance index (in order of first appearance) -> node list
  std::map<std::string, std::vector<std::string>> instance_order;
  std::map<std::string, std::map<std::string, std::vector<std::pair<uint32_t, std::string>>>>
      instances;
  // Pinned nodes and the nodes a user pin constrains (the sources of edges into pin sinks, see
  // graph_problem.h) stay untied: their instance then differs from the others and is left alone.
  std::vector<bool> constrained(n, false);
  for (const ProblemEdge& e : gp.problem.edges)
    if (gp.problem.nodes[e.dst].pinned && gp.problem.nodes[e.dst].pin_group == "pins")
      constrained[e.src] = true;
  for (uint32_t v = 0; v < n && v < gp.module_paths.size(); ++v) {
    if (gp.problem.nodes[v].pinned || constrained[v]) continue;
    auto key = splitInstance(gp.module_paths[v]);
    if (!key) continue;
    auto& per_prefix = instances[key->prefix];
    if (!per_prefix.count(key->index)) instance_order[key->prefix].push_back(key->index);
    per_prefix[key->index].emplace_back(v, key->suffix);
  }
  // Each instance is tied to the first earlier instance it equals: a prefix may hold several
  // kinds of layer (DeepSeek-V3: 3 dense blocks, then 58 mixture-of-experts blocks), each kind
  // one cluster.
  size_t count = 0;
  for (const auto& [prefix, order] : instance_order) {
    const auto& nodes_of = instances[prefix];
    struct Kind {
      size_t first;  // index into order
      size_t tied = 0;
      uint32_t cluster = kNoCluster;
    };
    std::vector<Kind> kinds;
    for (size_t k = 0; k < order.size(); ++k) {
      const auto& other = nodes_of.at(order[k]);
      Kind* kind = nullptr;
      for (Kind& c : kinds) {
        const auto& first = nodes_of.at(order[c.first]);
        if (other.size() != first.size()) continue;
        bool same = true;
        for (size_t i = 0; i < other.size() && same; ++i)
          same = sameNode(gp, other[i].first, other[i].second, first[i].first, first[i].second);
        if (same) {
          kind = &c;
          break;
        }
      }
      if (!kind) {
        kinds.push_back(Kind{k});
        continue;
      }
      const auto& first = nodes_of.at(order[kind->first]);
      if (kind->tied++ == 0) {
        kind->cluster = static_cast<uint32_t>(count++);
        if (cluster)
          for (const auto& [node, suffix] : first) (*cluster)[node] = kind->cluster;
      }
      for (size_t i = 0; i < other.size(); ++i) {
        rep[other[i].first] = first[i].first;
        if (instance) (*instance)[other[i].first] = static_cast<uint32_t>(kind->tied);
        if (cluster) (*cluster)[other[i].first] = kind->cluster;
      }
    }
  }
  if (clusters) *clusters = count;
  return rep;
}

Problem quotientProblem(const Problem& full, const std::vector<uint32_t>& rep,
                        std::vector<uint32_t>& index) {
  Problem q;
  index.assign(full.nodes.size(), 0);
  for (uint32_t v = 0; v < full.nodes.size(); ++v) {
    if (rep[v] != v) continue;
    index[v] = static_cast<uint32_t>(q.nodes.size());
    q.nodes.push_back(full.nodes[v]);
  }
  for (uint32_t v = 0; v < full.nodes.size(); ++v) {
    if (rep[v] == v) continue;
    index[v] = index[rep[v]];
    ProblemNode& r = q.nodes[index[v]];
    const ProblemNode& m = full.nodes[v];
    for (size_t s = 0; s < r.costs.size(); ++s) r.costs[s] += m.costs[s];
    for (size_t s = 0; s < r.memory.size(); ++s) r.memory[s] += m.memory[s];
  }
  std::map<std::pair<uint32_t, uint32_t>, size_t> edge_of;
  for (const ProblemEdge& e : full.edges) {
    uint32_t a = index[e.src], b = index[e.dst];
    size_t nt = full.nodes[e.dst].numStrategies();
    if (a == b) {  // both ends tied to one node: only equal choices are possible
      for (size_t s = 0; s < q.nodes[a].costs.size(); ++s) q.nodes[a].costs[s] += e.cost(s, s, nt);
      continue;
    }
    auto it = edge_of.find({a, b});
    if (it == edge_of.end()) {
      edge_of[{a, b}] = q.edges.size();
      q.edges.push_back(e);
      q.edges.back().src = a;
      q.edges.back().dst = b;
    } else {
      // Tied layers have equal class maps: then the tables add up elementwise.
      ProblemEdge& into = q.edges[it->second];
      size_t ns = full.nodes[e.src].numStrategies();
      if (into.factorized() == e.factorized() && into.src_class == e.src_class &&
          into.dst_class == e.dst_class && into.costs.size() == e.costs.size()) {
        std::vector<double>& sum = into.costs.mutableValues();
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += e.costs[i];
      } else {
        into = detail::edgeOf(
            a, b, detail::sum(detail::tableOf(into, ns, nt), detail::tableOf(e, ns, nt)));
      }
    }
  }
  q.memory = full.memory;
  return q;
}

}  // namespace apc::solver
