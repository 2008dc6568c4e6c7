//===- tests/strategy_validator/local_rewrite_test.cpp - Local rewrites, one by one ===//
//
// Each row of the table of local rewrites (apc/strategy/local_rewrite.h, each op's
// OpInfo::local_rewrite), as lowering ships them (apc/lower/local_rewrite.h), on a hand-built
// one-op graph with cut tensors and uneven pieces, through the same per-rank path as the strategy
// validator (node_check.h): the reassembled outputs must equal the unsharded op, and the rewrite
// must actually have been applied. The sample models exercise only some rows (views, factories,
// vocab-parallel embedding).
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <c10/core/DefaultDtype.h>

#include "../common/placements.h"
#include "apc/strategy/strategy.h"
#include "node_check.h"

namespace apc::validator {
namespace {

using mesh::DeviceMesh;
using mesh::PlacementTuple;

/// A graph of input nodes and one op node.
struct OneOpGraph {
  ir::Graph g;
  std::vector<ir::ValueId> args;

  void tensor(ir::DType dtype, std::vector<int64_t> shape) {
    ir::Value v;
    v.type = ir::ValueType::kTensor;
    v.debug_name = "in" + std::to_string(args.size());
    v.tensor = ir::TensorMeta{ir::makeShape(shape), dtype, false};
    ir::ValueId id = g.addValue(std::move(v));
    ir::Node n;
    n.kind = ir::NodeKind::kInput;
    n.op = "input";
    n.name = "in" + std::to_string(args.size());
    n.outputs = {id};
    g.addNode(std::move(n));
    args.push_back(id);
  }
  void constant(ir::ValueType type, ir::Constant c) { args.push_back(g.addConstant(type, c)); }

  const ir::Node& op(const char* name, const char* overload, ir::DType dtype,
                     std::vector<int64_t> out_shape) {
    ir::Value v;
    v.type = ir::ValueType::kTensor;
    v.debug_name = "out";
    v.tensor = ir::TensorMeta{ir::makeShape(out_shape), dtype, false};
    ir::ValueId out = g.addValue(std::move(v));
    ir::Node n;
    n.op = name;
    n.overload = overload;
    n.inputs = args;
    n.outputs = {out};
    return g.node(g.addNode(std::move(n)));
  }
};

using testing::tuple;

/// Runs the strategy (input placements in argument order, nullptr for non-tensors) on `mesh`.
void expectExact(const OneOpGraph& og, const ir::Node& node, std::vector<const char*> inputs,
                 const char* output, std::vector<int64_t> mesh_shape) {
  DeviceMesh mesh = *DeviceMesh::create(mesh_shape);
  strategy::Strategy s;
  for (const char* in : inputs)
    s.inputs.push_back(in ? std::optional<PlacementTuple>(tuple(in)) : std::nullopt);
  s.outputs.push_back(tuple(output));
  SCOPED_TRACE(node.qualifiedOp() + " " + s.toString() + " on " + mesh.toString());
  caffe2::TypeMeta saved = c10::get_default_dtype();
  c10::set_default_dtype(caffe2::TypeMeta::Make<double>());
  Expected<NodeOp> op = NodeOp::resolve(node);
  ASSERT_TRUE(op.ok()) << op.error().message();
  ASSERT_EQ(op->schema()->arguments().size(), node.inputs.size());
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
  Expected<std::vector<c10::IValue>> full = makeFullInputs(og.g, node, *op, gen);
  ASSERT_TRUE(full.ok()) << full.error().message();
  Expected<std::vector<c10::IValue>> ref = runNode(node, *op, *full);
  ASSERT_TRUE(ref.ok()) << ref.error().message();
  EXPECT_EQ(checkReferenceShapes(og.g, node, *ref), std::nullopt);
  EXPECT_EQ(checkStrategyForm(og.g, node, s, mesh), std::nullopt);
  CheckStats stats;
  EXPECT_EQ(checkStrategy(og.g, node, *op, s, mesh, *full, *ref, gen, stats), std::nullopt);
  EXPECT_GT(stats.rewrites, 0) << "the rewrite was never applied";
  c10::set_default_dtype(saved);
}

using VT = ir::ValueType;

TEST(LocalRewrite, ArangeWithCutOutput) {
  OneOpGraph og;  // arange.start(3, 14): 11 elements, uneven on 4 and on 2x2
  og.constant(VT::kInt, int64_t{3});
  og.constant(VT::kInt, int64_t{14});
  for (int i = 0; i < 3; ++i) og.constant(VT::kNone, ir::None{});
  og.constant(VT::kBool, false);
  const ir::Node& n = og.op("aten::arange", "start", ir::DType::kI64, {11});
  expectExact(og, n, {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr}, "S(0)", {4});
  expectExact(og, n, {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr}, "S(0),S(0)", {2, 2});
}

TEST(LocalRewrite, FloatArangeWithStep) {
  OneOpGraph og;  // arange.start_step(0.5, 6.0, 0.5): 11 elements
  og.constant(VT::kFloat, 0.5);
  og.constant(VT::kFloat, 6.0);
  og.constant(VT::kFloat, 0.5);
  for (int i = 0; i < 3; ++i) og.constant(VT::kNone, ir::None{});
  og.constant(VT::kBool, false);
  const ir::Node& n = og.op("aten::arange", "start_step", ir::DType::kF32, {11});
  expectExact(og, n, std::vector<const char*>(7, nullptr), "S(0)", {4});
}

TEST(LocalRewrite, FullAndNewZerosWithCutOutput) {
  OneOpGraph full;  // full([5, 7], 2.5)
  full.constant(VT::kIntList, std::vector<int64_t>{5, 7});
  full.constant(VT::kFloat, 2.5);
  for (int i = 0; i < 3; ++i) full.constant(VT::kNone, ir::None{});
  full.constant(VT::kBool, false);
  const ir::Node& f = full.op("aten::full", "", ir::DType::kF32, {5, 7});
  expectExact(full, f, std::vector<const char*>(6, nullptr), "S(1),S(0)", {2, 4});

  OneOpGraph nz;  // x.new_zeros([6, 3]) with x replicated
  nz.tensor(ir::DType::kF32, {2, 2});
  nz.constant(VT::kIntList, std::vector<int64_t>{6, 3});
  for (int i = 0; i < 3; ++i) nz.constant(VT::kNone, ir::None{});
  nz.constant(VT::kBool, false);
  const ir::Node& z = nz.op("aten::new_zeros", "", ir::DType::kF32, {6, 3});
  expectExact(nz, z, {"R", nullptr, nullptr, nullptr, nullptr, nullptr}, "S(0)", {4});
}

TEST(LocalRewrite, UnflattenOfACutDim) {
  OneOpGraph og;  // [6, 12] -> unflatten(1, [3, 4]) with dim 1 cut in 3: the 3 is cut
  og.tensor(ir::DType::kF32, {6, 12});
  og.constant(VT::kInt, int64_t{1});
  og.constant(VT::kIntList, std::vector<int64_t>{3, 4});
  const ir::Node& n = og.op("aten::unflatten", "int", ir::DType::kF32, {6, 3, 4});
  expectExact(og, n, {"S(1)", nullptr, nullptr}, "S(1)", {3});
}

TEST(LocalRewrite, NarrowOverAWholeCutDim) {
  OneOpGraph og;  // narrow(0, 0, 7) of a [7, 3] tensor cut along dim 0 into 4, 3
  og.tensor(ir::DType::kF32, {7, 3});
  og.constant(VT::kInt, int64_t{0});
  og.constant(VT::kInt, int64_t{0});
  og.constant(VT::kInt, int64_t{7});
  const ir::Node& n = og.op("aten::narrow", "", ir::DType::kF32, {7, 3});
  expectExact(og, n, {"S(0)", nullptr, nullptr, nullptr}, "S(0)", {2});
}

TEST(LocalRewrite, VocabParallelEmbedding) {
  OneOpGraph og;  // 10 rows cut 3,3,3,1 (and nested 3,2,3,2); padding row 4
  og.tensor(ir::DType::kF32, {10, 3});
  og.tensor(ir::DType::kI64, {4, 5});
  og.constant(VT::kInt, int64_t{4});
  og.constant(VT::kBool, false);
  og.constant(VT::kBool, false);
  const ir::Node& n = og.op("aten::embedding", "", ir::DType::kF32, {4, 5, 3});
  expectExact(og, n, {"S(0)", "R", nullptr, nullptr, nullptr}, "P", {4});
  expectExact(og, n, {"S(0),S(0)", "R,R", nullptr, nullptr, nullptr}, "P,P", {2, 2});
  expectExact(og, n, {"R,S(0)", "S(1),R", nullptr, nullptr, nullptr}, "S(1),P", {2, 2});
}

}  // namespace
}  // namespace apc::validator
