//===- tests/frontend/functionalize_test.cpp - In-place ops out of place ---===//
//
// functionalizeInPlace on hand-built graphs: traced form (later reads already rebound), scripted
// form (later reads of the written value), writes into module state kept, writes through a view
// whose base is read later refused unless it goes through slices and selects (then written back
// by scatters, repeated writes each in turn, other views replayed from the new base); and the
// schema facts LibTorch gives for real ops. The differential test against torch on scripted
// models is ExportedFixtures.InPlaceWritesThroughViewsComputeWhatTorchComputes.
//
//===----------------------------------------------------------------------===//
#include "apc/frontend/functionalize.h"

#include <gtest/gtest.h>

namespace apc::frontend {
namespace {

ir::TensorMeta f32(std::vector<int64_t> s) {
  ir::TensorMeta m;
  for (int64_t d : s) m.shape.push_back(ir::Dim::fixed(d));
  m.dtype = ir::DType::kF32;
  return m;
}

struct Builder {
  ir::Graph g;
  ir::ValueId tensor(const std::string& name) {
    ir::Value v;
    v.type = ir::ValueType::kTensor;
    v.debug_name = name;
    v.tensor = f32({4, 4});
    return g.addValue(std::move(v));
  }
  ir::ValueId leaf(ir::NodeKind kind, const std::string& name) {
    ir::ValueId v = tensor(name);
    ir::Node n;
    n.kind = kind;
    n.op = ir::nodeKindName(kind);
    n.name = name;
    n.outputs = {v};
    g.addNode(std::move(n));
    return v;
  }
  ir::NodeId op(const std::string& op, const std::string& overload, std::vector<ir::ValueId> in,
                ir::ValueId* out) {
    *out = tensor(op);
    ir::Node n;
    n.op = op;
    n.overload = overload;
    n.inputs = std::move(in);
    n.outputs = {*out};
    return g.addNode(std::move(n));
  }
};

/// relu_ and add_.Tensor write input 0; view returns an alias of input 0.
NodeAliasing table(const ir::Node& n) {
  NodeAliasing a;
  a.output_aliases.assign(n.outputs.size(), -1);
  if (n.op == "aten::relu_") a = {true, "aten::relu", "", {0}};
  if (n.op == "aten::add_") a = {true, "aten::add", n.overload, {0}};
  if (n.op == "aten::fill_") a = {true, "aten::fill", n.overload, {0}};
  if (n.op == "aten::view" || n.op == "aten::slice" || n.op == "aten::select")
    a.output_aliases = {0};
  return a;
}

TEST(Functionalize, TracedChainBecomesOutOfPlace) {
  Builder b;
  ir::ValueId x = b.leaf(ir::NodeKind::kInput, "x");
  ir::ValueId h, r, s;
  b.op("aten::neg", "", {x}, &h);
  ir::NodeId relu = b.op("aten::relu_", "", {h}, &r);
  ir::NodeId add = b.op("aten::add_", "Tensor", {r, x}, &s);
  b.g.setOutputs(ir::OutputTree::makeLeaf(s));
  auto rep = functionalizeInPlace(b.g, table);
  ASSERT_TRUE(rep.ok()) << rep.error().message();
  EXPECT_EQ(rep->functionalized, 2);
  EXPECT_EQ(rep->kept, 0);
  EXPECT_EQ(b.g.node(relu).qualifiedOp(), "aten::relu");
  EXPECT_EQ(b.g.node(add).qualifiedOp(), "aten::add.Tensor");
  EXPECT_EQ(b.g.node(add).inputs[0], r);
  EXPECT_TRUE(b.g.verify().ok());
}

TEST(Functionalize, ScriptedReadsAfterTheWriteReadTheNewValue) {
  // h = neg(x); y = h.relu_(); z = h * 2; return (h)  ->  z and the output read y.
  Builder b;
  ir::ValueId x = b.leaf(ir::NodeKind::kInput, "x");
  ir::ValueId h, y, z;
  ir::NodeId neg = b.op("aten::neg", "", {x}, &h);
  b.op("aten::relu_", "", {h}, &y);
  ir::NodeId mul = b.op("aten::mul", "Tensor", {h, h}, &z);
  ir::OutputTree t;
  t.kind = ir::OutputTree::Kind::kTuple;
  t.children = {ir::OutputTree::makeLeaf(h), ir::OutputTree::makeLeaf(z)};
  b.g.setOutputs(t);
  auto rep = functionalizeInPlace(b.g, table);
  ASSERT_TRUE(rep.ok()) << rep.error().message();
  EXPECT_EQ(rep->functionalized, 1);
  EXPECT_EQ(b.g.node(mul).inputs, (std::vector<ir::ValueId>{y, y}));
  EXPECT_EQ(b.g.outputs().children[0].leaf, y);
  EXPECT_EQ(b.g.node(neg).inputs[0], x);  // reads before the write keep the old value
}

TEST(Functionalize, WritesIntoModuleStateStayInPlace) {
  Builder b;
  ir::ValueId count = b.leaf(ir::NodeKind::kBuffer, "bn.num_batches_tracked");
  ir::ValueId one = b.leaf(ir::NodeKind::kBuffer, "one");
  ir::ValueId out;
  ir::NodeId add = b.op("aten::add_", "Tensor", {count, one}, &out);
  b.g.setOutputs(ir::OutputTree::makeLeaf(out));
  auto rep = functionalizeInPlace(b.g, table);
  ASSERT_TRUE(rep.ok());
  EXPECT_EQ(rep->kept, 1);
  EXPECT_EQ(b.g.node(add).qualifiedOp(), "aten::add_.Tensor");
}

TEST(Functionalize, WriteThroughAViewWhoseBaseIsReadLaterIsRefused) {
  Builder b;
  ir::ValueId x = b.leaf(ir::NodeKind::kInput, "x");
  ir::ValueId h, v, w, z;
  b.op("aten::neg", "", {x}, &h);
  b.op("aten::view", "", {h}, &v);
  ir::NodeId relu = b.op("aten::relu_", "", {v}, &w);
  b.g.node(relu).source = "model.py:7";
  b.op("aten::sum", "", {h}, &z);  // reads the base after the write: sees relu'd values
  b.g.setOutputs(ir::OutputTree::makeLeaf(z));
  auto rep = functionalizeInPlace(b.g, table);
  ASSERT_FALSE(rep.ok());
  EXPECT_NE(rep.error().message().find("in-place aten::relu_ at model.py:7"), std::string::npos)
      << rep.error().message();
}

TEST(Functionalize, WriteThroughAViewNobodyReadsLaterIsRewritten) {
  Builder b;
  ir::ValueId x = b.leaf(ir::NodeKind::kInput, "x");
  ir::ValueId h, v, w;
  b.op("aten::neg", "", {x}, &h);
  b.op("aten::view", "", {h}, &v);
  b.op("aten::relu_", "", {v}, &w);
  b.g.setOutputs(ir::OutputTree::makeLeaf(w));
  auto rep = functionalizeInPlace(b.g, table);
  ASSERT_TRUE(rep.ok());
  EXPECT_EQ(rep->functionalized, 1);
}

// Swin's shifted-window mask: `mask = x.new_zeros(...); mask[a:b, c:d] = k; ...; use(mask)`.
TEST(Functionalize, WritesThroughSlicesAndSelectsAreScatteredBack) {
  Builder b;
  ir::ValueId x = b.leaf(ir::NodeKind::kInput, "x");
  ir::ValueId zero = b.g.addConstant(ir::ValueType::kInt, int64_t{0});
  ir::ValueId one = b.g.addConstant(ir::ValueType::kInt, int64_t{1});
  ir::ValueId two = b.g.addConstant(ir::ValueType::kInt, int64_t{2});
  ir::ValueId mask, s1, s2, f1, s3, sel, f2, z;
  b.op("aten::neg", "", {x}, &mask);
  b.op("aten::slice", "Tensor", {mask, zero, zero, two, one}, &s1);
  b.op("aten::slice", "Tensor", {s1, one, zero, two, one}, &s2);
  b.op("aten::fill_", "Scalar", {s2, one}, &f1);
  ir::NodeId slice3 = b.op("aten::slice", "Tensor", {mask, zero, two, two, one}, &s3);
  b.op("aten::select", "int", {s3, one, one}, &sel);
  b.op("aten::fill_", "Scalar", {sel, two}, &f2);
  b.op("aten::sum", "", {mask}, &z);
  ir::OutputTree outs;
  outs.kind = ir::OutputTree::Kind::kTuple;
  outs.children = {ir::OutputTree::makeLeaf(z), ir::OutputTree::makeLeaf(mask)};
  b.g.setOutputs(outs);
  auto rep = functionalizeInPlace(b.g, table);
  ASSERT_TRUE(rep.ok()) << rep.error().message();
  EXPECT_EQ(rep->functionalized, 2);
  EXPECT_EQ(rep->scattered, 2);
  ASSERT_TRUE(b.g.verify().ok()) << b.g.verify().error().message();
  std::vector<std::string> ops;
  for (const ir::Node& n : b.g.nodes())
    if (n.kind == ir::NodeKind::kOp) ops.push_back(n.qualifiedOp());
  EXPECT_EQ(ops, (std::vector<std::string>{
                     "aten::neg", "aten::slice.Tensor", "aten::slice.Tensor", "aten::fill.Scalar",
                     "aten::slice_scatter", "aten::slice_scatter", "aten::slice.Tensor",
                     "aten::select.int", "aten::fill.Scalar", "aten::select_scatter",
                     "aten::slice_scatter", "aten::sum"}));
  // Each scatter writes the new piece into the previous version, with the view's arguments.
  auto node = [&](size_t k) -> const ir::Node& { return b.g.nodes().at(k + 1); };  // 0: input
  EXPECT_EQ(node(4).inputs, (std::vector<ir::ValueId>{s1, f1, one, zero, two, one}));
  EXPECT_EQ(node(5).inputs,
            (std::vector<ir::ValueId>{mask, node(4).outputs[0], zero, zero, two, one}));
  ir::ValueId v1 = node(5).outputs[0];
  EXPECT_EQ(node(6).inputs[0], v1);  // the second write's slice reads the first write's result
  EXPECT_EQ(node(9).inputs, (std::vector<ir::ValueId>{s3, f2, one, one}));
  EXPECT_EQ(node(10).inputs,
            (std::vector<ir::ValueId>{v1, node(9).outputs[0], zero, two, two, one}));
  ir::ValueId v2 = node(10).outputs[0];
  EXPECT_EQ(node(11).inputs[0], v2);  // later reads of the base read the last version
  EXPECT_EQ(b.g.outputs().children[1].leaf, v2);
  EXPECT_EQ(b.g.value(v2).tensor, b.g.value(mask).tensor);
  (void)slice3;
}

// Another view of the base taken before the write and read after it sees the write: it is
// recomputed from the base's new version (its slice replayed).
TEST(Functionalize, AnotherViewReadAfterAWriteIsReplayedFromTheNewBase) {
  Builder b;
  ir::ValueId x = b.leaf(ir::NodeKind::kInput, "x");
  ir::ValueId zero = b.g.addConstant(ir::ValueType::kInt, int64_t{0});
  ir::ValueId one = b.g.addConstant(ir::ValueType::kInt, int64_t{1});
  ir::ValueId two = b.g.addConstant(ir::ValueType::kInt, int64_t{2});
  ir::ValueId mask, s1, other, f1, z;
  b.op("aten::neg", "", {x}, &mask);
  b.op("aten::slice", "Tensor", {mask, zero, zero, two, one}, &s1);
  b.op("aten::slice", "Tensor", {mask, one, one, two, one}, &other);
  b.op("aten::fill_", "Scalar", {s1, one}, &f1);
  ir::NodeId sum = b.op("aten::sum", "", {other}, &z);  // taken before the write, read after
  b.g.setOutputs(ir::OutputTree::makeLeaf(z));
  auto rep = functionalizeInPlace(b.g, table);
  ASSERT_TRUE(rep.ok()) << rep.error().message();
  ASSERT_TRUE(b.g.verify().ok()) << b.g.verify().error().message();
  std::vector<std::string> ops;
  for (const ir::Node& n : b.g.nodes())
    if (n.kind == ir::NodeKind::kOp) ops.push_back(n.qualifiedOp());
  EXPECT_EQ(ops, (std::vector<std::string>{"aten::neg", "aten::slice.Tensor", "aten::slice.Tensor",
                                           "aten::fill.Scalar", "aten::slice_scatter",
                                           "aten::slice.Tensor", "aten::sum"}));
  auto node = [&](size_t k) -> const ir::Node& { return b.g.nodes().at(k + 1); };  // 0: input
  EXPECT_EQ(node(4).inputs, (std::vector<ir::ValueId>{mask, f1, zero, zero, two, one}));
  EXPECT_EQ(node(5).inputs, (std::vector<ir::ValueId>{node(4).outputs[0], one, one, two, one}));
  EXPECT_EQ(node(6).inputs[0], node(5).outputs[0]);
  (void)sum;
}

// The case: two writes through one view (`v = h[:, :2]; v.fill_(1); v.add_(h2)`, and the
// traced chain where the second write reads the first's output): the second write goes through
// the first's result and both reach the base.
TEST(Functionalize, RepeatedWritesThroughOneViewAreAllWrittenBack) {
  for (bool chained : {false, true}) {
    SCOPED_TRACE(chained ? "chained" : "repeated");
    Builder b;
    ir::ValueId x = b.leaf(ir::NodeKind::kInput, "x");
    ir::ValueId zero = b.g.addConstant(ir::ValueType::kInt, int64_t{0});
    ir::ValueId one = b.g.addConstant(ir::ValueType::kInt, int64_t{1});
    ir::ValueId two = b.g.addConstant(ir::ValueType::kInt, int64_t{2});
    ir::ValueId h, v, f, s, z;
    b.op("aten::neg", "", {x}, &h);
    b.op("aten::slice", "Tensor", {h, one, zero, two, one}, &v);
    b.op("aten::fill_", "Scalar", {v, one}, &f);
    b.op("aten::add_", "Tensor", {chained ? f : v, x}, &s);
    b.op("aten::sum", "", {h}, &z);
    ir::OutputTree outs;
    outs.kind = ir::OutputTree::Kind::kTuple;
    outs.children = {ir::OutputTree::makeLeaf(z), ir::OutputTree::makeLeaf(h)};
    b.g.setOutputs(outs);
    auto rep = functionalizeInPlace(b.g, table);
    ASSERT_TRUE(rep.ok()) << rep.error().message();
    EXPECT_EQ(rep->functionalized, 2);
    EXPECT_EQ(rep->scattered, 2);
    ASSERT_TRUE(b.g.verify().ok()) << b.g.verify().error().message();
    auto node = [&](size_t k) -> const ir::Node& { return b.g.nodes().at(k + 1); };
    std::vector<std::string> ops;
    for (const ir::Node& n : b.g.nodes())
      if (n.kind == ir::NodeKind::kOp) ops.push_back(n.qualifiedOp());
    EXPECT_EQ(ops, (std::vector<std::string>{"aten::neg", "aten::slice.Tensor", "aten::fill.Scalar",
                                             "aten::slice_scatter", "aten::add.Tensor",
                                             "aten::slice_scatter", "aten::sum"}));
    ir::ValueId v1 = node(3).outputs[0];
    EXPECT_EQ(node(3).inputs, (std::vector<ir::ValueId>{h, f, one, zero, two, one}));
    EXPECT_EQ(node(4).inputs[0], f);  // the second write reads the first's result
    EXPECT_EQ(node(5).inputs, (std::vector<ir::ValueId>{v1, s, one, zero, two, one}));
    ir::ValueId v2 = node(5).outputs[0];
    EXPECT_EQ(node(6).inputs[0], v2);
    EXPECT_EQ(b.g.outputs().children[1].leaf, v2);
  }
}

// A value taken by an op that may copy (reshape) cannot be recomputed from the base: refused.
TEST(Functionalize, AValueThatMayBeACopyReadAfterAWriteIsRefused) {
  Builder b;
  ir::ValueId x = b.leaf(ir::NodeKind::kInput, "x");
  ir::ValueId zero = b.g.addConstant(ir::ValueType::kInt, int64_t{0});
  ir::ValueId one = b.g.addConstant(ir::ValueType::kInt, int64_t{1});
  ir::ValueId mask, s1, other, f1, z;
  b.op("aten::neg", "", {x}, &mask);
  b.op("aten::slice", "Tensor", {mask, zero, zero, one, one}, &s1);
  b.op("aten::reshape", "", {mask}, &other);
  ir::NodeId fill = b.op("aten::fill_", "Scalar", {s1, one}, &f1);
  b.g.node(fill).source = "model.py:9";
  b.op("aten::sum", "", {other}, &z);
  b.g.setOutputs(ir::OutputTree::makeLeaf(z));
  auto table_with_reshape = [](const ir::Node& n) {
    NodeAliasing a = table(n);
    if (n.op == "aten::reshape") a.output_aliases = {0};
    return a;
  };
  auto rep = functionalizeInPlace(b.g, table_with_reshape);
  ASSERT_FALSE(rep.ok());
  EXPECT_NE(rep.error().message().find("in-place aten::fill_.Scalar at model.py:9 writes through "
                                       "a view of a tensor that is read afterwards"),
            std::string::npos)
      << rep.error().message();
  EXPECT_EQ(rep.error().message().find('\n'), std::string::npos);
}

TEST(Functionalize, SchemaFactsFromLibTorch) {
  ir::Node n;
  n.op = "aten::add_";
  n.overload = "Tensor";
  n.outputs = {ir::ValueId(0)};
  NodeAliasing a = torchSchemaAliasing(n);
  EXPECT_TRUE(a.in_place);
  EXPECT_EQ(a.functional_op, "aten::add");
  EXPECT_EQ(a.functional_overload, "Tensor");

  n.op = "aten::bernoulli_";  // bernoulli_.float -> bernoulli.p: another overload name
  n.overload = "float";
  a = torchSchemaAliasing(n);
  EXPECT_TRUE(a.in_place);
  EXPECT_EQ(a.functional_op, "aten::bernoulli");
  EXPECT_EQ(a.functional_overload, "p");

  n.op = "aten::view";
  n.overload = "";
  a = torchSchemaAliasing(n);
  EXPECT_FALSE(a.in_place);
  EXPECT_EQ(a.output_aliases, std::vector<int>{0});

  n.op = "aten::relu";
  a = torchSchemaAliasing(n);
  EXPECT_FALSE(a.in_place);
  EXPECT_EQ(a.output_aliases, std::vector<int>{-1});
}

}  // namespace
}  // namespace apc::frontend
