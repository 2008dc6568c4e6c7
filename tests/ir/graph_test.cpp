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

}  // namespace
}  // namespace apc::ir
