//===- tests/ir/test_graphs.h - Hand-built graphs for IR tests -------------===//
//
// Small graphs built by hand, shared by the IR tests (no importer, no torch).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "apc/ir/graph.h"

namespace apc::ir::testing_graphs {

inline ValueId tensorValue(Graph& g, const std::string& name, std::vector<int64_t> shape,
                           DType dt = DType::kF32, bool grad = false) {
  Value v;
  v.type = ValueType::kTensor;
  v.debug_name = name;
  v.tensor = TensorMeta{makeShape(shape), dt, grad};
  return g.addValue(v);
}

inline NodeId leafNode(Graph& g, NodeKind kind, const std::string& name, ValueId out) {
  Node n;
  n.kind = kind;
  n.op = nodeKindName(kind);
  n.name = name;
  n.outputs = {out};
  auto dot = name.rfind('.');
  n.module_path = dot == std::string::npos ? "" : name.substr(0, dot);
  return g.addNode(n);
}

inline NodeId opNode(Graph& g, const std::string& op, const std::string& overload,
                     std::vector<ValueId> inputs, std::vector<ValueId> outputs,
                     const std::string& module) {
  Node n;
  n.op = op;
  n.overload = overload;
  n.inputs = std::move(inputs);
  n.outputs = std::move(outputs);
  n.module_path = module;
  return g.addNode(n);
}

/// x[batch,128,1024] -> linear(up.weight[hidden,1024]) -> relu -> linear(down.weight[1024,hidden]).
inline Graph toyBlock(int64_t batch = 8, int64_t hidden = 4096) {
  Graph g;
  g.name = "toy_block";
  ValueId x = tensorValue(g, "x", {batch, 128, 1024});
  leafNode(g, NodeKind::kInput, "x", x);
  ValueId wu = tensorValue(g, "up.weight", {hidden, 1024}, DType::kF32, true);
  leafNode(g, NodeKind::kParameter, "up.weight", wu);
  ValueId wd = tensorValue(g, "down.weight", {1024, hidden}, DType::kF32, true);
  leafNode(g, NodeKind::kParameter, "down.weight", wd);
  ValueId none = g.addConstant(ValueType::kNone, None{});
  ValueId h = tensorValue(g, "h", {batch, 128, hidden}, DType::kF32, true);
  opNode(g, "aten::linear", "", {x, wu, none}, {h}, "up");
  ValueId r = tensorValue(g, "r", {batch, 128, hidden}, DType::kF32, true);
  opNode(g, "aten::relu", "", {h}, {r}, "relu");
  ValueId y = tensorValue(g, "y", {batch, 128, 1024}, DType::kF32, true);
  opNode(g, "aten::linear", "", {r, wd, none}, {y}, "down");
  g.setOutputs(OutputTree::makeLeaf(y));
  return g;
}

/// `layers` residual blocks, x[batch,128,1024]: x_{i+1} = x_i +
/// blocks.i.down(relu(blocks.i.up(x_i))) (up: [4096,1024], down: [1024,4096]); the last x is the
/// output. The blocks repeat (activation checkpointing's candidates).
inline Graph blockStack(int64_t layers, int64_t batch = 8) {
  Graph g;
  g.name = "block_stack";
  ValueId x = tensorValue(g, "x", {batch, 128, 1024});
  leafNode(g, NodeKind::kInput, "x", x);
  std::vector<std::pair<ValueId, ValueId>> weights;
  for (int64_t i = 0; i < layers; ++i) {
    const std::string b = "blocks." + std::to_string(i);
    ValueId wu = tensorValue(g, b + ".up.weight", {4096, 1024}, DType::kF32, true);
    leafNode(g, NodeKind::kParameter, b + ".up.weight", wu);
    ValueId wd = tensorValue(g, b + ".down.weight", {1024, 4096}, DType::kF32, true);
    leafNode(g, NodeKind::kParameter, b + ".down.weight", wd);
    weights.emplace_back(wu, wd);
  }
  ValueId none = g.addConstant(ValueType::kNone, None{});
  ValueId one = g.addConstant(ValueType::kInt, int64_t{1});
  for (int64_t i = 0; i < layers; ++i) {
    const std::string b = "blocks." + std::to_string(i);
    ValueId h = tensorValue(g, b + "_h", {batch, 128, 4096}, DType::kF32, true);
    opNode(g, "aten::linear", "", {x, weights[static_cast<size_t>(i)].first, none}, {h}, b + ".up");
    ValueId r = tensorValue(g, b + "_r", {batch, 128, 4096}, DType::kF32, true);
    opNode(g, "aten::relu", "", {h}, {r}, b + ".act");
    ValueId d = tensorValue(g, b + "_d", {batch, 128, 1024}, DType::kF32, true);
    opNode(g, "aten::linear", "", {r, weights[static_cast<size_t>(i)].second, none}, {d},
           b + ".down");
    ValueId y = tensorValue(g, b + "_y", {batch, 128, 1024}, DType::kF32, true);
    opNode(g, "aten::add", "Tensor", {x, d, one}, {y}, b);
    x = y;
  }
  g.setOutputs(OutputTree::makeLeaf(x));
  return g;
}

/// x[4,6] -> size(x, 0) -> [s, 2, 3] -> view.
inline Graph withSizeArithmetic() {
  Graph g;
  g.name = "sizes";
  ValueId x = tensorValue(g, "x", {4, 6});
  leafNode(g, NodeKind::kInput, "x", x);
  ValueId zero = g.addConstant(ValueType::kInt, int64_t{0});
  Value s;
  s.type = ValueType::kInt;
  s.debug_name = "s";
  s.constant = int64_t{4};
  ValueId sv = g.addValue(s);
  opNode(g, "aten::size", "int", {x, zero}, {sv}, "");
  ValueId two = g.addConstant(ValueType::kInt, int64_t{2});
  ValueId three = g.addConstant(ValueType::kInt, int64_t{3});
  Value l;
  l.type = ValueType::kIntList;
  l.debug_name = "sizes";
  l.constant = std::vector<int64_t>{4, 2, 3};
  ValueId lv = g.addValue(l);
  opNode(g, "prim::ListConstruct", "", {sv, two, three}, {lv}, "");
  ValueId y = tensorValue(g, "y", {4, 2, 3});
  opNode(g, "aten::view", "", {x, lv}, {y}, "");
  OutputTree t;
  t.kind = OutputTree::Kind::kTuple;
  t.children = {OutputTree::makeLeaf(y), OutputTree::makeLeaf(x)};
  g.setOutputs(t);
  return g;
}

}  // namespace apc::ir::testing_graphs
