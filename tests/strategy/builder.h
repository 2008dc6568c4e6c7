//===- tests/strategy/builder.h - Building op graphs by hand for rule tests ===//
//
// A small builder for strategy tests: graph inputs and parameters, constants of every kind, op
// nodes with tensor, Tensor[] or multiple outputs, written the way the TorchScript importer
// writes them (constants as graph-level Values, int lists with known values). Also the blocks of
// the sample models (a GPT-2 block, a LLaMA block, the small CNN) with their exact op overloads
// and argument conventions, so that tests can check that no sample op falls back.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <string>
#include <vector>

#include "apc/ir/graph.h"
#include "apc/mesh/device_mesh.h"
#include "apc/strategy/strategy.h"

namespace apc::strategy::testing {

using ir::DType;
using ir::Graph;
using ir::NodeId;
using ir::ValueId;
using ir::ValueType;

class Builder {
 public:
  Graph g;

  ValueId tensor(const std::string& name, std::vector<int64_t> shape, DType dt = DType::kF32,
                 bool grad = false) {
    ir::Value v;
    v.type = ValueType::kTensor;
    v.debug_name = name;
    v.tensor = ir::TensorMeta{ir::makeShape(shape), dt, grad};
    return g.addValue(v);
  }
  ValueId input(const std::string& name, std::vector<int64_t> shape, DType dt = DType::kF32) {
    ValueId v = tensor(name, std::move(shape), dt);
    leaf(ir::NodeKind::kInput, name, v);
    return v;
  }
  ValueId param(const std::string& name, std::vector<int64_t> shape) {
    ValueId v = tensor(name, std::move(shape), DType::kF32, true);
    leaf(ir::NodeKind::kParameter, name, v);
    return v;
  }
  ValueId buffer(const std::string& name, std::vector<int64_t> shape) {
    ValueId v = tensor(name, std::move(shape), DType::kF32, false);
    leaf(ir::NodeKind::kBuffer, name, v);
    return v;
  }
  ValueId i(int64_t x) { return g.addConstant(ValueType::kInt, x); }
  ValueId f(double x) { return g.addConstant(ValueType::kFloat, x); }
  ValueId b(bool x) { return g.addConstant(ValueType::kBool, x); }
  ValueId none() { return g.addConstant(ValueType::kNone, ir::None{}); }
  ValueId str(const std::string& s) { return g.addConstant(ValueType::kString, s); }
  ValueId ints(std::vector<int64_t> xs) { return g.addConstant(ValueType::kIntList, xs); }

  /// An op with one tensor output of `shape`; returns the output.
  ValueId op(const std::string& qualified, std::vector<ValueId> inputs, std::vector<int64_t> shape,
             DType dt = DType::kF32, bool grad = true) {
    ValueId out = tensor("t" + std::to_string(g.numValues()), std::move(shape), dt, grad);
    addOp(qualified, std::move(inputs), {out});
    return out;
  }
  /// An op with one Tensor[] output whose elements have `shapes`.
  ValueId listOp(const std::string& qualified, std::vector<ValueId> inputs,
                 const std::vector<std::vector<int64_t>>& shapes, DType dt = DType::kF32) {
    ir::Value v;
    v.type = ValueType::kTensorList;
    v.debug_name = "l" + std::to_string(g.numValues());
    for (const auto& s : shapes) v.elements.push_back(ir::TensorMeta{ir::makeShape(s), dt, true});
    ValueId out = g.addValue(v);
    addOp(qualified, std::move(inputs), {out});
    return out;
  }
  /// An op with several tensor outputs.
  std::vector<ValueId> multiOp(const std::string& qualified, std::vector<ValueId> inputs,
                               const std::vector<std::vector<int64_t>>& shapes,
                               DType dt = DType::kF32) {
    std::vector<ValueId> outs;
    for (const auto& s : shapes)
      outs.push_back(tensor("m" + std::to_string(g.numValues()), s, dt, true));
    addOp(qualified, std::move(inputs), outs);
    return outs;
  }
  NodeId addOp(const std::string& qualified, std::vector<ValueId> inputs,
               std::vector<ValueId> outputs) {
    ir::Node n;
    auto dot = qualified.find('.');
    n.op = qualified.substr(0, dot);
    if (dot != std::string::npos) n.overload = qualified.substr(dot + 1);
    n.inputs = std::move(inputs);
    n.outputs = std::move(outputs);
    last_ = g.addNode(n);
    return last_;
  }
  NodeId last() const { return last_; }

 private:
  void leaf(ir::NodeKind kind, const std::string& name, ValueId v) {
    ir::Node n;
    n.kind = kind;
    n.op = ir::nodeKindName(kind);
    n.name = name;
    n.outputs = {v};
    g.addNode(n);
  }
  NodeId last_;
};

/// The strategies of node `n` as strings, in order.
std::vector<std::string> strategyStrings(const std::vector<NodeStrategies>& all, NodeId n);
/// Enumerates `g` on `mesh` (text like "2" or "2x2") and returns the node's strategy strings.
std::vector<std::string> strategiesOf(const Graph& g, NodeId n, const std::string& mesh,
                                      const EnumerateOptions& options = {});

/// A GPT-2 block as gpt2_tiny has it (traced): ln_1, c_attn, split, views, transposes, matmuls,
/// mul by the scale, ones/triu mask, masked_fill, softmax, c_proj, residual adds, ln_2, MLP with
/// gelu; then the head and a mean cross entropy. Returns the graph.
Graph gpt2Block(int64_t batch, int64_t seq, int64_t dim, int64_t heads, int64_t vocab);
/// `layers` LLaMA blocks as llama_tiny/llama3_8b have them: RMSNorm from pow/mean/add/rsqrt/mul,
/// wq/wk/wv, rotary embedding (slice, neg, cat, unsqueeze, mul, add), GQA expand + reshape,
/// attention with a full/triu mask, to.dtype, softmax, type_as, SwiGLU MLP.
Graph llamaModel(int64_t layers, int64_t batch, int64_t seq, int64_t dim, int64_t heads,
                 int64_t kv_heads, int64_t ffn, int64_t vocab);
/// cnn_small: three conv/batch_norm/relu stages with max pooling, adaptive pooling, flatten,
/// linear.
Graph cnnSmall();

}  // namespace apc::strategy::testing
