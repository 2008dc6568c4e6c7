//===- lib/ir/graph.cpp - Graph construction, queries and verification ----===//
#include "apc/ir/graph.h"

#include <set>

namespace apc::ir {

const char* valueTypeName(ValueType t) {
  switch (t) {
    case ValueType::kTensor:
      return "Tensor";
    case ValueType::kInt:
      return "int";
    case ValueType::kFloat:
      return "float";
    case ValueType::kBool:
      return "bool";
    case ValueType::kString:
      return "str";
    case ValueType::kDevice:
      return "Device";
    case ValueType::kNone:
      return "None";
    case ValueType::kIntList:
      return "int[]";
    case ValueType::kFloatList:
      return "float[]";
    case ValueType::kBoolList:
      return "bool[]";
    case ValueType::kTensorList:
      return "Tensor[]";
    case ValueType::kTuple:
      return "tuple";
    case ValueType::kOther:
      return "other";
  }
  return "other";
}

const char* nodeKindName(NodeKind k) {
  switch (k) {
    case NodeKind::kInput:
      return "input";
    case NodeKind::kParameter:
      return "parameter";
    case NodeKind::kBuffer:
      return "buffer";
    case NodeKind::kOp:
      return "op";
  }
  return "op";
}

namespace {
void collectLeaves(const OutputTree& t, std::vector<ValueId>& out) {
  if (t.kind == OutputTree::Kind::kLeaf) {
    out.push_back(t.leaf);
    return;
  }
  for (const auto& c : t.children) collectLeaves(c, out);
}
}  // namespace

std::vector<ValueId> OutputTree::leaves() const {
  std::vector<ValueId> out;
  collectLeaves(*this, out);
  return out;
}

ValueId Graph::addValue(Value v) {
  v.id = ValueId(static_cast<uint32_t>(values_.size()));
  values_.push_back(std::move(v));
  return values_.back().id;
}

NodeId Graph::addNode(Node n) {
  n.id = NodeId(static_cast<uint32_t>(nodes_.size()));
  for (uint32_t i = 0; i < n.outputs.size(); ++i) {
    Value& v = values_.at(n.outputs[i].v);
    v.producer = n.id;
    v.producer_output = i;
  }
  nodes_.push_back(std::move(n));
  return nodes_.back().id;
}

void Graph::removeNodes(const std::vector<bool>& dead) {
  std::vector<Node> kept;
  kept.reserve(nodes_.size());
  for (Node& n : nodes_) {
    const bool gone = n.id.v < dead.size() && dead[n.id.v];
    for (ValueId out : n.outputs) {
      Value& v = values_.at(out.v);
      v.producer = NodeId();
      if (!gone) continue;
      // Value ids stay stable (importers' notes hold them): the removed node's outputs become
      // unused None constants.
      v.type = ValueType::kNone;
      v.tensor.reset();
      v.elements.clear();
      v.constant = None{};
    }
    if (!gone) kept.push_back(std::move(n));
  }
  nodes_.clear();
  for (Node& n : kept) addNode(std::move(n));
}

ValueId Graph::addConstant(ValueType type, Constant c, std::string debug_name) {
  Value v;
  v.type = type;
  v.constant = std::move(c);
  v.debug_name = std::move(debug_name);
  return addValue(std::move(v));
}

std::vector<NodeId> Graph::nodesOfKind(NodeKind k) const {
  std::vector<NodeId> out;
  for (const Node& n : nodes_)
    if (n.kind == k) out.push_back(n.id);
  return out;
}

std::optional<NodeId> Graph::findInput(const std::string& input_name) const {
  for (const Node& n : nodes_)
    if (n.kind == NodeKind::kInput && n.name == input_name) return n.id;
  return std::nullopt;
}

std::optional<NodeId> Graph::findParameter(const std::string& fqn) const {
  for (const Node& n : nodes_)
    if ((n.kind == NodeKind::kParameter || n.kind == NodeKind::kBuffer) && n.name == fqn)
      return n.id;
  return std::nullopt;
}

std::vector<std::vector<Use>> Graph::computeUses() const {
  std::vector<std::vector<Use>> uses(values_.size());
  for (const Node& n : nodes_)
    for (uint32_t i = 0; i < n.inputs.size(); ++i) uses[n.inputs[i].v].push_back({n.id, i});
  return uses;
}

bool Graph::isShapeNode(NodeId id) const {
  const Node& n = node(id);
  if (n.kind != NodeKind::kOp) return false;
  for (ValueId v : n.outputs)
    if (value(v).type == ValueType::kTensor || value(v).type == ValueType::kTensorList)
      return false;
  return true;
}

Status Graph::verify() const {
  auto where = [&](const Node& n) {
    return "node #" + std::to_string(n.id.v) + " (" + n.qualifiedOp() + ")";
  };
  for (size_t vi = 0; vi < values_.size(); ++vi) {
    const Value& v = values_[vi];
    if (v.id.v != vi) return internalError("value #" + std::to_string(vi) + " has a wrong id");
    if (v.isTensor() != v.tensor.has_value())
      return internalError("value %" + v.debug_name + " has inconsistent tensor metadata");
    if (v.producer.valid()) {
      if (v.producer.v >= nodes_.size())
        return internalError("value %" + v.debug_name + " names a producer that does not exist");
      const Node& p = nodes_[v.producer.v];
      if (v.producer_output >= p.outputs.size() || p.outputs[v.producer_output] != v.id)
        return internalError("value %" + v.debug_name + " is not an output of its producer " +
                             where(p));
    } else if (!v.constant.has_value()) {
      return internalError("value %" + v.debug_name + " has neither a producer nor a constant");
    }
  }
  for (size_t ni = 0; ni < nodes_.size(); ++ni) {
    const Node& n = nodes_[ni];
    if (n.id.v != ni) return internalError("node #" + std::to_string(ni) + " has a wrong id");
    for (ValueId in : n.inputs) {
      if (in.v >= values_.size())
        return internalError(where(n) + " uses a value that does not exist");
      const Value& v = values_[in.v];
      if (v.producer.valid() && v.producer.v >= ni)
        return internalError(where(n) + " uses %" + v.debug_name + " before it is produced");
    }
    for (ValueId out : n.outputs) {
      if (out.v >= values_.size())
        return internalError(where(n) + " has an output that does not exist");
      if (values_[out.v].producer != n.id)
        return internalError(where(n) + " lists output %" + values_[out.v].debug_name +
                             " produced elsewhere");
    }
    if (n.kind != NodeKind::kOp && n.name.empty()) return internalError(where(n) + " has no name");
  }
  for (ValueId leaf : outputs_.leaves())
    if (!leaf.valid() || leaf.v >= values_.size())
      return internalError("graph output names a value that does not exist");
  return Status::success();
}

bool inModule(std::string_view path, std::string_view module) {
  return !module.empty() && path.size() >= module.size() &&
         path.compare(0, module.size(), module) == 0 &&
         (path.size() == module.size() || path[module.size()] == '.');
}

bool updatesRunningStats(const std::string& op) {
  if (op.find("batch_norm") == std::string::npos && op != "aten::instance_norm") return false;
  return op != "aten::_native_batch_norm_legit_functional" &&
         op != "aten::_native_batch_norm_legit_no_training" &&
         op.find("backward") == std::string::npos;
}

std::vector<ValueId> writtenInPlace(const Node& n) {
  std::vector<ValueId> out;
  if (n.kind != NodeKind::kOp) return out;
  if (!n.op.empty() && n.op.back() == '_' && !n.inputs.empty()) out.push_back(n.inputs[0]);
  if (updatesRunningStats(n.op))
    for (size_t i : {size_t{3}, size_t{4}})
      if (i < n.inputs.size()) out.push_back(n.inputs[i]);
  return out;
}

std::vector<ValueId> outsideValuesWritten(const Graph& g, uint32_t first, uint32_t last) {
  std::vector<ValueId> work;
  for (uint32_t i = first; i <= last && i < g.numNodes(); ++i)
    for (ValueId w : writtenInPlace(g.node(NodeId(i)))) work.push_back(w);
  std::set<uint32_t> seen, outside;
  while (!work.empty()) {
    const ValueId v = work.back();
    work.pop_back();
    if (!v.valid() || v.v >= g.numValues() || !seen.insert(v.v).second) continue;
    const NodeId p = g.value(v).producer;
    const bool inside = p.valid() && p.v >= first && p.v <= last;
    if (!inside) {
      outside.insert(v.v);
      continue;
    }
    const Node& n = g.node(p);
    if (n.kind != NodeKind::kOp)
      outside.insert(v.v);  // a leaf among the range's ops: state from outside
    else if (!n.inputs.empty())
      work.push_back(n.inputs[0]);  // a view or slice of its first input, written through
  }
  std::vector<ValueId> out;
  for (uint32_t v : outside) out.push_back(ValueId(v));
  return out;
}

bool isBufferCast(const Graph& g, const Node& n) {
  return n.kind == NodeKind::kOp && n.op == "aten::to" && n.module_path.empty() &&
         !n.inputs.empty() && g.value(n.inputs[0]).producer.valid() &&
         g.node(g.value(n.inputs[0]).producer).kind == NodeKind::kBuffer;
}

std::optional<NodeRange> checkpointRange(const Graph& g, std::string_view module) {
  std::optional<uint32_t> first, last;
  for (const Node& n : g.nodes())
    if (n.kind == NodeKind::kOp && inModule(n.module_path, module)) {
      if (!first) first = n.id.v;
      last = n.id.v;
    }
  if (!first) return std::nullopt;
  bool has_op = false;
  for (uint32_t i = *first; i <= *last; ++i) {
    const Node& n = g.node(NodeId(i));
    // A buffer's leaf among the module's ops (TorchScript reads a BatchNorm's statistics where
    // the module uses them): read from outside, as the parameters' leaves are.
    if (n.kind == NodeKind::kBuffer) continue;
    // Its cast to the compute dtype under mixed precision (lowering's): recomputed with the
    // module's ops.
    if (isBufferCast(g, n)) continue;
    if (n.kind != NodeKind::kOp || !inModule(n.module_path, module)) return std::nullopt;
    has_op = true;
  }
  if (!has_op) return std::nullopt;
  // Outside state the recomputation must not write twice: only buffers (running statistics,
  // num_batches_tracked, or a slice of them), which the runtime hands it as copies.
  for (ValueId w : outsideValuesWritten(g, *first, *last)) {
    const Value& v = g.value(w);
    if (!v.isTensor() && !v.mayHoldTensors()) continue;  // None statistics
    if (!v.producer.valid() ||
        (g.node(v.producer).kind != NodeKind::kBuffer && !isBufferCast(g, g.node(v.producer))))
      return std::nullopt;
  }
  std::vector<bool> read_later(g.numValues(), false);
  for (ValueId v : g.outputs().leaves()) read_later[v.v] = true;
  for (uint32_t i = *last + 1; i < g.numNodes(); ++i)
    for (ValueId v : g.node(NodeId(i)).inputs) read_later[v.v] = true;
  for (uint32_t i = *first; i <= *last; ++i)
    for (ValueId v : g.node(NodeId(i)).outputs)
      if (read_later[v.v] && !g.value(v).isTensor() && g.value(v).mayHoldTensors())
        return std::nullopt;
  return NodeRange{*first, *last};
}

}  // namespace apc::ir
