//===- lib/spec/spec_check.cpp - A spec against a model --------------------===//
//
// validateSpecAgainstGraph (apc/spec/spec.h): the spec's inputs, outputs, dynamic dims and pins
// name what the imported model has, with suggestions for near misses.
//
//===----------------------------------------------------------------------===//
#include "apc/spec/spec.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "apc/support/file_io.h"
#include "apc/support/strings.h"
#include "spec_json.h"

namespace apc::spec {

using nlohmann::json;
using namespace detail;  // NOLINT: the JSON readers of spec_json.h

namespace {

std::vector<std::string> inputNames(const ir::Graph& g) {
  std::vector<std::string> names;
  for (ir::NodeId id : g.nodesOfKind(ir::NodeKind::kInput)) names.push_back(g.node(id).name);
  return names;
}

Error unknownInput(const std::string& path, const std::string& name, const ir::Graph& g) {
  std::vector<std::string> names = inputNames(g);
  std::string have =
      names.empty() ? "the model has no inputs" : "the model's inputs are: " + quoteList(names);
  return notFound(path + ": spec names input '" + printable(name) + "' but " + have +
                  suggestion(name, names));
}

/// The tensor meta of input `name`, or an error naming `path`.
Expected<ir::TensorMeta> inputMeta(const std::string& path, const std::string& name,
                                   const ir::Graph& g) {
  std::optional<ir::NodeId> id = g.findInput(name);
  if (!id) return unknownInput(path, name, g);
  const ir::Node& n = g.node(*id);
  if (n.outputs.empty() || !g.value(n.outputs[0]).isTensor()) {
    std::string type =
        n.outputs.empty() ? "no value" : ir::valueTypeName(g.value(n.outputs[0]).type);
    return at(path, "input '" + name + "' is not a tensor (" + type + ")");
  }
  return *g.value(n.outputs[0]).tensor;
}

/// Every shard dim of `t` is below the rank of `meta`; `what` names the tensor ("input 'x'").
Status checkRank(const PlacementTuple& t, const ir::TensorMeta& meta, const std::string& path,
                 const std::string& what) {
  for (size_t i = 0; i < t.size(); ++i)
    if (t[i].isShard() && t[i].dim() >= meta.rank())
      return at(indexPath(path, i), t[i].toString() + " is out of range for " + what + " of rank " +
                                        std::to_string(meta.rank()) + " (" + ir::toString(meta) +
                                        ")");
  return Status::success();
}

std::string describeOutput(const ir::OutputTree& o, const ir::Graph& g) {
  switch (o.kind) {
    case ir::OutputTree::Kind::kLeaf: {
      if (!o.leaf.valid() || o.leaf.v >= g.numValues()) return "an unknown value";
      const ir::Value& v = g.value(o.leaf);
      if (v.isTensor()) return "a tensor " + ir::toString(*v.tensor);
      return std::string("a non-tensor value (") + ir::valueTypeName(v.type) + ")";
    }
    case ir::OutputTree::Kind::kTuple:
      return "a tuple of " + std::to_string(o.children.size());
    case ir::OutputTree::Kind::kList:
      return "a list of " + std::to_string(o.children.size());
    case ir::OutputTree::Kind::kDict:
      return "a dict with keys: " + quoteList(o.keys);
  }
  return "?";
}

Status matchOutputs(const OutputPlacementTree& t, const ir::OutputTree& o, const ir::Graph& g,
                    const std::string& path) {
  using K = OutputPlacementTree::Kind;
  using OK = ir::OutputTree::Kind;
  switch (t.kind) {
    case K::kFree:
      return Status::success();
    case K::kLeaf: {
      bool tensor = o.kind == OK::kLeaf && o.leaf.valid() && o.leaf.v < g.numValues() &&
                    g.value(o.leaf).isTensor();
      if (!tensor)
        return at(path, "spec gives a placement list but the model's output here is " +
                            describeOutput(o, g));
      return checkRank(t.placements, *g.value(o.leaf).tensor, path, "this output");
    }
    case K::kSequence: {
      if ((o.kind != OK::kTuple && o.kind != OK::kList) || o.children.size() != t.children.size())
        return at(path, "spec gives a sequence of " + std::to_string(t.children.size()) +
                            " but the model's output here is " + describeOutput(o, g));
      for (size_t i = 0; i < t.children.size(); ++i)
        APC_RETURN_IF_ERROR(matchOutputs(t.children[i], o.children[i], g, indexPath(path, i)));
      return Status::success();
    }
    case K::kDict: {
      if (o.kind != OK::kDict)
        return at(path, "spec gives a dict but the model's output here is " + describeOutput(o, g));
      for (size_t i = 0; i < t.keys.size(); ++i) {
        auto it = std::find(o.keys.begin(), o.keys.end(), t.keys[i]);
        std::string p = keyPath(path, t.keys[i]);
        if (it == o.keys.end() || static_cast<size_t>(it - o.keys.begin()) >= o.children.size())
          return at(p, "spec names output key '" + printable(t.keys[i]) +
                           "' but the model's dict has keys: " + quoteList(o.keys));
        APC_RETURN_IF_ERROR(matchOutputs(t.children[i], o.children[it - o.keys.begin()], g, p));
      }
      return Status::success();
    }
  }
  return Status::success();
}

/// Every module path of the graph and its prefixes ("layers", "layers.0", "layers.0.attn", ...).
std::set<std::string> modulePaths(const ir::Graph& g) {
  std::set<std::string> paths;
  auto addPrefixes = [&](const std::string& path) {
    for (size_t pos = path.find('.'); pos != std::string::npos; pos = path.find('.', pos + 1))
      paths.insert(path.substr(0, pos));
    if (!path.empty()) paths.insert(path);
  };
  for (const ir::Node& n : g.nodes()) {
    addPrefixes(n.module_path);
    // A parameter "layers.0.wq.weight" lives in module "layers.0.wq".
    if ((n.kind == ir::NodeKind::kParameter || n.kind == ir::NodeKind::kBuffer) &&
        n.name.find('.') != std::string::npos)
      addPrefixes(n.name.substr(0, n.name.rfind('.')));
  }
  return paths;
}

std::vector<std::string> keysOf(const std::map<std::string, ir::ValueId>& m) {
  std::vector<std::string> out;
  for (const auto& [k, v] : m) out.push_back(k);
  return out;
}

}  // namespace

Expected<std::map<std::string, PlacementTuple>> resolveInShardings(const InputShardings& s,
                                                                   const ir::Graph& g) {
  std::map<std::string, PlacementTuple> out;
  std::vector<std::string> names = inputNames(g);
  if (!s.by_position.empty()) {
    if (s.by_position.size() != names.size())
      return invalidArgument("$: in-shardings list has " + entries(s.by_position.size()) +
                             " but the model has " + std::to_string(names.size()) + " input" +
                             (names.size() == 1 ? "" : "s") + " (" + quoteList(names) + ")");
    for (size_t i = 0; i < names.size(); ++i)
      if (s.by_position[i]) out.emplace(names[i], *s.by_position[i]);
  }
  for (const auto& [name, t] : s.by_name) {
    std::string p = keyPath("$", name);
    if (!g.findInput(name)) return unknownInput(p, name, g);
    if (!out.emplace(name, t).second)
      return at(p, "input '" + printable(name) + "' is given twice");
  }
  return out;
}

std::map<std::string, ir::ValueId> pinNames(const ir::Graph& g) {
  std::map<std::string, ir::ValueId> names;
  for (const ir::Node& n : g.nodes()) {
    if (n.kind != ir::NodeKind::kOp) {
      if (!n.outputs.empty()) names.emplace(n.name, n.outputs[0]);
      continue;
    }
    for (ir::ValueId v : n.outputs)
      if (!g.value(v).debug_name.empty()) names.emplace(g.value(v).debug_name, v);
  }
  return names;
}

Status validateSpecAgainstGraph(const Spec& s, const ir::Graph& g) {
  for (const auto& [name, t] : s.inputs) {
    std::string p = keyPath("$.inputs", name);
    APC_ASSIGN_OR_RETURN(ir::TensorMeta meta, inputMeta(p, name, g));
    APC_RETURN_IF_ERROR(checkNotPartial(t, p, "input '" + printable(name) + "'"));
    APC_RETURN_IF_ERROR(checkRank(t, meta, p, "input '" + printable(name) + "'"));
  }
  for (size_t i = 0; i < s.dynamic.size(); ++i) {
    const DynamicDim& d = s.dynamic[i];
    std::string p = indexPath("$.dynamic", i);
    APC_ASSIGN_OR_RETURN(ir::TensorMeta meta, inputMeta(p + ".input", d.input, g));
    if (d.dim >= meta.rank())
      return at(p + ".dim", "dim " + std::to_string(d.dim) + " is out of range for input '" +
                                printable(d.input) + "' of rank " + std::to_string(meta.rank()) +
                                " (" + ir::toString(meta) + ")");
    int64_t size = meta.shape[static_cast<size_t>(d.dim)].size;
    if (size < d.min || (d.max && size > *d.max))
      return at(p, "input '" + printable(d.input) + "' has size " + std::to_string(size) +
                       " in dim " + std::to_string(d.dim) + ", outside its range [" +
                       std::to_string(d.min) + ", " +
                       (d.max ? std::to_string(*d.max) : std::string("inf")) + "]");
  }
  APC_RETURN_IF_ERROR(matchOutputs(s.outputs, g.outputs(), g, "$.outputs"));

  std::map<std::string, ir::ValueId> nodes;
  std::set<std::string> modules;
  for (size_t i = 0; i < s.pins.size(); ++i) {
    const Pin& pin = s.pins[i];
    std::string p = indexPath("$.pins", i);
    if (pin.target == Pin::Target::kNode) {
      if (nodes.empty()) nodes = pinNames(g);
      auto it = nodes.find(pin.name);
      if (it == nodes.end())
        return notFound(p + ".node: spec pins node '" + printable(pin.name) +
                        "' but the model has no node of that name" +
                        suggestion(pin.name, keysOf(nodes)));
      const ir::Value& v = g.value(it->second);
      if (!v.isTensor())
        return at(p + ".node", "node '" + printable(pin.name) + "' is not a tensor (" +
                                   ir::valueTypeName(v.type) + ")");
      APC_RETURN_IF_ERROR(checkRank(pin.placements, *v.tensor, p + ".placements",
                                    "node '" + printable(pin.name) + "'"));
    } else {
      if (modules.empty()) modules = modulePaths(g);
      if (!modules.count(pin.name))
        return notFound(p + ".module: spec pins module '" + printable(pin.name) +
                        "' but the model has no module of that path" +
                        suggestion(pin.name, {modules.begin(), modules.end()}));
    }
  }
  return Status::success();
}

}  // namespace apc::spec
