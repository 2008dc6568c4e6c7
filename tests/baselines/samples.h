//===- tests/baselines/samples.h - Sample models for the baseline tests ----===//
//
// Loads the sample models listed in sample_models/out/manifest.json with the input shapes recorded
// there, once per process (imports are cached by sample name), and builds the solver problem of a
// sample on a mesh with given input placements.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../common/samples.h"
#include "apc/frontend/torchscript.h"
#include "apc/ir/graph.h"
#include "apc/solver/graph_problem.h"
#include "apc/spec/spec.h"
#include "apc/strategy/strategy.h"

namespace apc::baselines_test {

using testing::manifest;
using testing::samplesDir;

/// Names of the samples the importer accepts, in manifest order.
inline std::vector<std::string> importableSamples() {
  std::vector<std::string> out;
  if (manifest().contains("samples"))
    for (const auto& s : manifest()["samples"])
      if (s.value("importable", true)) out.push_back(s["name"]);
  return out;
}

/// The imported graph of a sample (cached); errors are returned as values.
inline const Expected<ir::Graph>& sampleGraph(const std::string& name) {
  static std::map<std::string, Expected<ir::Graph>> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  Expected<ir::Graph> g = notFound("sample '" + name + "' is not in the manifest");
  if (manifest().contains("samples"))
    for (const auto& s : manifest()["samples"]) {
      if (s["name"] != name) continue;
      frontend::ImportOptions o;
      for (const auto& i : s["inputs"]) {
        frontend::InputSpec spec;
        spec.name = i["name"];
        spec.dtype = *ir::parseDType(i["dtype"].get<std::string>());
        spec.shape = ir::makeShape(i["shape"].get<std::vector<int64_t>>());
        o.inputs.push_back(spec);
      }
      g = frontend::importTorchScript((samplesDir() / s["file"].get<std::string>()).string(), o);
    }
  return cache.emplace(name, std::move(g)).first->second;
}

/// The problem of a graph on a mesh: strategies enumerated, inputs placed by `input_placement`
/// (called with each input's metadata), default memory budget.
inline Expected<solver::GraphProblem> buildProblem(
    const ir::Graph& g, const mesh::DeviceMesh& m,
    const std::function<mesh::PlacementTuple(const ir::TensorMeta&)>& input_placement) {
  spec::Spec spec;
  spec.mesh = m;
  for (ir::NodeId id : g.nodesOfKind(ir::NodeKind::kInput)) {
    const ir::Value& v = g.value(g.node(id).outputs.at(0));
    if (v.tensor) spec.inputs[g.node(id).name] = input_placement(*v.tensor);
  }
  return solver::buildGraphProblem(g, strategy::enumerate(g, m), spec);
}

}  // namespace apc::baselines_test
