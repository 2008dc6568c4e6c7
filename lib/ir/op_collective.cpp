//===- lib/ir/op_collective.cpp - An op's local computation on a rank -----===//
#include "apc/ir/op_collective.h"

#include <utility>

namespace apc::ir {

namespace {

ValueType typeOfConstant(const Constant& c) {
  struct Visitor {
    ValueType operator()(const None&) const { return ValueType::kNone; }
    ValueType operator()(int64_t) const { return ValueType::kInt; }
    ValueType operator()(double) const { return ValueType::kFloat; }
    ValueType operator()(bool) const { return ValueType::kBool; }
    ValueType operator()(const std::string&) const { return ValueType::kString; }
    ValueType operator()(const std::vector<int64_t>&) const { return ValueType::kIntList; }
    ValueType operator()(const std::vector<double>&) const { return ValueType::kFloatList; }
    ValueType operator()(const std::vector<bool>&) const { return ValueType::kBoolList; }
  };
  return std::visit(Visitor{}, c);
}

}  // namespace

LocalGraphBuilder::LocalGraphBuilder(const Graph& g, const Node& node)
    : num_outputs_(node.outputs.size()) {
  g_.name = node.qualifiedOp() + " (local)";
  // Tensors carry no shape here: kOther (the rank's pieces decide it).
  for (ValueId in : node.inputs) {
    const ValueType t = g.value(in).type;
    addInput(t == ValueType::kTensor ? ValueType::kOther : t);
  }
}

LocalGraphBuilder::LocalGraphBuilder(std::string name,
                                     const std::vector<std::optional<Constant>>& inputs,
                                     size_t num_outputs)
    : num_outputs_(num_outputs) {
  g_.name = std::move(name) + " (local)";
  for (const std::optional<Constant>& c : inputs)
    addInput(c ? typeOfConstant(*c) : ValueType::kOther);
}

void LocalGraphBuilder::addInput(ValueType type) {
  Node in;
  in.kind = NodeKind::kInput;
  in.op = "input";
  in.name = "arg" + std::to_string(args_.size());
  const NodeId id = g_.addNode(std::move(in));
  const ValueId v = addValue(type, id, 0);
  g_.node(id).outputs.push_back(v);
  args_.push_back(v);
}

ValueId LocalGraphBuilder::addValue(ValueType type, NodeId producer, uint32_t output) {
  Value v;
  v.type = type;
  v.producer = producer;
  v.producer_output = output;
  v.debug_name = "v" + std::to_string(g_.numValues());
  return g_.addValue(std::move(v));
}

ValueId LocalGraphBuilder::constant(Constant c) {
  const ValueType t = typeOfConstant(c);
  return g_.addConstant(t, std::move(c), "c" + std::to_string(g_.numValues()));
}

ValueId LocalGraphBuilder::op(const std::string& qualified_op, std::vector<ValueId> inputs,
                              ValueType type) {
  Node n;
  n.kind = NodeKind::kOp;
  const size_t dot = qualified_op.find('.');
  n.op = qualified_op.substr(0, dot);
  if (dot != std::string::npos) n.overload = qualified_op.substr(dot + 1);
  n.inputs = std::move(inputs);
  const NodeId id = g_.addNode(std::move(n));
  const ValueId out = addValue(type, id, 0);
  g_.node(id).outputs.push_back(out);
  return out;
}

ValueId LocalGraphBuilder::list(std::vector<ValueId> items, ValueType type) {
  return op("prim::ListConstruct", std::move(items), type);
}

ValueId LocalGraphBuilder::allReduce(ValueId v) {
  return op(std::string(kOpAllReduce), {v});
}

Expected<Graph> LocalGraphBuilder::finish(const std::vector<ValueId>& outputs) {
  if (outputs.size() != num_outputs_)
    return internalError(g_.name + ": " + std::to_string(outputs.size()) +
                         " outputs, the node has " + std::to_string(num_outputs_));
  OutputTree tree;
  tree.kind = OutputTree::Kind::kTuple;
  for (ValueId v : outputs) tree.children.push_back(OutputTree::makeLeaf(v));
  g_.setOutputs(std::move(tree));
  APC_RETURN_IF_ERROR(g_.verify());
  APC_RETURN_IF_ERROR(checkLocalGraph(g_, args_.size(), num_outputs_));
  return std::move(g_);
}

Status checkLocalGraph(const Graph& local, size_t num_inputs, size_t num_outputs) {
  size_t inputs = 0;
  for (const Node& n : local.nodes()) {
    if (n.kind == NodeKind::kInput) ++inputs;
    if (n.kind != NodeKind::kInput && n.kind != NodeKind::kOp)
      return invalidArgument("local graph '" + local.name + "' holds a " + nodeKindName(n.kind) +
                             " node");
    if (n.op == kOpAllReduce && (n.inputs.size() != 1 || n.outputs.size() != 1))
      return invalidArgument("local graph '" + local.name + "': " + std::string(kOpAllReduce) +
                             " node " + std::to_string(n.id.v) + " has " +
                             std::to_string(n.inputs.size()) + " inputs and " +
                             std::to_string(n.outputs.size()) + " outputs, not one each");
  }
  const size_t leaves = local.outputs().leaves().size();
  if (inputs != num_inputs || leaves != num_outputs)
    return invalidArgument("local graph '" + local.name + "' has " + std::to_string(inputs) +
                           " inputs and " + std::to_string(leaves) + " outputs, its node " +
                           std::to_string(num_inputs) + " and " + std::to_string(num_outputs));
  return Status::success();
}

}  // namespace apc::ir
