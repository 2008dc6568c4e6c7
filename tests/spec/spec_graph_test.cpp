//===- tests/spec/spec_graph_test.cpp - Specs checked against a model -------===//
//
// validateSpecAgainstGraph and resolveInShardings on a small hand-built graph:
//   inputs x: f32[8,16], n: int, targets: i64[8]; parameter layers.0.attention.wq.weight
//   f32[16,16]; %linear_1 = aten::linear(x, wq) in module layers.0.attention; %size_1 =
//   aten::size(x, 0); outputs (linear_1, {"loss": sum_1, "n": size_1}) with %sum_1 =
//   aten::sum(linear_1) a scalar.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "apc/ir/graph.h"
#include "apc/spec/spec.h"

namespace apc::spec {
namespace {

using ir::DType;
using ir::Graph;
using ir::NodeKind;
using ir::OutputTree;
using ir::ValueId;
using ir::ValueType;
using mesh::Placement;

ValueId tensorValue(Graph& g, const std::string& name, std::vector<int64_t> shape, DType dtype) {
  ir::Value v;
  v.type = ValueType::kTensor;
  v.debug_name = name;
  v.tensor = ir::TensorMeta{ir::makeShape(shape), dtype, false};
  return g.addValue(std::move(v));
}

ValueId scalarValue(Graph& g, const std::string& name, ValueType type) {
  ir::Value v;
  v.type = type;
  v.debug_name = name;
  return g.addValue(std::move(v));
}

void addNode(Graph& g, NodeKind kind, const std::string& op, const std::string& name,
             std::vector<ValueId> inputs, std::vector<ValueId> outputs,
             const std::string& module_path = {}) {
  ir::Node n;
  n.kind = kind;
  n.op = op;
  n.name = name;
  n.inputs = std::move(inputs);
  n.outputs = std::move(outputs);
  n.module_path = module_path;
  g.addNode(std::move(n));
}

Graph makeGraph() {
  Graph g;
  ValueId x = tensorValue(g, "x", {8, 16}, DType::kF32);
  addNode(g, NodeKind::kInput, "input", "x", {}, {x});
  ValueId n = scalarValue(g, "n", ValueType::kInt);
  addNode(g, NodeKind::kInput, "input", "n", {}, {n});
  ValueId targets = tensorValue(g, "targets", {8}, DType::kI64);
  addNode(g, NodeKind::kInput, "input", "targets", {}, {targets});
  ValueId wq = tensorValue(g, "layers.0.attention.wq.weight", {16, 16}, DType::kF32);
  addNode(g, NodeKind::kParameter, "parameter", "layers.0.attention.wq.weight", {}, {wq});
  ValueId linear = tensorValue(g, "linear_1", {8, 16}, DType::kF32);
  addNode(g, NodeKind::kOp, "aten::linear", "", {x, wq}, {linear}, "layers.0.attention");
  ValueId zero = g.addConstant(ValueType::kInt, int64_t{0});
  ValueId size = scalarValue(g, "size_1", ValueType::kInt);
  addNode(g, NodeKind::kOp, "aten::size", "", {x, zero}, {size});
  ValueId sum = tensorValue(g, "sum_1", {}, DType::kF32);
  addNode(g, NodeKind::kOp, "aten::sum", "", {linear}, {sum});
  OutputTree dict;
  dict.kind = OutputTree::Kind::kDict;
  dict.keys = {"loss", "n"};
  dict.children = {OutputTree::makeLeaf(sum), OutputTree::makeLeaf(size)};
  OutputTree root;
  root.kind = OutputTree::Kind::kTuple;
  root.children = {OutputTree::makeLeaf(linear), dict};
  g.setOutputs(root);
  EXPECT_TRUE(g.verify().ok()) << g.verify().error().message();
  return g;
}

Spec specOf(const std::string& body) {
  auto s = parseSpecText(R"j({"mesh": {"shape": [2, 4], "names": ["dp", "tp"]})j" +
                         std::string(body.empty() ? "" : ", ") + body + "}");
  EXPECT_TRUE(s.ok()) << body << ": " << s.error().message();
  return s.ok() ? *s : Spec{};
}

/// The error of validating `body` against the sample graph ("" when it validates).
std::string validate(const std::string& body, ErrorCode* code = nullptr) {
  Status st = validateSpecAgainstGraph(specOf(body), makeGraph());
  if (st.ok()) return "";
  if (code) *code = st.error().code();
  return st.error().message();
}

TEST(SpecAgainstGraph, AcceptsAMatchingSpec) {
  EXPECT_EQ(validate(R"j("inputs": {"x": ["S(0)", "S(1)"], "targets": ["S(0)", "R"]},
                        "outputs": [["S(0)", "S(1)"], {"loss": ["P", "R"], "n": null}],
                        "dynamic_batch": true,
                        "dynamic": [{"input": "x", "dim": 0, "max": 64}, {"input": "targets", "dim": 0}],
                        "pins": [{"node": "linear_1", "placements": ["S(0)", "S(1)"]},
                                 {"node": "x", "placements": ["S(0)", "R"]},
                                 {"node": "layers.0.attention.wq.weight", "placements": ["R", "S(0)"]},
                                 {"module": "layers.0.attention", "placements": ["S(0)", "R"]},
                                 {"module": "layers.0", "placements": ["S(0)", "R"]},
                                 {"module": "layers.0.attention.wq", "placements": ["R", "R"]}])j"),
            "");
  EXPECT_EQ(validate(""), "");
  // A dict in the spec may leave keys out; a free output matches anything.
  EXPECT_EQ(validate(R"j("outputs": [null, {"loss": ["R", "R"]}])j"), "");
  EXPECT_EQ(validate(R"j("outputs": [["R", "R"], null])j"), "");
}

TEST(SpecAgainstGraph, UnknownInput) {
  ErrorCode code = ErrorCode::kInternal;
  EXPECT_EQ(validate(R"j("inputs": {"foo": ["S(0)", "R"]})j", &code),
            "$.inputs.foo: spec names input 'foo' but the model's inputs are: x, n, targets");
  EXPECT_EQ(code, ErrorCode::kNotFound);
  EXPECT_EQ(validate(R"j("inputs": {"tagrets": ["S(0)", "R"]})j"),
            "$.inputs.tagrets: spec names input 'tagrets' but the model's inputs are: x, n, "
            "targets (did you mean 'targets'?)");
  Graph empty;
  Status st = validateSpecAgainstGraph(specOf(R"j("inputs": {"x": ["R", "R"]})j"), empty);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().message(), "$.inputs.x: spec names input 'x' but the model has no inputs");
}

TEST(SpecAgainstGraph, InputMustBeATensorOfEnoughRank) {
  EXPECT_EQ(validate(R"j("inputs": {"n": ["R", "R"]})j"),
            "$.inputs.n: input 'n' is not a tensor (int)");
  ErrorCode code = ErrorCode::kInternal;
  EXPECT_EQ(validate(R"j("inputs": {"x": ["S(0)", "S(2)"]})j", &code),
            "$.inputs.x[1]: S(2) is out of range for input 'x' of rank 2 (f32[8,16])");
  EXPECT_EQ(code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(validate(R"j("inputs": {"targets": ["S(1)", "R"]})j"),
            "$.inputs.targets[0]: S(1) is out of range for input 'targets' of rank 1 (i64[8])");
}

TEST(SpecAgainstGraph, InputsAreNeverPartial) {
  Spec s = specOf("");
  s.inputs["x"] = {Placement::partial(), Placement::replicate()};
  Status st = validateSpecAgainstGraph(s, makeGraph());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().message(),
            "$.inputs.x[0]: P is not a placement for input 'x': an input is Shard or Replicate, "
            "never Partial");
  auto in = parseInShardings(nlohmann::json::parse(R"j([["P", "R"]])j"), 2);
  ASSERT_FALSE(in.ok());
  EXPECT_EQ(in.error().message(),
            "$[0][0]: P is not a placement for an input: an input is Shard or Replicate, never "
            "Partial");
}

TEST(SpecAgainstGraph, DynamicRangeHoldsTheRecordedSize) {
  EXPECT_EQ(validate(R"j("dynamic": [{"input": "x", "dim": 0, "min": 1099511627776,
                                       "max": 1099511627776}])j"),
            "$.dynamic[0]: input 'x' has size 8 in dim 0, outside its range [1099511627776, "
            "1099511627776]");
  EXPECT_EQ(validate(R"j("dynamic": [{"input": "x", "dim": 1, "max": 8}])j"),
            "$.dynamic[0]: input 'x' has size 16 in dim 1, outside its range [1, 8]");
  EXPECT_EQ(validate(R"j("dynamic": [{"input": "x", "dim": 1, "min": 16}])j"), "");
}

TEST(SpecAgainstGraph, NamesInMessagesAreEscaped) {
  std::string msg =
      validate(R"j("pins": [{"module": "lay\u0001ers\n0", "placements": ["R", "R"]}])j");
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_NE(msg.find("spec pins module 'lay\\x01ers\\n0'"), std::string::npos) << msg;
}

TEST(SpecAgainstGraph, DynamicDims) {
  EXPECT_EQ(validate(R"j("dynamic": [{"input": "x", "dim": 1}, {"input": "y", "dim": 0}])j"),
            "$.dynamic[1].input: spec names input 'y' but the model's inputs are: x, n, targets");
  EXPECT_EQ(validate(R"j("dynamic": [{"input": "x", "dim": 2}])j"),
            "$.dynamic[0].dim: dim 2 is out of range for input 'x' of rank 2 (f32[8,16])");
  EXPECT_EQ(validate(R"j("dynamic": [{"input": "n", "dim": 0}])j"),
            "$.dynamic[0].input: input 'n' is not a tensor (int)");
}

TEST(SpecAgainstGraph, OutputStructure) {
  EXPECT_EQ(validate(R"j("outputs": ["S(0)", "R"])j"),
            "$.outputs: spec gives a placement list but the model's output here is a tuple of 2");
  EXPECT_EQ(validate(R"j("outputs": [null, null, null])j"),
            "$.outputs: spec gives a sequence of 3 but the model's output here is a tuple of 2");
  EXPECT_EQ(validate(R"j("outputs": [["S(0)", "R"], [null]])j"),
            "$.outputs[1]: spec gives a sequence of 1 but the model's output here is a dict with "
            "keys: loss, n");
  EXPECT_EQ(validate(R"j("outputs": [{"a": null}, null])j"),
            "$.outputs[0]: spec gives a dict but the model's output here is a tensor f32[8,16]");
  EXPECT_EQ(validate(R"j("outputs": [null, {"logits": ["R", "R"]}])j"),
            "$.outputs[1].logits: spec names output key 'logits' but the model's dict has keys: "
            "loss, n");
  EXPECT_EQ(validate(R"j("outputs": [null, {"n": ["R", "R"]}])j"),
            "$.outputs[1].n: spec gives a placement list but the model's output here is a "
            "non-tensor value (int)");
  EXPECT_EQ(validate(R"j("outputs": [["S(2)", "R"], null])j"),
            "$.outputs[0][0]: S(2) is out of range for this output of rank 2 (f32[8,16])");
  EXPECT_EQ(validate(R"j("outputs": [null, {"loss": ["S(0)", "R"]}])j"),
            "$.outputs[1].loss[0]: S(0) is out of range for this output of rank 0 (f32[])");
}

TEST(SpecAgainstGraph, Pins) {
  ErrorCode code = ErrorCode::kInternal;
  EXPECT_EQ(validate(R"j("pins": [{"node": "linear_2", "placements": ["R", "R"]}])j", &code),
            "$.pins[0].node: spec pins node 'linear_2' but the model has no node of that name (did "
            "you mean 'linear_1'?)");
  EXPECT_EQ(code, ErrorCode::kNotFound);
  EXPECT_EQ(validate(R"j("pins": [{"node": "zzzzzzzz", "placements": ["R", "R"]}])j"),
            "$.pins[0].node: spec pins node 'zzzzzzzz' but the model has no node of that name");
  EXPECT_EQ(validate(R"j("pins": [{"node": "size_1", "placements": ["R", "R"]}])j"),
            "$.pins[0].node: node 'size_1' is not a tensor (int)");
  EXPECT_EQ(validate(R"j("pins": [{"node": "x", "placements": ["R", "R"]},
                                 {"node": "sum_1", "placements": ["S(0)", "R"]}])j"),
            "$.pins[1].placements[0]: S(0) is out of range for node 'sum_1' of rank 0 (f32[])");
  EXPECT_EQ(validate(R"j("pins": [{"module": "layers.1", "placements": ["R", "R"]}])j", &code),
            "$.pins[0].module: spec pins module 'layers.1' but the model has no module of that "
            "path (did you mean 'layers.0'?)");
  EXPECT_EQ(code, ErrorCode::kNotFound);
  // A prefix of a path is a module only at a dot boundary.
  EXPECT_EQ(validate(R"j("pins": [{"module": "layers.0.att", "placements": ["R", "R"]}])j"),
            "$.pins[0].module: spec pins module 'layers.0.att' but the model has no module of that "
            "path (did you mean 'layers.0'?)");
}

TEST(ResolveInShardings, ByPositionAndByName) {
  Graph g = makeGraph();
  auto list =
      parseInShardings(nlohmann::json::parse(R"j([["S(0)", "R"], null, ["S(0)", "R"]])j"), 2);
  ASSERT_TRUE(list.ok());
  auto r = resolveInShardings(*list, g);
  ASSERT_TRUE(r.ok()) << r.error().message();
  PlacementTuple s0r = {Placement::shard(0), Placement::replicate()};
  EXPECT_EQ(*r, (std::map<std::string, PlacementTuple>{{"x", s0r}, {"targets", s0r}}));

  auto obj = parseInShardings(nlohmann::json::parse(R"j({"targets": ["S(0)", "R"]})j"), 2);
  ASSERT_TRUE(obj.ok());
  auto ro = resolveInShardings(*obj, g);
  ASSERT_TRUE(ro.ok());
  EXPECT_EQ(*ro, (std::map<std::string, PlacementTuple>{{"targets", s0r}}));
}

TEST(ResolveInShardings, Errors) {
  Graph g = makeGraph();
  InputShardings short_list;
  short_list.by_position = {PlacementTuple{Placement::shard(0)}};
  auto r = resolveInShardings(short_list, g);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message(),
            "$: in-shardings list has 1 entry but the model has 3 inputs (x, n, targets)");
  InputShardings unknown;
  unknown.by_name["y"] = PlacementTuple{Placement::shard(0)};
  auto u = resolveInShardings(unknown, g);
  ASSERT_FALSE(u.ok());
  EXPECT_EQ(u.error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(u.error().message(),
            "$.y: spec names input 'y' but the model's inputs are: x, n, targets");
  InputShardings both;
  both.by_position = {PlacementTuple{Placement::shard(0)}, std::nullopt, std::nullopt};
  both.by_name["x"] = PlacementTuple{Placement::replicate()};
  auto b = resolveInShardings(both, g);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.error().message(), "$.x: input 'x' is given twice");
}

}  // namespace
}  // namespace apc::spec
