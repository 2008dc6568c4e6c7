//===- lib/strategy/node_time.cpp - Keys of measured op nodes ---------------===//
#include "apc/strategy/node_time.h"

#include <map>

#include "apc/layout/layout.h"

namespace apc::strategy {

std::optional<std::string> nodeTimeKey(
    const ir::Graph& g, const ir::Node& n,
    const std::vector<std::vector<std::vector<int64_t>>>& local) {
  std::string key = n.qualifiedOp() + "(";
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const ir::Value& v = g.value(n.inputs[i]);
    if (i > 0) key += ", ";
    if (v.isTensor()) {
      if (!v.tensor || v.constant || i >= local.size() || local[i].size() != 1) return std::nullopt;
      key += ir::dtypeName(v.tensor->dtype);
      key += '[';
      for (size_t d = 0; d < local[i][0].size(); ++d)
        key += (d ? "," : "") + std::to_string(local[i][0][d]);
      key += ']';
      if (v.tensor->requires_grad) key += 'g';
    } else if (v.constant && !v.producer.valid()) {
      key += ir::toString(*v.constant);
    } else {
      return std::nullopt;
    }
  }
  return key + ")";
}

std::vector<NodeSample> nodeSamples(const ir::Graph& g, const mesh::DeviceMesh& mesh,
                                    const std::vector<NodeStrategies>& strategies,
                                    const Registry& registry) {
  std::map<std::string, NodeSample> by_key;
  for (const NodeStrategies& ns : strategies) {
    const ir::Node& n = g.node(ns.node);
    const OpInfo* info = registry.findEntry(n);
    if (info && info->family == cost::OpFamily::kView) continue;
    for (const Strategy& s : ns.strategies) {
      std::vector<std::vector<std::vector<int64_t>>> local(n.inputs.size());
      for (size_t i = 0; i < n.inputs.size() && i < s.inputs.size(); ++i) {
        const ir::Value& v = g.value(n.inputs[i]);
        if (v.isTensor() && v.tensor && s.inputs[i])
          local[i].push_back(layout::maxLocalSizes(*v.tensor, *s.inputs[i], mesh));
      }
      std::optional<std::string> key = nodeTimeKey(g, n, local);
      if (!key || by_key.count(*key)) continue;
      by_key.emplace(*key, NodeSample{ns.node, std::move(local), *key});
    }
  }
  std::vector<NodeSample> out;
  out.reserve(by_key.size());
  for (auto& [key, sample] : by_key) out.push_back(std::move(sample));
  return out;
}

}  // namespace apc::strategy
