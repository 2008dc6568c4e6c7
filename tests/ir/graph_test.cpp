//===- tests/ir/graph_test.cpp - Graph construction, verify, printing -----===//
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sstream>

#include "apc/ir/graph.h"
#include "apc/ir/printer.h"
#include "test_graphs.h"

namespace apc::ir {
namespace {

TEST(Types, DTypeNamesRoundTrip) {
  for (DType d : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI64, DType::kI32,
                  DType::kI16, DType::kI8, DType::kU8, DType::kBool}) {
    auto parsed = parseDType(dtypeName(d));
    ASSERT_TRUE(parsed.has_value()) << dtypeName(d);
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_EQ(parseDType("float32"), DType::kF32);
  EXPECT_EQ(parseDType("long"), DType::kI64);
  EXPECT_FALSE(parseDType("f33").has_value());
  EXPECT_EQ(dtypeBytes(DType::kBF16), 2);
  EXPECT_EQ(dtypeBytes(DType::kI64), 8);
}

TEST(Types, ShapesAndConstantsPrint) {
  Shape s = {Dim::symbolic("B", 8), Dim::fixed(128)};
  EXPECT_EQ(toString(s), "[B=8,128]");
  EXPECT_EQ(numel(s), 1024);
  EXPECT_EQ(toString(TensorMeta{makeShape({2, 3}), DType::kBF16, false}), "bf16[2,3]");
  EXPECT_EQ(toString(Constant{std::vector<int64_t>{1, -1}}), "[1, -1]");
  EXPECT_EQ(toString(Constant{None{}}), "None");
  EXPECT_EQ(toString(Constant{true}), "True");
  EXPECT_EQ(toString(Constant{2.0}), "2.");
}

TEST(Graph, ToyBlockStructure) {
  Graph g = testing_graphs::toyBlock();
  ASSERT_TRUE(g.verify().ok()) << g.verify().error().message();
  EXPECT_EQ(g.nodesOfKind(NodeKind::kParameter).size(), 2u);
  ASSERT_TRUE(g.findParameter("up.weight").has_value());
  EXPECT_FALSE(g.findParameter("up.bias").has_value());
  ASSERT_TRUE(g.findInput("x").has_value());
  auto uses = g.computeUses();
  ValueId x = g.node(*g.findInput("x")).outputs[0];
  ASSERT_EQ(uses[x.v].size(), 1u);
  EXPECT_EQ(g.node(uses[x.v][0].node).op, "aten::linear");
  EXPECT_EQ(uses[x.v][0].input_index, 0u);
}

// removeNodes: the other nodes keep their order under new ids, producers follow, value ids stay,
// and the removed node's outputs become None constants (the graph still verifies).
TEST(Graph, RemoveNodesRenumbersAndKeepsValueIds) {
  Graph g = testing_graphs::toyBlock();
  // toy_block: x, up.weight, down.weight, linear, relu, linear. Drop the relu and feed the second
  // linear the first linear's output instead.
  NodeId relu, down;
  for (const Node& n : g.nodes()) {
    if (n.op == "aten::relu") relu = n.id;
    if (n.op == "aten::linear") down = n.id;  // the last one
  }
  ASSERT_TRUE(relu.valid() && down.valid());
  const ValueId relu_out = g.node(relu).outputs[0];
  const ValueId up_out = g.node(relu).inputs[0];
  const ValueId out = g.node(down).outputs[0];
  g.node(down).inputs[0] = up_out;
  const size_t nodes = g.numNodes(), values = g.numValues();
  std::vector<bool> dead(nodes, false);
  dead[relu.v] = true;
  g.removeNodes(dead);
  ASSERT_TRUE(g.verify().ok()) << g.verify().error().message();
  EXPECT_EQ(g.numNodes(), nodes - 1);
  EXPECT_EQ(g.numValues(), values);
  for (const Node& n : g.nodes()) EXPECT_NE(n.op, "aten::relu");
  EXPECT_EQ(g.value(relu_out).type, ValueType::kNone);
  EXPECT_FALSE(g.value(relu_out).producer.valid());
  const Node& last = g.node(g.value(out).producer);
  EXPECT_EQ(last.op, "aten::linear");
  EXPECT_EQ(last.id.v, nodes - 2);
  EXPECT_EQ(last.inputs[0], up_out);
}

TEST(Graph, StatsCountParametersAndOps) {
  Graph g = testing_graphs::toyBlock();
  GraphStats s = computeStats(g);
  EXPECT_EQ(s.num_parameters, 2);
  EXPECT_EQ(s.total_params, 2 * 1024 * 4096);
  EXPECT_EQ(s.param_bytes, 2 * 1024 * 4096 * 4);
  EXPECT_EQ(s.nodes_by_op.at("aten::linear"), 2);
  EXPECT_EQ(s.nodes_by_op.at("aten::relu"), 1);
  EXPECT_EQ(s.num_inputs, 1);
}

TEST(Graph, ShapeNodesAreFlagged) {
  Graph g = testing_graphs::withSizeArithmetic();
  ASSERT_TRUE(g.verify().ok()) << g.verify().error().message();
  int shape_nodes = 0;
  for (const Node& n : g.nodes()) shape_nodes += g.isShapeNode(n.id);
  EXPECT_EQ(shape_nodes, 2);                         // aten::size.int and prim::ListConstruct
  EXPECT_FALSE(g.isShapeNode(g.nodes().back().id));  // aten::view produces a tensor
}

TEST(Graph, VerifyRejectsUseBeforeDef) {
  Graph g;
  Value v;
  v.type = ValueType::kTensor;
  v.tensor = TensorMeta{makeShape({2}), DType::kF32, false};
  v.debug_name = "a";
  ValueId a = g.addValue(v);
  v.debug_name = "b";
  ValueId b = g.addValue(v);
  Node relu;
  relu.op = "aten::relu";
  relu.inputs = {b};  // b is produced by the next node
  relu.outputs = {a};
  g.addNode(relu);
  Node input;
  input.kind = NodeKind::kInput;
  input.op = "input";
  input.name = "x";
  input.outputs = {b};
  g.addNode(input);
  auto st = g.verify();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message().find("before it is produced"), std::string::npos)
      << st.error().message();
}

TEST(Printer, TextFormListsEveryNode) {
  Graph g = testing_graphs::toyBlock();
  std::ostringstream os;
  printGraph(g, os);
  std::string text = os.str();
  EXPECT_NE(text.find("parameter up.weight"), std::string::npos) << text;
  EXPECT_NE(text.find("aten::linear"), std::string::npos);
  EXPECT_NE(text.find("f32[8,128,4096]"), std::string::npos);
  EXPECT_NE(text.find(" down "), std::string::npos);  // module path column
}

TEST(Printer, JsonCarriesTotalsAndShapes) {
  Graph g = testing_graphs::toyBlock();
  nlohmann::json j = graphToJson(g);
  EXPECT_EQ(j["total_params"], 2 * 1024 * 4096);
  EXPECT_EQ(j["nodes"].size(), g.numNodes());
  const auto& last = j["nodes"].back();
  EXPECT_EQ(last["op"], "aten::linear");
  EXPECT_EQ(last["module_path"], "down");
  EXPECT_EQ(last["outputs"][0]["shape"], (std::vector<int64_t>{8, 128, 1024}));
  EXPECT_EQ(j["outputs"]["shape"], (std::vector<int64_t>{8, 128, 1024}));
}

TEST(Graph, CheckpointRangeIsAModulesContiguousOps) {
  using testing_graphs::opNode;
  using testing_graphs::tensorValue;
  Graph g = testing_graphs::blockStack(2);
  // Leaves first (2 per block after the input), then 4 ops per block.
  const std::optional<NodeRange> b0 = checkpointRange(g, "blocks.0");
  ASSERT_TRUE(b0);
  EXPECT_EQ(g.node(NodeId(b0->first)).op, "aten::linear");
  EXPECT_EQ(b0->last - b0->first, 3u);
  EXPECT_EQ(g.node(NodeId(b0->last)).op, "aten::add");
  const std::optional<NodeRange> b1 = checkpointRange(g, "blocks.1");
  ASSERT_TRUE(b1);
  EXPECT_EQ(b1->first, b0->last + 1);
  EXPECT_TRUE(checkpointRange(g, "blocks.0.up"));
  EXPECT_FALSE(checkpointRange(g, "blocks.9"));
  EXPECT_FALSE(checkpointRange(g, "blocks.0.u"));  // a prefix of a name is not a module
  EXPECT_TRUE(inModule("blocks.0.up", "blocks.0"));
  EXPECT_FALSE(inModule("blocks.01", "blocks.0"));
  EXPECT_FALSE(inModule("blocks.0", ""));

  // On one block: an op of another module between the module's ops is not contiguous.
  const NodeRange one = *checkpointRange(testing_graphs::blockStack(1), "blocks.0");
  Graph split = testing_graphs::blockStack(1);
  split.node(NodeId(one.first + 1)).module_path = "elsewhere";
  EXPECT_FALSE(checkpointRange(split, "blocks.0"));
  // An in-place op on a value from outside (the block's input): a second run would apply it
  // twice.
  Graph inplace = testing_graphs::blockStack(1);
  inplace.node(NodeId(one.last)).op = "aten::add_";
  EXPECT_FALSE(checkpointRange(inplace, "blocks.0"));
  // BatchNorm that updates running statistics (arguments 3 and 4): allowed when they are
  // buffers (the runtime's recomputation writes copies of them), not when they are other values
  // from outside (the block's input here); the functional form is pure.
  Graph bn = testing_graphs::blockStack(1);
  const ValueId mean = tensorValue(bn, "running_mean", {1024}, DType::kF32, false);
  const ValueId var = tensorValue(bn, "running_var", {1024}, DType::kF32, false);
  testing_graphs::leafNode(bn, NodeKind::kBuffer, "running_mean", mean);
  testing_graphs::leafNode(bn, NodeKind::kBuffer, "running_var", var);
  Node& norm = bn.node(NodeId(one.first + 1));
  const ValueId x = norm.inputs.at(0);
  norm.op = "aten::batch_norm";
  norm.inputs.resize(3, x);
  norm.inputs.push_back(mean);
  norm.inputs.push_back(var);
  EXPECT_TRUE(checkpointRange(bn, "blocks.0"));
  EXPECT_EQ(outsideValuesWritten(bn, one.first, one.last), (std::vector<ValueId>{mean, var}));
  Graph bn_input = bn;
  const ValueId block_input = bn_input.node(NodeId(one.first)).inputs.at(0);
  bn_input.node(NodeId(one.first + 1)).inputs.at(3) = block_input;
  EXPECT_FALSE(checkpointRange(bn_input, "blocks.0"));
  bn_input.node(NodeId(one.first + 1)).op = "aten::_native_batch_norm_legit_functional";
  EXPECT_TRUE(checkpointRange(bn_input, "blocks.0"));
  // A size passed on to a later node is allowed (the forward's value); a list of tensors is not.
  Graph sizes = testing_graphs::blockStack(1);
  const ValueId y = sizes.outputs().leaves().at(0);
  const ValueId zero = sizes.addConstant(ValueType::kInt, int64_t{0});
  Value n;
  n.type = ValueType::kInt;
  n.debug_name = "n";
  const ValueId nv = sizes.addValue(n);
  opNode(sizes, "aten::size", "int", {y, zero}, {nv}, "blocks.0");
  const ValueId z = tensorValue(sizes, "z", {8, 128, 1024});
  opNode(sizes, "aten::mul", "Scalar", {y, nv}, {z}, "head");
  sizes.setOutputs(OutputTree::makeLeaf(z));
  EXPECT_TRUE(checkpointRange(sizes, "blocks.0"));
  Graph lists = testing_graphs::blockStack(1);
  const ValueId ly = lists.outputs().leaves().at(0);
  Value l;
  l.type = ValueType::kTensorList;
  l.debug_name = "pieces";
  const ValueId lv = lists.addValue(l);
  opNode(lists, "prim::ListConstruct", "", {ly, ly}, {lv}, "blocks.0");
  const ValueId c = tensorValue(lists, "c", {16, 128, 1024});
  const ValueId dim0 = lists.addConstant(ValueType::kInt, int64_t{0});
  opNode(lists, "aten::cat", "", {lv, dim0}, {c}, "head");
  lists.setOutputs(OutputTree::makeLeaf(c));
  EXPECT_FALSE(checkpointRange(lists, "blocks.0"));
}

}  // namespace
}  // namespace apc::ir
