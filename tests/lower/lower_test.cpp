//===- tests/lower/lower_test.cpp - lib/lower without LibTorch -------------===//
//
// The local rewrites on hand-made pieces, lowering of the hand-built toy block and size-arithmetic
// graphs (tests/ir/test_graphs.h) planned on [4], [2,2] and [2,4] (program_checks.h), a plan with
// Partial outputs reduced at the end, and the artifact writer/reader: byte-identical rewrites,
// tampered, truncated and wrong-version files rejected with one-line errors.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "../plan/plan_fixtures.h"
#include "apc/artifact/artifact.h"
#include "apc/artifact/typed_proto.h"
#include "apc/cost/cost_model.h"
#include "apc/ir/op_collective.h"
#include "apc/lower/local_rewrite.h"
#include "apc/lower/lower.h"
#include "program_checks.h"

namespace apc::lower {
namespace {

namespace fs = std::filesystem;
using ir::testing_graphs::leafNode;
using ir::testing_graphs::opNode;
using ir::testing_graphs::tensorValue;
using ir::testing_graphs::toyBlock;
using ir::testing_graphs::withSizeArithmetic;
using plan::testing::planOf;
using plan::testing::specFor;

TensorPiece piece(std::vector<int64_t> global, std::vector<layout::DimPiece> local) {
  return {std::move(global), std::move(local), {}, {}, {}};
}

ir::Node opNamed(const std::string& op, const std::string& overload = "") {
  ir::Node n;
  n.op = op;
  n.overload = overload;
  return n;
}

TEST(LocalRewrite, ViewGetsLocalOutputShape) {
  RankPieces rp;
  rp.inputs = {{piece({8, 48}, {{0, 8}, {12, 12}})}, {}};
  rp.outputs = {{piece({8, 4, 12}, {{0, 8}, {1, 1}, {0, 12}})}};
  std::vector<std::optional<ir::Constant>> c = {std::nullopt, std::vector<int64_t>{8, -1, 12}};
  auto r = localizeNode(opNamed("aten::view"), c, rp);
  ASSERT_TRUE(r.ok()) << r.error().message();
  ASSERT_EQ(r->replace.size(), 1u);
  EXPECT_EQ(r->replace[0].first, 1u);
  EXPECT_EQ(std::get<std::vector<int64_t>>(r->replace[0].second), (std::vector<int64_t>{8, 1, 12}));
}

TEST(LocalRewrite, UncutViewKeepsItsSizes) {
  RankPieces rp;
  rp.inputs = {{piece({8, 48}, {{0, 8}, {0, 48}})}, {}};
  rp.outputs = {{piece({8, 4, 12}, {{0, 8}, {0, 4}, {0, 12}})}};
  std::vector<std::optional<ir::Constant>> c = {std::nullopt, std::vector<int64_t>{8, -1, 12}};
  auto r = localizeNode(opNamed("aten::reshape"), c, rp);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->empty());
}

TEST(LocalRewrite, DynamicDimBecomesMinusOne) {
  RankPieces rp;
  rp.inputs = {{piece({8, 48}, {{0, 8}, {12, 12}})}, {}};
  TensorPiece out = piece({8, 4, 12}, {{0, 8}, {1, 1}, {0, 12}});
  out.symbolic = {true, false, false};
  rp.outputs = {{out}};
  auto r = localizeNode(opNamed("aten::view"),
                        {std::nullopt, ir::Constant(std::vector<int64_t>{8, 4, 12})}, rp);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->replace.size(), 1u);
  EXPECT_EQ(std::get<std::vector<int64_t>>(r->replace[0].second),
            (std::vector<int64_t>{-1, 1, 12}));
  // expand keeps explicit sizes (its -1 means "keep", not "infer").
  auto e = localizeNode(opNamed("aten::expand"),
                        {std::nullopt, ir::Constant(std::vector<int64_t>{8, 4, 12})}, rp);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(std::get<std::vector<int64_t>>(e->replace.at(0).second),
            (std::vector<int64_t>{8, 1, 12}));
}

TEST(LocalRewrite, ExpandKeepsTheRunTimeSizeOfASymbolicInputDim) {
  // repeat_kv: x[B, T, 2, 1, 16].expand(B, T, 2, 2, 16) with B symbolic (folded to the hint 8),
  // batch-sharded: B becomes -1 ("keep the input's size"); the broadcast dim keeps its size.
  RankPieces rp;
  TensorPiece in = piece({8, 8, 2, 1, 16}, {{0, 4}, {0, 8}, {0, 2}, {0, 1}, {0, 16}});
  in.symbolic = {true, false, false, false, false};
  TensorPiece out = piece({8, 8, 2, 2, 16}, {{0, 4}, {0, 8}, {0, 2}, {0, 2}, {0, 16}});
  out.symbolic = {true, false, false, false, false};
  rp.inputs = {{in}, {}, {}};
  rp.outputs = {{out}};
  auto e = localizeNode(opNamed("aten::expand"),
                        {std::nullopt, ir::Constant(std::vector<int64_t>{8, 8, 2, 2, 16})}, rp);
  ASSERT_TRUE(e.ok()) << e.error().message();
  ASSERT_EQ(e->replace.size(), 1u);
  EXPECT_EQ(std::get<std::vector<int64_t>>(e->replace[0].second),
            (std::vector<int64_t>{-1, 8, 2, 2, 16}));
  // A leading dim that expand adds (no input dim) keeps its size even when symbolic.
  TensorPiece in3 = piece({8, 1, 16}, {{0, 4}, {0, 1}, {0, 16}});
  in3.symbolic = {true, false, false};
  TensorPiece out4 = piece({3, 8, 2, 16}, {{0, 3}, {0, 4}, {0, 2}, {0, 16}});
  out4.symbolic = {true, true, false, false};
  rp.inputs = {{in3}, {}, {}};
  rp.outputs = {{out4}};
  auto f = localizeNode(opNamed("aten::expand"),
                        {std::nullopt, ir::Constant(std::vector<int64_t>{3, 8, 2, 16})}, rp);
  ASSERT_TRUE(f.ok()) << f.error().message();
  ASSERT_EQ(f->replace.size(), 1u);
  EXPECT_EQ(std::get<std::vector<int64_t>>(f->replace[0].second),
            (std::vector<int64_t>{3, -1, 2, 16}));
}

/// A piece whose dim 0 is the symbol B (per_symbol k), placed `t`.
TensorPiece symbolicPiece(std::vector<int64_t> global, std::vector<layout::DimPiece> local,
                          int64_t per_symbol, mesh::PlacementTuple t) {
  TensorPiece p = piece(global, std::move(local));
  p.symbolic.assign(global.size(), false);
  p.symbolic[0] = true;
  for (int64_t n : global) p.dims.push_back(ir::Dim::fixed(n));
  p.dims[0] = ir::Dim::symbolic("B", global[0], per_symbol);
  p.placement = std::move(t);
  return p;
}

TEST(LocalRewrite, SymbolicSizesFromSizeOneAndFactoriesAreRecomputedAtRunTime) {
  const mesh::PlacementTuple s0 = {mesh::Placement::shard(0)};
  // A Hugging Face attention mask: mask[1, 1, T, T].expand(B, -1, T, T), batch-sharded on [2].
  RankPieces rp;
  rp.inputs = {{piece({1, 1, 4, 4}, {{0, 1}, {0, 1}, {0, 4}, {0, 4}})}, {}};
  rp.outputs = {{symbolicPiece({8, 1, 4, 4}, {{4, 4}, {0, 1}, {0, 4}, {0, 4}}, 1, s0)}};
  auto e = localizeNode(opNamed("aten::expand"),
                        {std::nullopt, ir::Constant(std::vector<int64_t>{8, -1, 4, 4})}, rp);
  ASSERT_TRUE(e.ok()) << e.error().message();
  ASSERT_EQ(e->symbolic.size(), 1u);
  const SymbolicSize& s = e->symbolic[0];
  EXPECT_EQ(s.input, 1u);
  EXPECT_EQ(s.element, 0);
  EXPECT_EQ(s.symbol, "B");
  EXPECT_EQ(s.part, SymbolicSize::Part::kSize);
  EXPECT_EQ(s.dim, 0u);
  EXPECT_EQ(s.rank, 4u);
  EXPECT_EQ(s.placement, s0);
  // The constant holds the local sizes at the hint; the runtime replaces element 0.
  EXPECT_EQ(std::get<std::vector<int64_t>>(e->replace.at(0).second),
            (std::vector<int64_t>{4, 1, 4, 4}));

  // zeros(B*2, 16) (a flattened batch, per_symbol 2), replicated: the whole dim follows 2 x B.
  RankPieces z;
  z.inputs = {{}, {}, {}, {}, {}};
  z.outputs = {{symbolicPiece({16, 16}, {{0, 16}, {0, 16}}, 2, {mesh::Placement::replicate()})}};
  auto f = localizeNode(opNamed("aten::zeros"),
                        {ir::Constant(std::vector<int64_t>{16, 16}), std::nullopt, std::nullopt,
                         std::nullopt, std::nullopt},
                        z);
  ASSERT_TRUE(f.ok()) << f.error().message();
  ASSERT_EQ(f->symbolic.size(), 1u);
  EXPECT_EQ(f->symbolic[0].input, 0u);
  EXPECT_EQ(f->symbolic[0].per_symbol, 2);

  // A dim that is not proportional to its symbol (B+1) keeps its hint: nothing to recompute.
  z.outputs = {{symbolicPiece({9, 16}, {{0, 9}, {0, 16}}, 0, {mesh::Placement::replicate()})}};
  auto g = localizeNode(opNamed("aten::zeros"),
                        {ir::Constant(std::vector<int64_t>{9, 16}), std::nullopt, std::nullopt,
                         std::nullopt, std::nullopt},
                        z);
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(g->symbolic.empty());
}

TEST(LocalRewrite, RepeatOfASizeOneDimToASymbolicOneFollowsTheSymbol) {
  // state0[1, 32].repeat(B, 1): the count of dim 0 is B at run time; dim 1 keeps its constant.
  RankPieces rp;
  rp.inputs = {{piece({1, 32}, {{0, 1}, {0, 32}})}, {}};
  rp.outputs = {{symbolicPiece({8, 32}, {{0, 8}, {0, 32}}, 1, {mesh::Placement::replicate()})}};
  auto r = localizeNode(opNamed("aten::repeat"),
                        {std::nullopt, ir::Constant(std::vector<int64_t>{8, 1})}, rp);
  ASSERT_TRUE(r.ok()) << r.error().message();
  ASSERT_EQ(r->symbolic.size(), 1u);
  EXPECT_EQ(r->symbolic[0].input, 1u);
  EXPECT_EQ(r->symbolic[0].element, 0);
  EXPECT_EQ(r->symbolic[0].part, SymbolicSize::Part::kSize);
  // x[B, 4].repeat(1, 2): the symbolic dim is the input's own, repeated once: nothing to do.
  TensorPiece in = symbolicPiece({8, 4}, {{0, 8}, {0, 4}}, 1, {mesh::Placement::replicate()});
  rp.inputs = {{in}, {}};
  rp.outputs = {{symbolicPiece({8, 8}, {{0, 8}, {0, 8}}, 1, {mesh::Placement::replicate()})}};
  auto k = localizeNode(opNamed("aten::repeat"),
                        {std::nullopt, ir::Constant(std::vector<int64_t>{1, 2})}, rp);
  ASSERT_TRUE(k.ok());
  EXPECT_TRUE(k->symbolic.empty());
}

TEST(LocalRewrite, ArangeOverASymbolicDimFollowsItsSymbol) {
  // arange(B), whole: its end is B at run time.
  RankPieces rp;
  rp.inputs = {{}, {}, {}, {}, {}};
  rp.outputs = {{symbolicPiece({8}, {{0, 8}}, 1, {mesh::Placement::replicate()})}};
  auto w = localizeNode(
      opNamed("aten::arange"),
      {ir::Constant(int64_t{8}), std::nullopt, std::nullopt, std::nullopt, std::nullopt}, rp);
  ASSERT_TRUE(w.ok()) << w.error().message();
  ASSERT_EQ(w->symbolic.size(), 1u);
  EXPECT_EQ(w->symbolic[0].input, 0u);
  EXPECT_EQ(w->symbolic[0].element, -1);
  EXPECT_EQ(w->symbolic[0].part, SymbolicSize::Part::kEnd);
  EXPECT_FALSE(w->overload.has_value());
  // arange.start_step(3, B, 2)... cut on [2]: both bounds of the piece follow B:
  // start' = 3 + 2 x offset, end' = 3 + 2 x (offset + size).
  rp.outputs = {{symbolicPiece({8}, {{4, 4}}, 1, {mesh::Placement::shard(0)})}};
  auto c = localizeNode(
      opNamed("aten::arange"),
      {ir::Constant(int64_t{8}), std::nullopt, std::nullopt, std::nullopt, std::nullopt}, rp);
  ASSERT_TRUE(c.ok()) << c.error().message();
  EXPECT_EQ(c->overload, "start");  // arange(end) -> arange.start(start', end')
  ASSERT_EQ(c->symbolic.size(), 2u);
  EXPECT_EQ(c->symbolic[0].input, 0u);
  EXPECT_EQ(c->symbolic[0].part, SymbolicSize::Part::kOffset);
  EXPECT_EQ(c->symbolic[1].input, 1u);
  EXPECT_EQ(c->symbolic[1].part, SymbolicSize::Part::kEnd);
  auto st =
      localizeNode(opNamed("aten::arange", "start_step"),
                   {ir::Constant(int64_t{3}), ir::Constant(int64_t{19}), ir::Constant(int64_t{2}),
                    std::nullopt, std::nullopt, std::nullopt, std::nullopt},
                   rp);
  ASSERT_TRUE(st.ok()) << st.error().message();
  ASSERT_EQ(st->symbolic.size(), 2u);
  EXPECT_EQ(st->symbolic[0].scale, 2);
  EXPECT_EQ(st->symbolic[0].shift, 3);
  EXPECT_EQ(st->symbolic[1].scale, 2);
  EXPECT_EQ(st->symbolic[1].shift, 3);
}

TEST(LocalRewrite, ArangeBoundsAndOverload) {
  RankPieces rp;
  rp.inputs = {{}, {}, {}, {}, {}};
  rp.outputs = {{piece({10}, {{6, 3}})}};  // ranks of 4 with chunk 3: piece 2 = [6, 9)
  auto r = localizeNode(
      opNamed("aten::arange"),
      {ir::Constant(int64_t{10}), std::nullopt, std::nullopt, std::nullopt, std::nullopt}, rp);
  ASSERT_TRUE(r.ok()) << r.error().message();
  ASSERT_TRUE(r->overload && r->prepend);
  EXPECT_EQ(*r->overload, "start");
  EXPECT_EQ(std::get<int64_t>(*r->prepend), 6);
  EXPECT_EQ(std::get<int64_t>(r->replace.at(0).second), 9);

  auto s = localizeNode(
      opNamed("aten::arange", "start_step"),
      {ir::Constant(int64_t{1}), ir::Constant(int64_t{21}), ir::Constant(int64_t{2}), std::nullopt},
      rp);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(std::get<int64_t>(s->replace.at(0).second), 13);  // 1 + 6*2
  EXPECT_EQ(std::get<int64_t>(s->replace.at(1).second), 19);  // + 3*2
}

TEST(LocalRewrite, VocabParallelEmbedding) {
  RankPieces rp;
  rp.inputs = {{piece({50257, 48}, {{25129, 25128}, {0, 48}})}, {piece({8}, {{0, 8}})}, {}};
  rp.outputs = {{piece({8, 48}, {{0, 8}, {0, 48}})}};
  auto r = localizeNode(opNamed("aten::embedding"),
                        {std::nullopt, std::nullopt, ir::Constant(int64_t{30000})}, rp);
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(std::get<int64_t>(r->replace.at(0).second), 30000 - 25129);
  // The masked lookup of rows [25129, 25129 + 25128) as the node's local graph: one input per
  // node input, one output, plain ATen ops (no all-reduce), the rank's offset and row count as
  // constants.
  ASSERT_TRUE(r->local);
  const ir::Graph& local = *r->local;
  EXPECT_TRUE(ir::checkLocalGraph(local, 3, 1).ok());
  std::vector<std::string> ops;
  std::vector<int64_t> ints;
  for (const ir::Node& n : local.nodes()) {
    if (n.kind != ir::NodeKind::kOp) continue;
    ops.push_back(n.qualifiedOp());
    for (ir::ValueId v : n.inputs) {
      const ir::Value& val = local.value(v);
      if (!val.producer.valid() && val.constant && std::holds_alternative<int64_t>(*val.constant))
        ints.push_back(std::get<int64_t>(*val.constant));
    }
  }
  EXPECT_EQ(ops, (std::vector<std::string>{"aten::sub.Scalar", "aten::lt.Scalar", "aten::ge.Scalar",
                                           "aten::logical_or", "aten::masked_fill.Scalar",
                                           "aten::embedding", "aten::unsqueeze",
                                           "aten::masked_fill.Scalar"}));
  EXPECT_NE(std::find(ints.begin(), ints.end(), 25129), ints.end());
  EXPECT_NE(std::find(ints.begin(), ints.end(), 25128), ints.end());
  // An uncut table: the op as itself.
  RankPieces whole = rp;
  whole.inputs[0] = {piece({50257, 48}, {{0, 50257}, {0, 48}})};
  auto w = localizeNode(opNamed("aten::embedding"),
                        {std::nullopt, std::nullopt, ir::Constant(int64_t{30000})}, whole);
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(w->empty());
  auto q = localizeNode(opNamed("aten::embedding"),
                        {std::nullopt, std::nullopt, ir::Constant(int64_t{3})}, rp);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(std::get<int64_t>(q->replace.at(0).second), -1);
}

TEST(LocalRewrite, NarrowOverAWholeCutDim) {
  RankPieces rp;
  rp.inputs = {{piece({10, 4}, {{3, 3}, {0, 4}})}, {}, {}, {}};
  rp.outputs = {{piece({10, 4}, {{3, 3}, {0, 4}})}};
  auto r = localizeNode(
      opNamed("aten::narrow"),
      {std::nullopt, ir::Constant(int64_t{0}), ir::Constant(int64_t{0}), ir::Constant(int64_t{10})},
      rp);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(std::get<int64_t>(r->replace.at(0).second), 3);
}

struct MeshCase {
  std::vector<int64_t> shape;
};

class LowerToy : public ::testing::TestWithParam<std::vector<int64_t>> {};

TEST_P(LowerToy, ProgramsAreWellFormed) {
  ir::Graph g = toyBlock(8);
  spec::Spec spec = specFor(GetParam(), {});
  auto planned = planOf(g, spec);
  auto programs = lowerPlan(g, planned.result.plan);
  ASSERT_TRUE(programs.ok()) << programs.error().message();
  testing::checkPrograms(g, planned.result.plan, *programs);
}

TEST_P(LowerToy, SizeArithmeticIsDroppedAndViewRewritten) {
  ir::Graph g = withSizeArithmetic();
  spec::Spec spec = specFor(GetParam(), {});
  spec.inputs["x"] = mesh::PlacementTuple(GetParam().size(), mesh::Placement::replicate());
  spec.inputs["x"][GetParam().size() - 1] = mesh::Placement::shard(0);
  auto planned = planOf(g, spec);
  auto programs = lowerPlan(g, planned.result.plan);
  ASSERT_TRUE(programs.ok()) << programs.error().message();
  testing::checkPrograms(g, planned.result.plan, *programs);
  for (const proto::Program& p : *programs)
    for (const proto::Node& n : p.graph().nodes()) {
      EXPECT_NE(n.op(), "aten::size");
      EXPECT_NE(n.op(), "prim::ListConstruct");
    }
}

INSTANTIATE_TEST_SUITE_P(Meshes, LowerToy,
                         ::testing::Values(std::vector<int64_t>{4}, std::vector<int64_t>{2, 2},
                                           std::vector<int64_t>{2, 4}));

TEST(Lower, PartialOutputIsReducedAtTheEnd) {
  // Pin the second linear to a contraction over the sharded hidden dim: its output is Partial and
  // the free output must be all-reduced by a final redistribute node.
  ir::Graph g = toyBlock(8);
  spec::Spec spec = specFor({4}, {"tp"});
  spec.inputs["x"] = {mesh::Placement::replicate()};
  spec.pins.push_back({spec::Pin::Target::kNode, "up.weight", {mesh::Placement::shard(0)}});
  spec.pins.push_back({spec::Pin::Target::kNode, "down.weight", {mesh::Placement::shard(1)}});
  auto planned = planOf(g, spec);
  const plan::Plan& p = planned.result.plan;
  bool partial = false;
  for (const plan::PlanNode& n : p.nodes)
    if (n.op == "aten::linear" &&
        n.outputPlacements() == mesh::PlacementTuple{mesh::Placement::partial()})
      partial = true;
  ASSERT_TRUE(partial) << "the pinned plan should end in a Partial linear";
  auto programs = lowerPlan(g, p);
  ASSERT_TRUE(programs.ok()) << programs.error().message();
  testing::checkPrograms(g, p, *programs);
  const proto::Program& prog = (*programs)[1];
  ASSERT_EQ(prog.outputs_size(), 1);
  EXPECT_EQ(prog.outputs(0).placement(0).kind(), proto::Placement::REPLICATE);
  const proto::Node& last = prog.graph().nodes(prog.graph().nodes_size() - 1);
  ASSERT_EQ(last.kind(), "redistribute");
  const proto::Redistribution& r = prog.redistributions(
      static_cast<int>(prog.node_redistribution(prog.graph().nodes_size() - 1) - 1));
  ASSERT_EQ(r.forward_size(), 1);
  EXPECT_EQ(r.forward(0).kind(), proto::ALL_REDUCE);
  EXPECT_EQ(r.forward(0).reduce_op(), proto::REDUCE_SUM);
  EXPECT_EQ(r.backward_size(), 0);  // the Replicate gradient goes to every summand
}

// FSDP-like placements (parameters and activations sharded on the batch's mesh dim): every
// parameter edge whose forward communicates is marked for a re-gather in backward (the runtime's
// reshard after forward, priced so by the planner); no other edge is.
/// The toy block on [4] with its input and both modules batch-sharded and both weights placed
/// `weight` (FSDP-like: S(0); DDP-like: R), lowered and checked.
std::vector<proto::Program> toyBlockPrograms(mesh::Placement weight) {
  ir::Graph g = toyBlock(8);
  spec::Spec spec = specFor({4}, {});
  if (weight.isReplicate()) spec.memory_budget.high = 1.0;  // replicated parameters
  spec.inputs["x"] = {mesh::Placement::shard(0)};
  for (const char* w : {"up.weight", "down.weight"})
    spec.pins.push_back({spec::Pin::Target::kNode, w, {weight}});
  for (const char* m : {"up", "down"})
    spec.pins.push_back({spec::Pin::Target::kModule, m, {mesh::Placement::shard(0)}});
  auto planned = planOf(g, spec);
  auto programs = lowerPlan(g, planned.result.plan);
  EXPECT_TRUE(programs.ok()) << programs.error().message();
  if (!programs.ok()) return {};
  testing::checkPrograms(g, planned.result.plan, *programs);
  return *programs;
}

TEST(Lower, GatheredParametersAreMarkedForRegather) {
  const std::vector<proto::Program> programs = toyBlockPrograms(mesh::Placement::shard(0));
  ASSERT_FALSE(programs.empty());
  int marked = 0;
  for (const proto::Program& p : programs) {
    std::set<uint32_t> params;
    for (const proto::ProgramTensor& t : p.parameters()) params.insert(t.value());
    for (int i = 0; i < p.graph().nodes_size(); ++i) {
      const proto::Node& n = p.graph().nodes(i);
      if (n.kind() != "redistribute") continue;
      const proto::Redistribution& r =
          p.redistributions(static_cast<int>(p.node_redistribution(i) - 1));
      bool communicates = false;
      for (const proto::RedistStep& s : r.forward()) communicates |= s.kind() != proto::LOCAL_SLICE;
      EXPECT_EQ(r.regather(), params.count(n.inputs(0)) > 0 && r.requires_grad() && communicates)
          << r.edge();
      marked += r.regather() ? 1 : 0;
    }
  }
  EXPECT_GE(marked, 2 * 4) << "up.weight and down.weight are gathered on every rank";
}

// Activation checkpointing: each checkpointed module becomes one segment of the rank's program,
// the contiguous nodes of that module, the parameter gathers lowering inserted for its ops
// included; segments are disjoint and in order. A plan checkpointing a module the program cannot
// recompute is refused.
TEST(Lower, CheckpointedModulesBecomeProgramSegments) {
  const ir::Graph g = ir::testing_graphs::blockStack(3);
  spec::Spec spec = specFor({2}, {"dp"});
  spec.inputs["x"] = {mesh::Placement::shard(0)};
  spec.memory_budget.high = 0.5;  // the parameters sharded: gathered inside the blocks
  auto planned = planOf(g, spec);
  plan::Plan p = planned.result.plan;
  p.checkpoint = {"blocks.0", "blocks.2"};
  auto programs = lowerPlan(g, p);
  ASSERT_TRUE(programs.ok()) << programs.error().message();
  for (const proto::Program& prog : *programs) {
    ASSERT_EQ(prog.checkpoints_size(), 2);
    uint32_t previous_last = 0;
    for (int k = 0; k < prog.checkpoints_size(); ++k) {
      const proto::CheckpointSegment& cs = prog.checkpoints(k);
      EXPECT_EQ(cs.module(), p.checkpoint[static_cast<size_t>(k)]);
      ASSERT_LE(cs.first(), cs.last());
      ASSERT_LT(cs.last(), static_cast<uint32_t>(prog.graph().nodes_size()));
      if (k > 0) {
        EXPECT_GT(cs.first(), previous_last);
      }
      previous_last = cs.last();
      int gathers = 0;
      for (int i = 0; i < prog.graph().nodes_size(); ++i) {
        const proto::Node& n = prog.graph().nodes(i);
        const bool inside =
            static_cast<uint32_t>(i) >= cs.first() && static_cast<uint32_t>(i) <= cs.last();
        const bool of_module = ir::inModule(n.module_path(), cs.module());
        if (inside) {
          EXPECT_TRUE(of_module) << cs.module() << ": node " << i << " " << n.op();
          gathers += n.kind() == "redistribute" ? 1 : 0;
        } else if (n.kind() == "op" || n.kind() == "redistribute") {
          EXPECT_FALSE(of_module) << cs.module() << ": node " << i << " outside the segment";
        }
      }
      EXPECT_GE(gathers, 2) << cs.module() << ": its two weights are gathered inside it";
    }
  }
  plan::Plan bad = planned.result.plan;
  bad.checkpoint = {"blocks"};           // valid as a module, but...
  bad.checkpoint.push_back("blocks.1");  // ...overlapping one inside it
  auto refused = lowerPlan(g, bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message().find("overlap"), std::string::npos)
      << refused.error().message();
}

// DDP-like placements (parameters replicated, the batch sharded): every parameter edge that reads
// the parameter where it lies and reduces its gradient with all-reduces (one per mesh dim the
// batch is sharded on) is marked for the runtime's gradient buckets, and deferredGradParameters
// names its parameter; no other edge is.
TEST(Lower, ReplicatedParametersGradientsAreMarkedForBuckets) {
  const std::vector<proto::Program> programs = toyBlockPrograms(mesh::Placement::replicate());
  ASSERT_FALSE(programs.empty());
  int marked = 0;
  for (const proto::Program& p : programs) {
    std::map<uint32_t, int> params;
    for (int i = 0; i < p.parameters_size(); ++i) params[p.parameters(i).value()] = i;
    const std::vector<int> deferred = artifact::deferredGradParameters(p);
    for (int i = 0; i < p.graph().nodes_size(); ++i) {
      const proto::Node& n = p.graph().nodes(i);
      if (n.kind() != "redistribute") continue;
      const uint32_t ri = p.node_redistribution(i) - 1;
      const proto::Redistribution& r = p.redistributions(static_cast<int>(ri));
      // One all-reduce, or one on each of several mesh dims (a bucket runs one per mesh dim).
      bool all_reduces = r.backward_size() >= 1;
      for (const proto::RedistStep& s : r.backward())
        all_reduces = all_reduces && s.kind() == proto::ALL_REDUCE;
      const bool shape = params.count(n.inputs(0)) > 0 && r.requires_grad() &&
                         r.forward_size() == 0 && all_reduces;
      EXPECT_EQ(r.bucketed_gradient(), shape) << r.edge();
      EXPECT_EQ(deferred.at(ri), shape ? params.at(n.inputs(0)) : -1) << r.edge();
      marked += r.bucketed_gradient() ? 1 : 0;
    }
  }
  EXPECT_GE(marked, 2 * 4) << "up.weight and down.weight are all-reduced on every rank";
}

// A position embedding: a parameter looked up by a constant index buffer, replicated, added to a
// batch-sharded activation (GPT-2's wpe, Swin's relative position bias table). Its gradient is
// partial at the add; lowering keeps it partial through the lookup and all-reduces it at the
// parameter, in the gradient bucket with the others (as torch's DDP does), instead of one blocking
// all-reduce of the activation's gradient where the add reads it. LowerOptions::partial_gradients
// off gives the latter; the prediction takes off what the bucket saves.
TEST(Lower, ReplicatedComputationKeepsItsGradientPartialToItsParameters) {
  ir::Graph g;
  g.name = "position_embedding";
  ir::ValueId x = tensorValue(g, "x", {8, 16, 64});
  leafNode(g, ir::NodeKind::kInput, "x", x);
  ir::ValueId wpe = tensorValue(g, "wpe.weight", {16, 64}, ir::DType::kF32, true);
  leafNode(g, ir::NodeKind::kParameter, "wpe.weight", wpe);
  ir::ValueId ids = tensorValue(g, "position_ids", {16}, ir::DType::kI64);
  leafNode(g, ir::NodeKind::kBuffer, "position_ids", ids);
  ir::ValueId w = tensorValue(g, "proj.weight", {64, 64}, ir::DType::kF32, true);
  leafNode(g, ir::NodeKind::kParameter, "proj.weight", w);
  ir::ValueId pad = g.addConstant(ir::ValueType::kInt, int64_t{-1});
  ir::ValueId no = g.addConstant(ir::ValueType::kBool, false);
  ir::ValueId one = g.addConstant(ir::ValueType::kInt, int64_t{1});
  ir::ValueId none = g.addConstant(ir::ValueType::kNone, ir::None{});
  ir::ValueId pe = tensorValue(g, "pe", {16, 64}, ir::DType::kF32, true);
  opNode(g, "aten::embedding", "", {wpe, ids, pad, no, no}, {pe}, "wpe");
  ir::ValueId h = tensorValue(g, "h", {8, 16, 64}, ir::DType::kF32, true);
  opNode(g, "aten::add", "Tensor", {x, pe, one}, {h}, "add");
  ir::ValueId y = tensorValue(g, "y", {8, 16, 64}, ir::DType::kF32, true);
  opNode(g, "aten::linear", "", {h, w, none}, {y}, "proj");
  g.setOutputs(ir::OutputTree::makeLeaf(y));

  spec::Spec spec = specFor({4}, {});
  spec.memory_budget.high = 1.0;  // replicated parameters
  spec.inputs["x"] = {mesh::Placement::shard(0)};
  spec.pins.push_back({spec::Pin::Target::kModule, "wpe", {mesh::Placement::replicate()}});
  for (const char* m : {"add", "proj"})
    spec.pins.push_back({spec::Pin::Target::kModule, m, {mesh::Placement::shard(0)}});
  auto planned = planOf(g, spec);
  auto kept = lowerPlan(g, planned.result.plan);
  ASSERT_TRUE(kept.ok()) << kept.error().message();
  testing::checkPrograms(g, planned.result.plan, *kept);
  LowerOptions off;
  off.partial_gradients = false;
  auto reduced = lowerPlan(g, planned.result.plan, off);
  ASSERT_TRUE(reduced.ok()) << reduced.error().message();
  testing::checkPrograms(g, planned.result.plan, *reduced);

  // Per program: the edges whose gradient is all-reduced on its own, and the parameters whose
  // gradients go to the buckets.
  auto survey = [](const proto::Program& p, std::vector<std::string>& own,
                   std::set<std::string>& bucketed) {
    const std::vector<int> deferred = artifact::deferredGradParameters(p);
    for (int r = 0; r < p.redistributions_size(); ++r) {
      const proto::Redistribution& red = p.redistributions(r);
      if (deferred.at(static_cast<size_t>(r)) >= 0) {
        bucketed.insert(p.parameters(deferred[static_cast<size_t>(r)]).name());
        continue;
      }
      for (const proto::RedistStep& st : red.backward())
        if (st.kind() == proto::ALL_REDUCE) own.push_back(red.edge());
    }
  };
  ASSERT_EQ(kept->size(), 4u);
  for (size_t rank = 0; rank < kept->size(); ++rank) {
    std::vector<std::string> own_kept, own_reduced;
    std::set<std::string> bucketed_kept, bucketed_reduced;
    survey((*kept)[rank], own_kept, bucketed_kept);
    survey((*reduced)[rank], own_reduced, bucketed_reduced);
    EXPECT_TRUE(own_kept.empty()) << "rank " << rank << ": " << own_kept.front();
    EXPECT_EQ(bucketed_kept, (std::set<std::string>{"proj.weight", "wpe.weight"}))
        << "rank " << rank;
    ASSERT_EQ(own_reduced.size(), 1u) << "rank " << rank;
    EXPECT_NE(own_reduced[0].find("%pe"), std::string::npos) << own_reduced[0];
    EXPECT_EQ(bucketed_reduced, (std::set<std::string>{"proj.weight"})) << "rank " << rank;
    EXPECT_LT((*kept)[rank].prediction().step_us(), (*reduced)[rank].prediction().step_us());
    EXPECT_LT((*kept)[rank].prediction().backward_comm_us(),
              (*reduced)[rank].prediction().backward_comm_us());
  }
}

// Three readers of one value that need it the same way share one redistribution, and the
// prediction prices what the program runs: q, k and v's column-parallel projections read the
// replicated h, and their input gradients (partial) are summed before ONE all-reduce, where the
// plan priced an all-reduce per reader.
TEST(Lower, ThePredictionPricesTheRedistributionsTheProgramRuns) {
  ir::Graph g;
  g.name = "shared_reader";
  ir::ValueId x = tensorValue(g, "x", {8, 64});
  leafNode(g, ir::NodeKind::kInput, "x", x);
  ir::ValueId none = g.addConstant(ir::ValueType::kNone, ir::None{});
  ir::ValueId one = g.addConstant(ir::ValueType::kInt, int64_t{1});
  auto param = [&](const std::string& name) {
    ir::ValueId w = tensorValue(g, name, {64, 64}, ir::DType::kF32, true);
    leafNode(g, ir::NodeKind::kParameter, name, w);
    return w;
  };
  auto linear = [&](ir::ValueId in, ir::ValueId w, const std::string& module) {
    ir::ValueId y = tensorValue(g, module + ".out", {8, 64}, ir::DType::kF32, true);
    opNode(g, "aten::linear", "", {in, w, none}, {y}, module);
    return y;
  };
  ir::ValueId h = linear(x, param("w0"), "h");
  ir::ValueId q = linear(h, param("wq"), "q");
  ir::ValueId k = linear(h, param("wk"), "k");
  ir::ValueId v = linear(h, param("wv"), "v");
  ir::ValueId qk = tensorValue(g, "qk", {8, 64}, ir::DType::kF32, true);
  opNode(g, "aten::add", "Tensor", {q, k, one}, {qk}, "qk");
  ir::ValueId out = tensorValue(g, "out", {8, 64}, ir::DType::kF32, true);
  opNode(g, "aten::add", "Tensor", {qk, v, one}, {out}, "out");
  g.setOutputs(ir::OutputTree::makeLeaf(out));

  spec::Spec spec = specFor({2}, {});
  spec.memory_budget.high = 1.0;
  spec.pins.push_back({spec::Pin::Target::kModule, "h", {mesh::Placement::replicate()}});
  for (const char* m : {"q", "k", "v", "qk", "out"})
    spec.pins.push_back({spec::Pin::Target::kModule, m, {mesh::Placement::shard(1)}});
  auto planned = planOf(g, spec);
  LowerOptions o;
  o.partial_gradients = false;  // h's gradient reduced where h is read, as the plan priced it
  auto programs = lowerPlan(g, planned.result.plan, o);
  ASSERT_TRUE(programs.ok()) << programs.error().message();
  testing::checkPrograms(g, planned.result.plan, *programs);
  auto model = cost::costModelFor(planned.result.plan.spec);
  ASSERT_TRUE(model.ok());
  const double all_reduce = model->collectiveUs(cost::CollectiveKind::kAllReduce, 0, 2, 8 * 64 * 4);
  for (const proto::Program& prog : *programs) {
    int h_reductions = 0;
    double priced = 0;
    for (const proto::Redistribution& r : prog.redistributions()) {
      priced += r.priced_forward_us() + r.priced_backward_us();
      if (r.edge().rfind("%h.out ->", 0) == 0)
        for (const proto::RedistStep& st : r.backward())
          h_reductions += st.kind() == proto::ALL_REDUCE;
    }
    EXPECT_EQ(h_reductions, 1);
    const proto::Prediction& pr = prog.prediction();
    EXPECT_NEAR(pr.comm_us(), priced, 1e-9 * (1 + priced));
    EXPECT_NEAR(pr.comm_us(), pr.forward_comm_us() + pr.backward_comm_us(), 1e-9 * (1 + priced));
    // The plan priced h's gradient all-reduce once per reader: two more.
    EXPECT_NEAR(planned.result.plan.totals.comm_us - pr.comm_us(), 2 * all_reduce,
                1e-6 * all_reduce);
    EXPECT_NEAR(pr.step_us(), planned.result.plan.totals.total_us - 2 * all_reduce,
                1e-6 * pr.step_us());
  }
}

// The program names its nodes that draw random numbers (a trainer comparing a sharded run with an
// unsharded one says why they differ): a training dropout, not one with p = 0.
TEST(Lower, ProgramsListTheirRandomNodes) {
  ir::Graph g;
  g.name = "dropouts";
  ir::ValueId x = tensorValue(g, "x", {8, 16});
  leafNode(g, ir::NodeKind::kInput, "x", x);
  ir::ValueId yes = g.addConstant(ir::ValueType::kBool, true);
  ir::ValueId a = tensorValue(g, "a", {8, 16});
  opNode(g, "aten::dropout", "", {x, g.addConstant(ir::ValueType::kFloat, 0.0), yes}, {a}, "off");
  ir::ValueId b = tensorValue(g, "b", {8, 16});
  opNode(g, "aten::dropout", "", {a, g.addConstant(ir::ValueType::kFloat, 0.1), yes}, {b}, "on");
  g.setOutputs(ir::OutputTree::makeLeaf(b));
  auto planned = planOf(g, specFor({2}, {}));
  auto programs = lowerPlan(g, planned.result.plan);
  ASSERT_TRUE(programs.ok()) << programs.error().message();
  for (const proto::Program& p : *programs) {
    ASSERT_EQ(p.random_nodes_size(), 1) << "rank " << p.rank();
    const int node = static_cast<int>(p.random_nodes(0));
    ASSERT_LT(node, p.graph().nodes_size());
    EXPECT_EQ(p.graph().nodes(node).op(), "aten::dropout");
    EXPECT_EQ(p.graph().nodes(node).module_path(), "on");
  }
}

// Each random node's piece (the runtime seeds its draw from it): the rank's coordinate on the mesh
// dims where the node's output is sharded, 0 on the others. On 2x2 with x cut S(0) on dim 0: the
// batch dropout's pieces follow the dim-0 coordinate (ranks 0,1 and 2,3 share theirs); a weight's
// dropout has the pieces of the placement the plan gave it.
TEST(Lower, RandomNodesRecordTheRanksPieceOfTheirOutput) {
  ir::Graph g;
  g.name = "random_pieces";
  ir::ValueId x = tensorValue(g, "x", {8, 16});
  leafNode(g, ir::NodeKind::kInput, "x", x);
  ir::ValueId w = tensorValue(g, "w", {16, 16});
  leafNode(g, ir::NodeKind::kParameter, "w", w);
  ir::ValueId yes = g.addConstant(ir::ValueType::kBool, true);
  ir::ValueId half = g.addConstant(ir::ValueType::kFloat, 0.5);
  ir::ValueId a = tensorValue(g, "a", {8, 16});
  opNode(g, "aten::dropout", "", {x, half, yes}, {a}, "batch");
  ir::ValueId m = tensorValue(g, "m", {16, 16});
  opNode(g, "aten::dropout", "", {w, half, yes}, {m}, "weight");
  ir::ValueId y = tensorValue(g, "y", {8, 16});
  opNode(g, "aten::mm", "", {a, m}, {y}, "");
  g.setOutputs(ir::OutputTree::makeLeaf(y));
  spec::Spec spec = specFor({2, 2}, {});
  const mesh::PlacementTuple rows = {mesh::Placement::shard(0), mesh::Placement::replicate()};
  spec.inputs["x"] = rows;
  spec.outputs = spec::OutputPlacementTree::makeLeaf(rows);
  auto planned = planOf(g, spec);
  // The placements the pieces follow, as the plan chose them.
  std::map<std::string, mesh::PlacementTuple> placed;
  for (const auto& pn : planned.result.plan.nodes)
    if (pn.op == "aten::dropout") placed[pn.module_path] = *pn.outputs.at(0);
  ASSERT_EQ(placed.size(), 2u);
  ASSERT_EQ(placed["batch"], rows);
  auto programs = lowerPlan(g, planned.result.plan);
  ASSERT_TRUE(programs.ok()) << programs.error().message();
  ASSERT_EQ(programs->size(), 4u);
  for (const proto::Program& p : *programs) {
    ASSERT_EQ(p.random_nodes_size(), 2) << "rank " << p.rank();
    ASSERT_EQ(p.random_pieces_size(), 2) << "rank " << p.rank();
    for (int k = 0; k < 2; ++k) {
      const std::string module = p.graph().nodes(static_cast<int>(p.random_nodes(k))).module_path();
      // Row-major over the 2x2 mesh, a replicated dim counting 0: the batch dropout's piece is
      // 2 x its dim-0 coordinate.
      uint64_t want = 0;
      for (int d = 0; d < 2; ++d)
        want = want * 2 + (placed[module][static_cast<size_t>(d)].isShard()
                               ? static_cast<uint64_t>(p.coordinate(d))
                               : 0);
      if (module == "batch") {
        EXPECT_EQ(want, static_cast<uint64_t>(p.coordinate(0)) * 2);
      }
      EXPECT_EQ(p.random_pieces(k), want) << "rank " << p.rank() << ", " << module;
    }
  }
}

// A mesh dim of one rank moves nothing: on [1] the program has no redistribution at all (each
// would run a node, a dispatch forward and backward, for nothing), and [1,4] has the
// redistributions of [4], the same steps.
TEST(Lower, MeshDimsOfOneRankRunNoRedistribution) {
  ir::Graph g = toyBlock(8);
  auto lowered = [&](std::vector<int64_t> shape) {
    spec::Spec spec = specFor(shape, {});
    spec.inputs["x"] = std::vector<mesh::Placement>(shape.size(), mesh::Placement::shard(0));
    auto planned = planOf(g, spec);
    auto programs = lowerPlan(g, planned.result.plan);
    EXPECT_TRUE(programs.ok()) << programs.error().message();
    if (!programs.ok()) return std::vector<proto::Program>{};
    testing::checkPrograms(g, planned.result.plan, *programs);
    return *programs;
  };
  const std::vector<proto::Program> one = lowered({1});
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].redistributions_size(), 0);
  const std::vector<proto::Program> four = lowered({4}), one_four = lowered({1, 4});
  ASSERT_EQ(four.size(), 4u);
  ASSERT_EQ(one_four.size(), 4u);
  auto steps = [](const proto::Program& p) {
    std::vector<std::pair<int, int>> out;  // (kind, mesh dim of the step on [1,4] less one)
    for (const proto::Redistribution& r : p.redistributions())
      for (const auto* list : {&r.forward(), &r.backward()})
        for (const proto::RedistStep& s : *list) out.emplace_back(s.kind(), s.mesh_dim());
    return out;
  };
  EXPECT_GT(four[0].redistributions_size(), 0);
  for (size_t r = 0; r < 4; ++r) {
    EXPECT_EQ(one_four[r].redistributions_size(), four[r].redistributions_size()) << "rank " << r;
    std::vector<std::pair<int, int>> a = steps(four[r]), b = steps(one_four[r]);
    for (auto& [kind, dim] : b) dim -= 1;
    EXPECT_EQ(a, b) << "rank " << r;
  }
}

TEST(Lower, MixedPrecisionCastsParametersBeforeTheirCollectives) {
  ir::Graph g = toyBlock(8);
  spec::Spec spec = specFor({2, 2}, {});
  spec.mixed_precision.param_dtype = ir::DType::kBF16;
  spec.mixed_precision.reduce_dtype = ir::DType::kF32;
  auto planned = planOf(g, spec);
  auto programs = lowerPlan(g, planned.result.plan);
  ASSERT_TRUE(programs.ok()) << programs.error().message();
  testing::checkPrograms(g, planned.result.plan, *programs);
  for (const proto::Program& p : *programs) {
    EXPECT_EQ(p.mixed_precision().param_dtype(), "bf16");
    EXPECT_EQ(p.mixed_precision().reduce_dtype(), "f32");
    const proto::Graph& pg = p.graph();
    for (const proto::ProgramTensor& t : p.parameters()) {
      EXPECT_EQ(t.dtype(), "bf16") << t.name();
      EXPECT_EQ(t.storage_dtype(), "f32") << t.name();
      EXPECT_EQ(pg.values(static_cast<int>(t.value())).tensor().dtype(), "f32");
      // The only user of the stored shard is its cast.
      int users = 0;
      for (const proto::Node& n : pg.nodes())
        for (uint32_t in : n.inputs())
          if (in == t.value()) {
            ++users;
            EXPECT_EQ(n.op(), "aten::to") << t.name();
            EXPECT_EQ(pg.values(static_cast<int>(n.outputs(0))).tensor().dtype(), "bf16");
          }
      EXPECT_EQ(users, 1) << t.name();
    }
    for (int i = 0; i < pg.nodes_size(); ++i) {
      if (pg.nodes(i).kind() == "redistribute") {
        EXPECT_EQ(pg.values(static_cast<int>(pg.nodes(i).inputs(0))).tensor().dtype(), "bf16");
      }
    }
    ASSERT_EQ(p.outputs_size(), 1);
    EXPECT_EQ(p.outputs(0).dtype(), "f32");  // outputs come back in the model's dtype
  }
}

// The same plan lowered without the policy has the same redistributions; with it, every step
// moves bf16 (half the priced bytes) except the reducing backward steps of a parameter's gradient,
// which move f32 (reduce_dtype, recorded on the parameter's edge only).
TEST(Lower, MixedPrecisionPricesTheBytesEachStepMoves) {
  int reducing_param_steps = 0;
  for (bool ddp : {false, true}) {  // the optimizer's plan, and ddp (gradients all-reduced)
    // ddp on a large batch: a small one would rather gather the batch than reduce gradients.
    ir::Graph g = toyBlock(ddp ? 512 : 8);
    spec::Spec spec = specFor({2, 2}, {});
    if (ddp) spec = plan::baselineSpec(g, spec, solver::Baseline::kDdp);
    spec.mixed_precision.param_dtype = ir::DType::kBF16;
    spec.mixed_precision.reduce_dtype = ir::DType::kF32;
    plan::Plan planned;
    if (ddp) {
      auto built = plan::buildProblem(g, spec);
      ASSERT_TRUE(built.ok()) << built.error().message();
      auto r = plan::solveBaselineAndPlan(g, *built, spec, plan::testing::toySource(g),
                                          solver::Baseline::kDdp, {});
      ASSERT_TRUE(r.ok()) << r.error().message();
      planned = r->plan;
    } else {
      planned = planOf(g, spec).result.plan;
    }
    auto programs = lowerPlan(g, planned);
    ASSERT_TRUE(programs.ok()) << programs.error().message();
    plan::Plan plain = planned;
    plain.spec.mixed_precision = {};
    auto programs32 = lowerPlan(g, plain);
    ASSERT_TRUE(programs32.ok()) << programs32.error().message();
    for (size_t k = 0; k < programs->size(); ++k) {
      const proto::Program& mp = (*programs)[k];
      const proto::Program& fp = (*programs32)[k];
      ASSERT_EQ(mp.redistributions_size(), fp.redistributions_size());
      for (int i = 0; i < mp.redistributions_size(); ++i) {
        const proto::Redistribution& a = mp.redistributions(i);
        const proto::Redistribution& b = fp.redistributions(i);
        ASSERT_EQ(a.edge(), b.edge());
        EXPECT_TRUE(b.reduce_dtype().empty());
        bool param = false;
        for (const proto::ProgramTensor& t : mp.parameters())
          param = param || a.edge().rfind("%" + t.name() + " -> ", 0) == 0;
        EXPECT_EQ(a.reduce_dtype(), param && a.requires_grad() ? "f32" : "") << a.edge();
        ASSERT_EQ(a.forward_size(), b.forward_size());
        for (int s = 0; s < a.forward_size(); ++s)
          EXPECT_EQ(2 * a.forward(s).priced_bytes(), b.forward(s).priced_bytes()) << a.edge();
        ASSERT_EQ(a.backward_size(), b.backward_size());
        for (int s = 0; s < a.backward_size(); ++s) {
          const proto::StepKind kind = a.backward(s).kind();
          bool f32 = param && (kind == proto::ALL_REDUCE || kind == proto::REDUCE_SCATTER);
          reducing_param_steps += f32 ? 1 : 0;
          EXPECT_EQ((f32 ? 1 : 2) * a.backward(s).priced_bytes(), b.backward(s).priced_bytes())
              << a.edge() << " backward step " << s;
        }
      }
    }
  }
  EXPECT_GT(reducing_param_steps, 0) << "the plan reduces no parameter gradient";
}

// --- artifact ------------------------------------------------------------------------------------

std::string readBytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void writeBytes(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << s;
}

class Artifact : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("apc_lower_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    g_ = toyBlock(8);
    planned_ = planOf(g_, specFor({2, 2}, {"dp", "tp"}));
    auto programs = lowerPlan(g_, planned_.result.plan);
    ASSERT_TRUE(programs.ok()) << programs.error().message();
    programs_ = std::move(programs).value();
    ASSERT_TRUE(artifact::writeArtifact((root_ / "a").string(), programs_).ok());
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string dir() const { return (root_ / "a").string(); }

  fs::path root_;
  ir::Graph g_;
  plan::testing::Planned planned_;
  std::vector<proto::Program> programs_;
};

void expectOneLine(const Error& e, const std::string& needle) {
  EXPECT_EQ(e.message().find('\n'), std::string::npos) << e.message();
  EXPECT_NE(e.message().find(needle), std::string::npos) << e.message();
}

TEST_F(Artifact, RoundTripsAndIsByteIdentical) {
  auto again = lowerPlan(g_, planned_.result.plan);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(artifact::writeArtifact((root_ / "b").string(), *again).ok());
  for (const char* f :
       {"manifest.json", "rank_0.apcp", "rank_1.apcp", "rank_2.apcp", "rank_3.apcp"})
    EXPECT_EQ(readBytes(root_ / "a" / f), readBytes(root_ / "b" / f)) << f;
  auto m = artifact::readManifest(dir());
  ASSERT_TRUE(m.ok()) << m.error().message();
  EXPECT_EQ(m->world_size, 4);
  EXPECT_EQ(m->mesh_shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(m->mesh_names, (std::vector<std::string>{"dp", "tp"}));
  EXPECT_EQ(m->plan_hash, planned_.result.plan.content_hash);
  for (int64_t r = 0; r < 4; ++r) {
    auto p = artifact::readProgram(dir(), r);
    ASSERT_TRUE(p.ok()) << p.error().message();
    EXPECT_EQ(p->SerializeAsString(), programs_[static_cast<size_t>(r)].SerializeAsString());
  }
}

TEST_F(Artifact, EditedFileIsAHashMismatch) {
  fs::path f = root_ / "a" / "rank_2.apcp";
  std::string b = readBytes(f);
  b[b.size() / 2] = static_cast<char>(b[b.size() / 2] ^ 1);
  writeBytes(f, b);
  auto p = artifact::readProgram(dir(), 2);
  ASSERT_FALSE(p.ok());
  expectOneLine(p.error(), "SHA-256 mismatch");
  EXPECT_TRUE(artifact::readProgram(dir(), 1).ok());
}

TEST_F(Artifact, TruncatedFileIsRejected) {
  fs::path f = root_ / "a" / "rank_0.apcp";
  std::string b = readBytes(f);
  writeBytes(f, b.substr(0, b.size() / 3));
  auto p = artifact::readProgram(dir(), 0);
  ASSERT_FALSE(p.ok());
  expectOneLine(p.error(), "rank_0.apcp");
}

TEST_F(Artifact, WrongVersionIsRejected) {
  fs::path f = root_ / "a" / "manifest.json";
  std::string b = readBytes(f);
  auto at = b.find("\"format_version\": 1");
  ASSERT_NE(at, std::string::npos);
  b.replace(at, 19, "\"format_version\": 7");
  writeBytes(f, b);
  auto m = artifact::readManifest(dir());
  ASSERT_FALSE(m.ok());
  expectOneLine(m.error(), "format version 7");

  // A program of another format version, with a manifest that matches its bytes.
  std::vector<proto::Program> progs = programs_;
  for (auto& p : progs) p.set_format_version(artifact::kProgramFormatVersion + 1);
  ASSERT_TRUE(artifact::writeArtifact((root_ / "c").string(), progs).ok());
  auto p = artifact::readProgram((root_ / "c").string(), 0);
  ASSERT_FALSE(p.ok());
  expectOneLine(p.error(), "program format version");
  expectOneLine(p.error(), "written by a newer apc");
  // An older one (format 5 had vocab masks): lower again.
  for (auto& q : progs) q.set_format_version(artifact::kProgramFormatVersion - 1);
  ASSERT_TRUE(artifact::writeArtifact((root_ / "d").string(), progs).ok());
  auto old = artifact::readProgram((root_ / "d").string(), 0);
  ASSERT_FALSE(old.ok());
  expectOneLine(old.error(), "this apc reads version " +
                                 std::to_string(artifact::kProgramFormatVersion) +
                                 " (written by an older apc: lower the plan again)");
}

TEST(TypedProto, EveryPlacementStepKindAndReduceOpRoundTrips) {
  using mesh::Placement;
  using mesh::ReduceOp;
  const mesh::PlacementTuple all = {Placement::replicate(),
                                    Placement::shard(0),
                                    Placement::shard(3),
                                    Placement::partial(),
                                    Placement::partial(ReduceOp::kMax),
                                    Placement::partial(ReduceOp::kMin),
                                    Placement::partial(ReduceOp::kAvg)};
  artifact::PlacementField f;
  artifact::toProto(all, &f);
  ASSERT_EQ(f.size(), 7);
  auto back = artifact::placementFromProto(f);
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(*back, all);
  EXPECT_EQ(mesh::toString(*back), "R,S(0),S(3),P,P(max),P(min),P(avg)");
  std::set<int> seen;
  for (layout::StepKind k : {layout::StepKind::kAllGather, layout::StepKind::kAllReduce,
                             layout::StepKind::kReduceScatter, layout::StepKind::kLocalSlice,
                             layout::StepKind::kAllToAll}) {
    proto::StepKind p = artifact::toProto(k);
    EXPECT_NE(p, proto::STEP_KIND_UNSET);
    EXPECT_TRUE(seen.insert(p).second) << layout::stepKindName(k);
    auto again = artifact::stepKindFromProto(p);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, k);
  }
}

TEST(TypedProto, UnsetAndUnknownValuesAreRefused) {
  artifact::PlacementField f;
  f.Add();  // kind unset
  auto unset = artifact::placementFromProto(f);
  ASSERT_FALSE(unset.ok());
  EXPECT_NE(unset.error().message().find("kind not set"), std::string::npos);
  f.Mutable(0)->set_kind(static_cast<proto::Placement::Kind>(42));
  auto unknown = artifact::placementFromProto(f);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.error().message().find("unknown kind 42"), std::string::npos);
  f.Mutable(0)->set_kind(proto::Placement::SHARD);
  f.Mutable(0)->set_dim(-1);
  EXPECT_FALSE(artifact::placementFromProto(f).ok());
  f.Mutable(0)->set_kind(proto::Placement::PARTIAL);  // no reduce op
  EXPECT_FALSE(artifact::placementFromProto(f).ok());
  EXPECT_FALSE(artifact::stepKindFromProto(proto::STEP_KIND_UNSET).ok());
  EXPECT_FALSE(artifact::stepKindFromProto(static_cast<proto::StepKind>(9)).ok());
  EXPECT_FALSE(artifact::reduceOpFromProto(proto::REDUCE_OP_UNSET).ok());
}

TEST_F(Artifact, ADamagedEnumIsRefusedAtReadNamingTheEdge) {
  // Programs whose bytes and manifest agree but whose typed fields are wrong: readProgram's
  // checks (what the runtime relies on) name the edge or tensor, on one line.
  auto damaged = [&](const std::string& name, auto edit, const std::string& needle) {
    std::vector<proto::Program> progs = programs_;
    edit(progs[0]);
    ASSERT_TRUE(artifact::writeArtifact((root_ / name).string(), progs).ok());
    auto p = artifact::readProgram((root_ / name).string(), 0);
    ASSERT_FALSE(p.ok()) << name;
    expectOneLine(p.error(), needle);
    EXPECT_TRUE(artifact::readProgram((root_ / name).string(), 1).ok());
  };
  ASSERT_GT(programs_[0].redistributions_size(), 0);
  int with_steps = -1;
  for (int i = 0; i < programs_[0].redistributions_size() && with_steps < 0; ++i)
    if (programs_[0].redistributions(i).forward_size() > 0) with_steps = i;
  ASSERT_GE(with_steps, 0);
  const std::string edge = programs_[0].redistributions(with_steps).edge();
  damaged(
      "kind",
      [&](proto::Program& p) {
        p.mutable_redistributions(with_steps)
            ->mutable_forward(0)
            ->set_kind(static_cast<proto::StepKind>(77));
      },
      "edge '" + edge + "' forward step 0: unknown redistribution step kind 77");
  damaged(
      "mesh_dim",
      [&](proto::Program& p) {
        p.mutable_redistributions(with_steps)->mutable_forward(0)->set_mesh_dim(2);
      },
      "mesh dim 2 on a 2-dim mesh");
  damaged(
      "to",
      [&](proto::Program& p) { p.mutable_redistributions(with_steps)->mutable_to()->RemoveLast(); },
      "(to): 1 placements on a 2-dim mesh");
  // The runtime buckets a marked edge's gradient as one all-reduce: a marked edge that moves
  // anything forward is refused.
  damaged(
      "bucketed",
      [&](proto::Program& p) {
        p.mutable_redistributions(with_steps)->set_bucketed_gradient(true);
      },
      "edge '" + edge +
          "': marked bucketed_gradient, but a bucketed gradient's edge moves nothing "
          "forward");
  ASSERT_GT(programs_[0].parameters_size(), 0);
  const std::string param = programs_[0].parameters(0).name();
  damaged(
      "param",
      [&](proto::Program& p) {
        p.mutable_parameters(0)->mutable_placement(0)->set_kind(proto::Placement::KIND_UNSET);
      },
      "tensor '" + param + "': placement entry 0: kind not set");
  damaged(
      "no_placement", [&](proto::Program& p) { p.mutable_parameters(0)->clear_placement(); },
      "tensor '" + param + "': 0 placements on a 2-dim mesh");
}

TEST_F(Artifact, MissingManifestAndRankOutOfRange) {
  auto m = artifact::readManifest((root_ / "nowhere").string());
  ASSERT_FALSE(m.ok());
  expectOneLine(m.error(), "manifest.json");
  auto p = artifact::readProgram(dir(), 4);
  ASSERT_FALSE(p.ok());
  expectOneLine(p.error(), "world size 4");
}

TEST_F(Artifact, ManifestErrorsNameTheProblem) {
  fs::path f = root_ / "a" / "manifest.json";
  std::string good = readBytes(f);
  auto error = [&](const std::string& text) {
    writeBytes(f, text);
    auto m = artifact::readManifest(dir());
    EXPECT_FALSE(m.ok()) << text;
    return m.ok() ? std::string() : m.error().message();
  };
  auto without = [&](const std::string& key) {
    auto j = nlohmann::json::parse(good);
    j.erase(key);
    return j.dump();
  };
  auto with = [&](const std::string& key, const nlohmann::json& v) {
    auto j = nlohmann::json::parse(good);
    j[key] = v;
    return j.dump();
  };
  EXPECT_EQ(error(without("files")), f.string() + ": $: missing key 'files'");
  EXPECT_EQ(error(with("files", 3)),
            f.string() + ": $.files: expected an object of SHA-256 by file name, got number 3");
  std::string truncated = error(good.substr(0, good.size() / 2));
  EXPECT_EQ(truncated.rfind(f.string() + ": malformed JSON: parse error", 0), 0u) << truncated;
  EXPECT_EQ(truncated.find('\n'), std::string::npos) << truncated;
  EXPECT_EQ(error("[1, 2]"), f.string() + ": $: expected an object, got array");
  std::string deep = error(std::string(100000, '[') + std::string(100000, ']'));
  EXPECT_NE(deep.find("nested deeper than 64 levels"), std::string::npos) << deep;
  auto mesh = nlohmann::json::parse(good)["mesh"];
  mesh["shape"] = {4611686018427387904LL, 2};
  EXPECT_EQ(
      error(with("mesh", mesh)),
      f.string() +
          ": $.mesh.shape[0]: a mesh dim's size must be in [1, 65536], got 4611686018427387904");
  mesh["shape"] = {65536, 2};
  EXPECT_EQ(error(with("mesh", mesh)),
            f.string() + ": $.mesh.shape: mesh of more than 65536 devices");
  EXPECT_EQ(error(with("world_size", 5)),
            f.string() + ": $.world_size: world_size 5 does not match the mesh (4 devices)");
}

TEST_F(Artifact, RewritingReplacesTheWholeDirectory) {
  // A 2-rank artifact over the 4-rank one: no stale rank_2/rank_3 files remain.
  plan::testing::Planned two = planOf(g_, specFor({2}, {"dp"}));
  auto programs = lowerPlan(g_, two.result.plan);
  ASSERT_TRUE(programs.ok()) << programs.error().message();
  ASSERT_TRUE(artifact::writeArtifact(dir(), *programs).ok());
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(root_ / "a"))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"manifest.json", "rank_0.apcp", "rank_1.apcp"}));
  std::vector<std::string> siblings;
  for (const auto& e : fs::directory_iterator(root_)) siblings.push_back(e.path().filename());
  EXPECT_EQ(siblings, std::vector<std::string>{"a"});  // no staging directory left behind
  EXPECT_TRUE(artifact::readProgram(dir(), 1).ok());
}

TEST_F(Artifact, RefusesAFileOrAForeignDirectory) {
  writeBytes(root_ / "file", "x");
  Status file = artifact::writeArtifact((root_ / "file").string(), programs_);
  ASSERT_FALSE(file.ok());
  expectOneLine(file.error(), "exists and is not a directory");
  fs::create_directories(root_ / "home");
  writeBytes(root_ / "home" / "notes.txt", "mine");
  Status foreign = artifact::writeArtifact((root_ / "home").string(), programs_);
  ASSERT_FALSE(foreign.ok());
  expectOneLine(foreign.error(), "refusing to replace it");
  EXPECT_EQ(readBytes(root_ / "home" / "notes.txt"), "mine");
}

}  // namespace
}  // namespace apc::lower
