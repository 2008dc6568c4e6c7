//===- lib/ir/printer.cpp - Text and JSON forms of a graph -----------------===//
#include "apc/ir/printer.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>

#include "apc/support/strings.h"

namespace apc::ir {

GraphStats computeStats(const Graph& g) {
  GraphStats s;
  for (const Node& n : g.nodes()) {
    ++s.num_nodes;
    switch (n.kind) {
      case NodeKind::kInput:
        ++s.num_inputs;
        break;
      case NodeKind::kParameter:
      case NodeKind::kBuffer: {
        const Value& v = g.value(n.outputs.at(0));
        int64_t numel = v.tensor ? v.tensor->numel() : 0;
        int64_t bytes = v.tensor ? v.tensor->bytes() : 0;
        if (n.kind == NodeKind::kParameter) {
          ++s.num_parameters;
          s.total_params += numel;
          s.param_bytes += bytes;
        } else {
          ++s.num_buffers;
          s.buffer_bytes += bytes;
        }
        break;
      }
      case NodeKind::kOp:
        ++s.nodes_by_op[n.qualifiedOp()];
        if (g.isShapeNode(n.id)) ++s.num_shape_nodes;
        break;
    }
  }
  return s;
}

std::string valueRef(const Graph& g, ValueId id) {
  const Value& v = g.value(id);
  if (!v.producer.valid() && v.constant) return toString(*v.constant);
  return "%" + (v.debug_name.empty() ? std::to_string(id.v) : v.debug_name);
}

std::string valueTypeString(const Graph& g, ValueId id) {
  const Value& v = g.value(id);
  std::string s;
  if (v.tensor) {
    s = toString(*v.tensor);
  } else if (v.type == ValueType::kTensorList && !v.elements.empty()) {
    s = "(" + joinMap(v.elements, ", ", [](const TensorMeta& t) { return toString(t); }) + ")";
  } else {
    s = valueTypeName(v.type);
  }
  if (!v.isTensor() && v.constant) s += " = " + toString(*v.constant);
  return s;
}

namespace {
std::string nodeLabel(const Node& n) {
  if (n.kind == NodeKind::kOp) return n.qualifiedOp();
  return std::string(nodeKindName(n.kind)) + " " + n.name;
}

void printTree(const Graph& g, const OutputTree& t, std::ostream& os) {
  switch (t.kind) {
    case OutputTree::Kind::kLeaf:
      os << valueRef(g, t.leaf) << ": " << valueTypeString(g, t.leaf);
      return;
    case OutputTree::Kind::kTuple:
    case OutputTree::Kind::kList: {
      os << (t.kind == OutputTree::Kind::kTuple ? "(" : "[");
      for (size_t i = 0; i < t.children.size(); ++i) {
        if (i) os << ", ";
        printTree(g, t.children[i], os);
      }
      os << (t.kind == OutputTree::Kind::kTuple ? ")" : "]");
      return;
    }
    case OutputTree::Kind::kDict: {
      os << "{";
      for (size_t i = 0; i < t.children.size(); ++i) {
        if (i) os << ", ";
        os << "\"" << t.keys[i] << "\": ";
        printTree(g, t.children[i], os);
      }
      os << "}";
      return;
    }
  }
}

nlohmann::json treeToJson(const Graph& g, const OutputTree& t) {
  using nlohmann::json;
  switch (t.kind) {
    case OutputTree::Kind::kLeaf: {
      json j = {{"value", valueRef(g, t.leaf)}, {"type", valueTypeString(g, t.leaf)}};
      const Value& v = g.value(t.leaf);
      if (v.tensor) {
        j["shape"] = hintSizes(v.tensor->shape);
        j["dtype"] = dtypeName(v.tensor->dtype);
      }
      return j;
    }
    case OutputTree::Kind::kTuple:
    case OutputTree::Kind::kList: {
      json arr = json::array();
      for (const auto& c : t.children) arr.push_back(treeToJson(g, c));
      return {{t.kind == OutputTree::Kind::kTuple ? "tuple" : "list", arr}};
    }
    case OutputTree::Kind::kDict: {
      json obj = json::object();
      for (size_t i = 0; i < t.children.size(); ++i) obj[t.keys[i]] = treeToJson(g, t.children[i]);
      return {{"dict", obj}};
    }
  }
  return nullptr;
}
}  // namespace

void printGraph(const Graph& g, std::ostream& os) {
  size_t op_width = 12, mod_width = 6;
  for (const Node& n : g.nodes()) {
    op_width = std::max(op_width, nodeLabel(n).size());
    mod_width = std::max(mod_width, n.module_path.size());
  }
  op_width = std::min<size_t>(op_width, 48);
  mod_width = std::min<size_t>(mod_width, 40);
  char head[256];
  std::snprintf(head, sizeof head, "%-6s %-*s %-*s %s\n", "#", static_cast<int>(op_width), "op",
                static_cast<int>(mod_width), "module", "outputs = (inputs)");
  os << head;
  for (const Node& n : g.nodes()) {
    std::string outs = joinMap(
        n.outputs, ", ", [&](ValueId v) { return valueRef(g, v) + ": " + valueTypeString(g, v); });
    char line[512];
    std::snprintf(line, sizeof line, "%-6u %-*s %-*s ", n.id.v, static_cast<int>(op_width),
                  nodeLabel(n).c_str(), static_cast<int>(mod_width),
                  n.module_path.empty() ? "-" : n.module_path.c_str());
    os << line << outs;
    if (n.kind == NodeKind::kOp)
      os << " = (" << joinMap(n.inputs, ", ", [&](ValueId v) { return valueRef(g, v); }) << ")";
    os << "\n";
  }
  os << "outputs: ";
  printTree(g, g.outputs(), os);
  os << "\n";
}

void printStats(const GraphStats& s, std::ostream& os) {
  os << "nodes: " << s.num_nodes << " (" << s.num_inputs << " inputs, " << s.num_parameters
     << " parameters, " << s.num_buffers << " buffers, "
     << s.num_nodes - s.num_inputs - s.num_parameters - s.num_buffers << " ops of which "
     << s.num_shape_nodes << " shape ops)\n";
  os << "parameters: " << withCommas(s.total_params) << " elements, " << humanBytes(s.param_bytes)
     << " (" << withCommas(s.param_bytes) << " bytes)\n";
  os << "buffers: " << humanBytes(s.buffer_bytes) << "\n";
  os << "nodes by op:\n";
  for (const auto& [op, count] : s.nodes_by_op) {
    char line[256];
    std::snprintf(line, sizeof line, "  %-40s %6lld\n", op.c_str(), static_cast<long long>(count));
    os << line;
  }
}

nlohmann::json graphToJson(const Graph& g) {
  using nlohmann::json;
  json nodes = json::array();
  for (const Node& n : g.nodes()) {
    json outs = json::array();
    for (ValueId v : n.outputs) {
      const Value& val = g.value(v);
      json o = {{"value", valueRef(g, v)}, {"type", valueTypeName(val.type)}};
      if (val.tensor) {
        o["shape"] = hintSizes(val.tensor->shape);
        o["dtype"] = dtypeName(val.tensor->dtype);
        o["requires_grad"] = val.tensor->requires_grad;
        bool symbolic = false;
        for (const Dim& d : val.tensor->shape) symbolic |= d.isSymbolic();
        if (symbolic) o["shape_text"] = toString(val.tensor->shape);
      }
      if (!val.elements.empty()) {
        json el = json::array();
        for (const TensorMeta& t : val.elements)
          el.push_back({{"shape", hintSizes(t.shape)}, {"dtype", dtypeName(t.dtype)}});
        o["elements"] = el;
      }
      if (!val.isTensor() && val.constant) o["constant"] = toString(*val.constant);
      outs.push_back(o);
    }
    json j = {{"index", n.id.v},        {"kind", nodeKindName(n.kind)}, {"op", n.op},
              {"overload", n.overload}, {"module_path", n.module_path}, {"outputs", outs}};
    if (!n.name.empty()) j["name"] = n.name;
    if (!n.source.empty()) j["source"] = n.source;
    if (n.kind == NodeKind::kOp) {
      json ins = json::array();
      for (ValueId v : n.inputs) ins.push_back(valueRef(g, v));
      j["inputs"] = ins;
      j["shape_node"] = g.isShapeNode(n.id);
    }
    nodes.push_back(j);
  }
  GraphStats s = computeStats(g);
  return {{"name", g.name},
          {"nodes", nodes},
          {"outputs", treeToJson(g, g.outputs())},
          {"num_nodes", s.num_nodes},
          {"num_inputs", s.num_inputs},
          {"num_parameters", s.num_parameters},
          {"total_params", s.total_params},
          {"param_bytes", s.param_bytes},
          {"num_buffers", s.num_buffers},
          {"buffer_bytes", s.buffer_bytes},
          {"num_shape_nodes", s.num_shape_nodes},
          {"nodes_by_op", s.nodes_by_op}};
}

}  // namespace apc::ir
