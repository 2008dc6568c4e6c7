//===- tests/strategy/rules_test.cpp - Exact strategy sets of the rules ----===//
//
// Each test builds one or two op nodes by hand and asserts the exact list of strategies on a 1-d
// mesh (the single-dim rule after pruning), derived from first principles in the comments, or
// on a 2-d mesh where divisibility of the product matters.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>

#include "apc/strategy/strategy.h"
#include "apc/strategy/sync_norm.h"
#include "builder.h"

namespace apc::strategy::testing {
namespace {

using Strings = std::vector<std::string>;

bool contains(const Strings& s, const std::string& x) {
  return std::find(s.begin(), s.end(), x) != s.end();
}

TEST(Linear, FourFamiliesWithoutBias) {
  Builder b;
  ValueId x = b.input("x", {8, 16, 32});
  ValueId w = b.param("w", {64, 32});
  b.op("aten::linear", {x, w, b.none()}, {8, 16, 64});
  // Batch dims 0, 1 (W R); out features (W S(0) -> out S(2)); in features contracted on both
  // -> P; x Partial with W R -> P. All-R first.
  EXPECT_EQ(strategiesOf(b.g, b.last(), "2"),
            (Strings{"R,R -> R", "S(0),R -> S(0)", "S(1),R -> S(1)", "R,S(0) -> S(2)",
                     "S(2),S(1) -> P", "P,R -> P"}));
}

TEST(Linear, BiasFollowsOutputAndIsPartialWithPartialOutput) {
  Builder b;
  ValueId x = b.input("x", {8, 16, 32});
  ValueId w = b.param("w", {64, 32});
  ValueId bias = b.param("b", {64});
  b.op("aten::linear", {x, w, bias}, {8, 16, 64});
  // out S(2) needs bias S(0); a Partial output needs a Partial bias (added once in the sum), or,
  // for the contraction (Megatron's row-parallel linear), a Replicate one that the rank at
  // coordinate 0 alone adds (rewriteAddendOnce).
  EXPECT_EQ(strategiesOf(b.g, b.last(), "2"),
            (Strings{"R,R,R -> R", "S(0),R,R -> S(0)", "S(1),R,R -> S(1)", "R,S(0),S(0) -> S(2)",
                     "S(2),S(1),P -> P", "S(2),S(1),R -> P", "P,R,P -> P"}));
}

TEST(Linear, UnevenVocabularyStaysShardable) {
  Builder b;
  ValueId x = b.input("x", {8, 64, 48});
  ValueId w = b.param("wte", {50257, 48});
  b.op("aten::linear", {x, w, b.none()}, {8, 64, 50257});
  Strings s = strategiesOf(b.g, b.last(), "8");
  EXPECT_TRUE(contains(s, "R,S(0) -> S(2)"));  // 50257 >= 8: torch.chunk pieces
  EXPECT_TRUE(contains(s, "S(0),R -> S(0)"));
}

TEST(Matmul, AttentionScores) {
  Builder b;
  ValueId q = b.input("q", {8, 4, 64, 12});
  ValueId k = b.input("k", {8, 4, 12, 64});
  b.op("aten::matmul", {q, k}, {8, 4, 64, 64});
  EXPECT_EQ(strategiesOf(b.g, b.last(), "2"),
            (Strings{"R,R -> R", "S(0),S(0) -> S(0)", "S(1),S(1) -> S(1)", "S(2),R -> S(2)",
                     "R,S(3) -> S(3)", "S(3),S(2) -> P", "P,R -> P", "R,P -> P"}));
}

TEST(Matmul, BroadcastBatchAndOneDimensional) {
  Builder b;
  ValueId x = b.input("x", {8, 4, 64, 12});
  ValueId w = b.input("w", {12, 64});
  b.op("aten::matmul", {x, w}, {8, 4, 64, 64});
  EXPECT_EQ(strategiesOf(b.g, b.last(), "2"),
            (Strings{"R,R -> R", "S(0),R -> S(0)", "S(1),R -> S(1)", "S(2),R -> S(2)",
                     "R,S(1) -> S(3)", "S(3),S(0) -> P", "P,R -> P", "R,P -> P"}));
  Builder c;
  ValueId a = c.input("a", {1, 6, 4});
  ValueId v = c.input("v", {4});
  c.op("aten::matmul", {a, v}, {1, 6});
  // Batch dim of size 1 is never cut; m -> S(1); k contracted.
  EXPECT_EQ(strategiesOf(c.g, c.last(), "2"),
            (Strings{"R,R -> R", "S(1),R -> S(1)", "S(2),S(0) -> P", "P,R -> P", "R,P -> P"}));
}

TEST(Addmm, SelfBroadcastsLikeABias) {
  Builder b;
  ValueId bias = b.param("b", {32});
  ValueId m1 = b.input("m1", {16, 8});
  ValueId m2 = b.param("m2", {8, 32});
  b.op("aten::addmm", {bias, m1, m2, b.i(1), b.i(1)}, {16, 32});
  EXPECT_EQ(strategiesOf(b.g, b.last(), "2"),
            (Strings{"R,R,R -> R", "R,S(0),R -> S(0)", "S(0),R,S(1) -> S(1)", "P,S(1),S(0) -> P",
                     "R,S(1),S(0) -> P", "P,P,R -> P", "P,R,P -> P"}));
}

TEST(Embedding, RowColumnAndIndexSharding) {
  Builder b;
  ValueId w = b.param("w", {100, 16});
  ValueId idx = b.input("idx", {4, 8}, DType::kI64);
  b.op("aten::embedding", {w, idx, b.i(-1), b.b(false), b.b(false)}, {4, 8, 16});
  EXPECT_EQ(
      strategiesOf(b.g, b.last(), "2"),
      (Strings{"R,R -> R", "R,S(0) -> S(0)", "R,S(1) -> S(1)", "S(1),R -> S(2)", "S(0),R -> P"}));
}

TEST(LayerNorm, NormalizedDimsReplicate) {
  Builder b;
  ValueId x = b.input("x", {4, 8, 16});
  ValueId w = b.param("w", {16}), bias = b.param("b", {16});
  b.op("aten::layer_norm", {x, b.ints({16}), w, bias, b.f(1e-5), b.b(true)}, {4, 8, 16});
  EXPECT_EQ(strategiesOf(b.g, b.last(), "2"),
            (Strings{"R,R,R -> R", "S(0),R,R -> S(0)", "S(1),R,R -> S(1)"}));
  Builder c;
  ValueId y = c.input("y", {4, 8, 16});
  c.op("aten::layer_norm", {y, c.ints({8, 16}), c.none(), c.none(), c.f(1e-5), c.b(true)},
       {4, 8, 16});
  EXPECT_EQ(strategiesOf(c.g, c.last(), "2"), (Strings{"R -> R", "S(0) -> S(0)"}));
}

TEST(BatchNorm, EveryDimWhenTrainingIsKnownChannelsOnlyOtherwise) {
  // In training the batch and spatial dims are free too: their statistics are all-reduced
  // (apc/strategy/sync_norm.h); with `training` unknown at import only the channel dim is.
  for (int mode : {0, 1, 2}) {  // eval, training, training not a constant
    Builder b;
    ValueId x = b.input("x", {8, 16, 4, 4});
    ValueId w = b.param("w", {16}), bias = b.param("b", {16});
    ValueId rm = b.buffer("rm", {16}), rv = b.buffer("rv", {16});
    ir::Value flag;  // a bool computed at run time: no constant
    flag.type = ValueType::kBool;
    ValueId training = mode == 2 ? b.g.addValue(flag) : b.b(mode == 1);
    b.op("aten::batch_norm", {x, w, bias, rm, rv, training, b.f(0.1), b.f(1e-5), b.b(true)},
         {8, 16, 4, 4});
    Strings expected = {"R,R,R,R,R -> R"};
    if (mode != 2) expected.push_back("S(0),R,R,R,R -> S(0)");
    expected.push_back("S(1),S(0),S(0),S(0),S(0) -> S(1)");
    if (mode != 2) {
      expected.push_back("S(2),R,R,R,R -> S(2)");
      expected.push_back("S(3),R,R,R,R -> S(3)");
    }
    EXPECT_EQ(strategiesOf(b.g, b.last(), "2"), expected) << "mode " << mode;
  }
}

TEST(BatchNorm, BatchShardedTrainingPaysItsStatisticsAllReduces) {
  auto costs = [](bool training) {
    Builder b;
    ValueId x = b.input("x", {8, 64, 4, 4});
    ValueId w = b.param("w", {64}), bias = b.param("b", {64});
    ValueId rm = b.buffer("rm", {64}), rv = b.buffer("rv", {64});
    b.op("aten::batch_norm", {x, w, bias, rm, rv, b.b(training), b.f(0.1), b.f(1e-5), b.b(true)},
         {8, 64, 4, 4});
    mesh::DeviceMesh m = *mesh::DeviceMesh::parse("4");
    auto all = enumerate(b.g, m);
    std::map<std::string, double> by;
    for (const NodeStrategies& ns : all)
      if (ns.node == b.last())
        for (const Strategy& s : ns.strategies) by[s.toString()] = s.compute_us;
    return by;
  };
  auto eval = costs(false), train = costs(true);
  const std::string batch = "S(0),R,R,R,R -> S(0)", channels = "S(1),S(0),S(0),S(0),S(0) -> S(1)";
  mesh::DeviceMesh m = *mesh::DeviceMesh::parse("4");
  // The parameters take gradients: two all-reduces forward, two backward.
  EXPECT_NEAR(train.at(batch) - eval.at(batch),
              syncNormUs(cost::CostModel(cost::DeviceSpec{}, m), m, {0}, 64, 4, true), 1e-9);
  EXPECT_GT(syncNormUs(cost::CostModel(cost::DeviceSpec{}, m), m, {0}, 64, 4, false), 0);
  EXPECT_DOUBLE_EQ(train.at(channels), eval.at(channels));  // each rank has whole channels
  EXPECT_EQ(syncNormMeshDims({mesh::Placement::shard(0), mesh::Placement::shard(1)}),
            std::vector<size_t>{0});
}

TEST(BatchNorm, CoreAtenFormsShareTheRule) {
  // _native_batch_norm_legit_functional(x, w, b, rm, rv, training, momentum, eps) -> (out,
  // save_mean, save_rstd, rm_out, rv_out) and _no_training(x, w, b, rm, rv, momentum, eps) ->
  // (out, save_mean, save_rstd): the channel dim shards every per-channel output S(0); eval's
  // save_mean/save_rstd are empty ([0]) and stay R. Batch and spatial dims are free in every
  // mode: the functional form in training synchronizes its statistics as batch_norm does
  // (sync_norm.h), its saved and running stats R.
  for (int mode : {0, 1, 2}) {  // functional eval, functional training, no_training
    Builder b;
    ValueId x = b.input("x", {8, 16, 4, 4});
    ValueId w = b.param("w", {16}), bias = b.param("b", {16});
    ValueId rm = b.buffer("rm", {16}), rv = b.buffer("rv", {16});
    int64_t saved = mode == 1 ? 16 : 0;
    if (mode == 2)
      b.multiOp("aten::_native_batch_norm_legit_no_training",
                {x, w, bias, rm, rv, b.f(0.1), b.f(1e-5)}, {{8, 16, 4, 4}, {0}, {0}});
    else
      b.multiOp("aten::_native_batch_norm_legit_functional",
                {x, w, bias, rm, rv, b.b(mode == 1), b.f(0.1), b.f(1e-5)},
                {{8, 16, 4, 4}, {saved}, {saved}, {16}, {16}});
    std::string stats = mode == 2 ? "" : ",R,R";
    std::string channel_stats = mode == 2 ? "" : ",S(0),S(0)";
    std::string saved_channel = saved ? ",S(0),S(0)" : ",R,R";
    Strings expected = {"R,R,R,R,R -> R,R,R" + stats};
    for (int d : {0, 1, 2, 3}) {
      if (d == 1)
        expected.push_back("S(1),S(0),S(0),S(0),S(0) -> S(1)" + saved_channel + channel_stats);
      else
        expected.push_back("S(" + std::to_string(d) + "),R,R,R,R -> S(" + std::to_string(d) +
                           "),R,R" + stats);
    }
    EXPECT_EQ(strategiesOf(b.g, b.last(), "2"), expected) << "mode " << mode;
    EXPECT_EQ(isTrainingBatchNorm(b.g, b.g.node(b.last())), mode == 1) << "mode " << mode;
  }
  // The functional form in training pays the statistics' all-reduces as batch_norm does.
  auto batchCost = [](const std::string& op, bool training) {
    Builder b;
    ValueId x = b.input("x", {8, 64, 4, 4});
    ValueId w = b.param("w", {64}), bias = b.param("b", {64});
    ValueId rm = b.buffer("rm", {64}), rv = b.buffer("rv", {64});
    if (op == "aten::batch_norm")
      b.op(op, {x, w, bias, rm, rv, b.b(training), b.f(0.1), b.f(1e-5), b.b(true)}, {8, 64, 4, 4});
    else
      b.multiOp(op, {x, w, bias, rm, rv, b.b(training), b.f(0.1), b.f(1e-5)},
                {{8, 64, 4, 4}, {64}, {64}, {64}, {64}});
    for (const NodeStrategies& ns : enumerate(b.g, *mesh::DeviceMesh::parse("4")))
      if (ns.node == b.last())
        for (const Strategy& s : ns.strategies)
          if (s.toString().rfind("S(0),R,R,R,R -> S(0)", 0) == 0) return s.compute_us;
    return -1.0;
  };
  mesh::DeviceMesh m = *mesh::DeviceMesh::parse("4");
  const std::string functional = "aten::_native_batch_norm_legit_functional";
  EXPECT_NEAR(batchCost(functional, true) - batchCost(functional, false),
              syncNormUs(cost::CostModel(cost::DeviceSpec{}, m), m, {0}, 64, 4, true), 1e-6);
}

TEST(Einsum, LabelsAtOneDimOfEveryOperandShardThroughTheList) {
  auto einsum = [](const std::string& eq, const std::vector<std::vector<int64_t>>& shapes,
                   std::vector<int64_t> out) {
    Builder b;
    std::vector<ValueId> xs;
    for (size_t i = 0; i < shapes.size(); ++i)
      xs.push_back(b.input("x" + std::to_string(i), shapes[i]));
    ValueId list = b.listOp("prim::ListConstruct", xs, shapes);
    b.op("aten::einsum", {b.str(eq), list, b.none()}, std::move(out));
    auto all = enumerate(b.g, *mesh::DeviceMesh::parse("2"));
    for (const NodeStrategies& ns : all)
      if (ns.node == b.last() && ns.fallback) return Strings{"fallback"};
    return strategyStrings(all, b.last());
  };
  // maxvit's attention scores: b, h at dims 0, 1 of both operands and the output; d at dim 3 of
  // both, contracted -> P; i and j share dim 2 but are different labels: R.
  EXPECT_EQ(einsum("bhid,bhjd->bhij", {{2, 4, 8, 16}, {2, 4, 8, 16}}, {2, 4, 8, 8}),
            (Strings{"R -> R", "S(0) -> S(0)", "S(1) -> S(1)", "S(3) -> P"}));
  // The attention-weighted values: j is at dim 3 of one operand and dim 2 of the other.
  EXPECT_EQ(einsum("bhij, bhjd -> bhid", {{2, 4, 8, 8}, {2, 4, 8, 16}}, {2, 4, 8, 16}),
            (Strings{"R -> R", "S(0) -> S(0)", "S(1) -> S(1)"}));
  // Implicit output: the letters used once, in order (ik; b and j are summed), and a broadcast
  // (size-1) batch label: sharded through the list, the size-1 operand whole
  // (layout::elementPlacement); a broadcast contracted label gives P.
  EXPECT_EQ(einsum("bij,bjk", {{4, 2, 3}, {4, 3, 5}}, {2, 5}), (Strings{"R -> R", "S(0) -> P"}));
  EXPECT_EQ(einsum("bij,bjk->bik", {{4, 2, 3}, {1, 3, 5}}, {4, 2, 5}),
            (Strings{"R -> R", "S(0) -> S(0)"}));
  EXPECT_EQ(einsum("bij,bkj->bik", {{4, 2, 6}, {4, 5, 1}}, {4, 2, 5}),
            (Strings{"R -> R", "S(0) -> S(0)", "S(2) -> P"}));
  // Every operand of size 1 in a label: nothing to cut.
  EXPECT_EQ(einsum("bij,bjk->bik", {{1, 2, 3}, {1, 3, 5}}, {1, 2, 5}), (Strings{"R -> R"}));
  // Ellipsis dims are labels too (aligned from the right); j contracted at dim 3 of both.
  EXPECT_EQ(einsum("...ij,...kj->...ik", {{2, 6, 4, 5}, {2, 6, 3, 5}}, {2, 6, 4, 3}),
            (Strings{"R -> R", "S(0) -> S(0)", "S(1) -> S(1)", "S(3) -> P"}));
  // One operand: a permutation maps each dim, a summed label gives P, and Partial passes.
  EXPECT_EQ(einsum("bij->bji", {{2, 4, 6}}, {2, 6, 4}),
            (Strings{"R -> R", "S(0) -> S(0)", "S(1) -> S(2)", "S(2) -> S(1)", "P -> P"}));
  EXPECT_EQ(einsum("bij->b", {{2, 4, 6}}, {2}),
            (Strings{"R -> R", "S(0) -> S(0)", "S(1) -> P", "S(2) -> P", "P -> P"}));
  // A diagonal (a label twice in one operand) stays whole.
  EXPECT_EQ(einsum("ii->i", {{4, 4}}, {4}), (Strings{"R -> R", "P -> P"}));
  // Malformed or not understood: no rule.
  EXPECT_EQ(einsum("ij,jk->il", {{2, 3}, {3, 4}}, {2, 4}), (Strings{"fallback"}));
  EXPECT_EQ(einsum("ij,jk,kl->il", {{2, 3}, {3, 4}}, {2, 4}), (Strings{"fallback"}));
  EXPECT_EQ(einsum("...ij->ij", {{5, 2, 3}}, {2, 3}), (Strings{"fallback"}));
}

TEST(Upsample, BatchAndChannelsFreeSpatialWhole) {
  Builder b;
  ValueId x = b.input("x", {8, 6, 5, 5});
  b.op("aten::upsample_bilinear2d.vec",
       {x, b.none(), b.b(false),
        b.g.addConstant(ValueType::kFloatList, std::vector<double>{2.0, 2.0})},
       {8, 6, 10, 10});
  NodeId bilinear = b.last();
  b.op("aten::upsample_nearest2d", {x, b.ints({7, 9}), b.none(), b.none()}, {8, 6, 7, 9});
  NodeId nearest = b.last();
  auto all = enumerate(b.g, *mesh::DeviceMesh::parse("2"));
  Strings expected = {"R -> R", "S(0) -> S(0)", "S(1) -> S(1)", "P -> P"};
  EXPECT_EQ(strategyStrings(all, bilinear), expected);
  EXPECT_EQ(strategyStrings(all, nearest), expected);
}

TEST(Softmax, SoftmaxDimReplicate) {
  Builder b;
  ValueId x = b.input("x", {4, 8, 16});
  b.op("aten::softmax.int", {x, b.i(-1), b.none()}, {4, 8, 16});
  EXPECT_EQ(strategiesOf(b.g, b.last(), "2"), (Strings{"R -> R", "S(0) -> S(0)", "S(1) -> S(1)"}));
  Builder c;
  ValueId y = c.input("y", {4, 8, 16});
  c.op("aten::log_softmax.int", {y, c.i(1), c.none()}, {4, 8, 16});
  EXPECT_EQ(strategiesOf(c.g, c.last(), "2"), (Strings{"R -> R", "S(0) -> S(0)", "S(2) -> S(2)"}));
}

TEST(Pointwise, BroadcastingAddAndPartials) {
  Builder b;
  ValueId x = b.input("x", {8, 16, 32});
  ValueId y = b.param("y", {32});
  b.op("aten::add.Tensor", {x, y, b.i(1)}, {8, 16, 32});
  // y is missing dims 0, 1 (R there) and shares dim 2 (its dim 0). Partial: P+P sums; an
  // average plus a replicated value stays an average.
  EXPECT_EQ(
      strategiesOf(b.g, b.last(), "2"),
      (Strings{"R,R -> R", "S(0),R -> S(0)", "S(1),R -> S(1)", "S(2),S(0) -> S(2)", "P,P -> P",
               "P(avg),P(avg) -> P(avg)", "P(avg),R -> P(avg)", "R,P(avg) -> P(avg)"}));
}

TEST(Pointwise, SizeOneDimsBroadcast) {
  Builder b;
  ValueId x = b.input("x", {8, 16, 32});
  ValueId y = b.input("y", {1, 16, 1});
  b.op("aten::mul.Tensor", {x, y}, {8, 16, 32});
  EXPECT_EQ(strategiesOf(b.g, b.last(), "2"),
            (Strings{"R,R -> R", "S(0),R -> S(0)", "S(1),S(1) -> S(1)", "S(2),R -> S(2)",
                     "P,R -> P", "P(avg),R -> P(avg)", "R,P -> P", "R,P(avg) -> P(avg)"}));
}

TEST(Pointwise, PartialThroughLinearOpsOnly) {
  Builder b;
  ValueId x = b.input("x", {8, 16});
  ValueId relu = b.op("aten::relu", {x}, {8, 16});
  NodeId relu_node = b.last();
  ValueId scaled = b.op("aten::mul.Tensor", {x, b.f(0.5)}, {8, 16});
  NodeId mul = b.last();
  b.op("aten::add.Tensor", {x, b.f(1e-5), b.i(1)}, {8, 16});
  NodeId add_scalar = b.last();
  b.op("aten::neg", {scaled}, {8, 16});
  NodeId neg = b.last();
  b.op("aten::gelu", {relu, b.str("none")}, {8, 16});
  NodeId gelu = b.last();
  b.op("aten::pow.Tensor_Scalar", {x, b.i(2)}, {8, 16});
  NodeId pow = b.last();
  auto all = enumerate(b.g, *mesh::DeviceMesh::parse("2"));
  Strings shards = {"R -> R", "S(0) -> S(0)", "S(1) -> S(1)"};
  EXPECT_EQ(strategyStrings(all, relu_node), shards);  // relu
  EXPECT_EQ(strategyStrings(all, gelu), shards);
  EXPECT_EQ(strategyStrings(all, pow), shards);
  Strings linear = shards;
  linear.push_back("P -> P");
  linear.push_back("P(avg) -> P(avg)");
  EXPECT_EQ(strategyStrings(all, mul), linear);
  EXPECT_EQ(strategyStrings(all, neg), linear);
  // x + scalar: only an average keeps the scalar added once.
  Strings affine = shards;
  affine.push_back("P(avg) -> P(avg)");
  EXPECT_EQ(strategyStrings(all, add_scalar), affine);
}

TEST(Pointwise, CastsKeepPartialOnlyBetweenFloats) {
  Builder b;
  ValueId x = b.input("x", {8, 16});
  b.op("aten::to.dtype", {x, b.i(6), b.b(false), b.b(false), b.none()}, {8, 16}, DType::kBF16);
  NodeId to_bf16 = b.last();
  b.op("aten::to.dtype", {x, b.i(4), b.b(false), b.b(false), b.none()}, {8, 16}, DType::kI64);
  NodeId to_int = b.last();
  auto all = enumerate(b.g, *mesh::DeviceMesh::parse("2"));
  EXPECT_EQ(strategyStrings(all, to_bf16),
            (Strings{"R -> R", "S(0) -> S(0)", "S(1) -> S(1)", "P -> P", "P(avg) -> P(avg)"}));
  EXPECT_EQ(strategyStrings(all, to_int), (Strings{"R -> R", "S(0) -> S(0)", "S(1) -> S(1)"}));
}

TEST(Pointwise, TypeAsOtherFollowsSelfWhereItFits) {
  Builder b;
  ValueId s = b.input("s", {8, 4, 16, 16});
  ValueId q = b.input("q", {8, 4, 16, 8});
  b.op("aten::type_as", {s, q}, {8, 4, 16, 16});
  EXPECT_EQ(strategiesOf(b.g, b.last(), "2"),
            (Strings{"R,R -> R", "S(0),S(0) -> S(0)", "S(1),S(1) -> S(1)", "S(2),S(2) -> S(2)",
                     "S(3),R -> S(3)", "P,R -> P", "P(avg),R -> P(avg)"}));
}

TEST(Pointwise, MaskedFillMaskBroadcasts) {
  Builder b;
  ValueId att = b.input("att", {8, 4, 64, 64});
  ValueId mask = b.input("mask", {64, 64}, DType::kBool);
  b.op("aten::masked_fill.Scalar", {att, mask, b.f(-1e300)}, {8, 4, 64, 64});
  EXPECT_EQ(strategiesOf(b.g, b.last(), "2"),
            (Strings{"R,R -> R", "S(0),R -> S(0)", "S(1),R -> S(1)", "S(2),S(0) -> S(2)",
                     "S(3),S(1) -> S(3)"}));
}

TEST(Reduction, MeanNeedsEvenSumDoesNot) {
  Builder b;
  ValueId x = b.input("x", {8, 16});
  b.op("aten::mean.dim", {x, b.ints({-1}), b.b(true), b.none()}, {8, 1});
  NodeId mean = b.last();
  b.op("aten::sum.dim_IntList", {x, b.ints({1}), b.b(false), b.none()}, {8});
  NodeId sum = b.last();
  b.op("aten::amax", {x, b.ints({1}), b.b(false)}, {8});
  NodeId amax = b.last();
  auto on2 = enumerate(b.g, *mesh::DeviceMesh::parse("2"));
  EXPECT_EQ(strategyStrings(on2, mean),
            (Strings{"R -> R", "S(0) -> S(0)", "S(1) -> P(avg)", "P -> P", "P(avg) -> P(avg)"}));
  EXPECT_EQ(strategyStrings(on2, sum),
            (Strings{"R -> R", "S(0) -> S(0)", "S(1) -> P", "P -> P", "P(avg) -> P(avg)"}));
  EXPECT_EQ(strategyStrings(on2, amax),
            (Strings{"R -> R", "S(0) -> S(0)", "S(1) -> P(max)", "P(max) -> P(max)"}));
  // 16 over 3 ranks: pieces 6, 6, 4. The sum and max of slices are exact; the mean of means is
  // not.
  auto on3 = enumerate(b.g, *mesh::DeviceMesh::parse("3"));
  EXPECT_FALSE(contains(strategyStrings(on3, mean), "S(1) -> P(avg)"));
  EXPECT_TRUE(contains(strategyStrings(on3, mean), "S(0) -> S(0)"));
  EXPECT_TRUE(contains(strategyStrings(on3, sum), "S(1) -> P"));
  EXPECT_TRUE(contains(strategyStrings(on3, amax), "S(1) -> P(max)"));  // max of 6, 6, 4
}

TEST(Reduction, FullReductions) {
  Builder b;
  ValueId x = b.input("x", {8, 16});
  b.op("aten::sum", {x, b.none()}, {});
  EXPECT_EQ(strategiesOf(b.g, b.last(), "2"),
            (Strings{"R -> R", "S(0) -> P", "S(1) -> P", "P -> P", "P(avg) -> P(avg)"}));
}

TEST(View, MergeNeedsLeftmostDivisible) {
  Builder b;
  ValueId x = b.input("x", {4, 6, 10});
  b.op("aten::view", {x, b.ints({4, 60})}, {4, 60});
  EXPECT_EQ(strategiesOf(b.g, b.last(), "2"),
            (Strings{"R -> R", "S(0) -> S(0)", "S(1) -> S(1)", "P -> P"}));
  // 6 heads over 4 ranks: chunks of 2, 2, 2, 0 heads are not chunks of 60 (15 each).
  EXPECT_EQ(strategiesOf(b.g, b.last(), "4"), (Strings{"R -> R", "S(0) -> S(0)", "P -> P"}));
  // On 2x2 each mesh dim alone divides 6, but both together (4 pieces) do not.
  Strings s = strategiesOf(b.g, b.last(), "2x2");
  EXPECT_EQ(s.size(), 15u);
  EXPECT_FALSE(contains(s, "S(1)S(1) -> S(1)S(1)"));
  EXPECT_TRUE(contains(s, "S(0)S(1) -> S(0)S(1)"));
  EXPECT_TRUE(contains(s, "S(0)S(0) -> S(0)S(0)"));
}

TEST(View, SplitNeedsFirstPartDivisible) {
  Builder b;
  ValueId x = b.input("x", {4, 60});
  b.op("aten::view", {x, b.ints({4, 6, 10})}, {4, 6, 10});
  // 60 and 6 divide by 3 (4 over 3 would leave an empty piece: 2, 2, 0).
  EXPECT_EQ(strategiesOf(b.g, b.last(), "3"), (Strings{"R -> R", "S(1) -> S(1)", "P -> P"}));
  EXPECT_EQ(strategiesOf(b.g, b.last(), "4"), (Strings{"R -> R", "S(0) -> S(0)", "P -> P"}));
}

TEST(View, OneToOneDimsMayBeUneven) {
  Builder b;
  ValueId x = b.input("x", {5, 7});
  b.op("aten::unsqueeze", {x, b.i(1)}, {5, 1, 7});
  EXPECT_EQ(strategiesOf(b.g, b.last(), "2"),
            (Strings{"R -> R", "S(0) -> S(0)", "S(1) -> S(2)", "P -> P"}));
  Builder c;
  ValueId y = c.input("y", {8, 64, 1, 1});
  c.op("aten::flatten.using_ints", {y, c.i(1), c.i(-1)}, {8, 64});
  EXPECT_EQ(strategiesOf(c.g, c.last(), "2"),
            (Strings{"R -> R", "S(0) -> S(0)", "S(1) -> S(1)", "P -> P"}));
}

TEST(View, TransposePermuteExpand) {
  Builder b;
  ValueId x = b.input("x", {8, 6, 4});
  b.op("aten::transpose.int", {x, b.i(-2), b.i(-1)}, {8, 4, 6});
  NodeId tr = b.last();
  b.op("aten::permute", {x, b.ints({2, 0, 1})}, {4, 8, 6});
  NodeId perm = b.last();
  ValueId y = b.input("y", {8, 2, 1, 16});
  b.op("aten::expand", {y, b.ints({8, 2, 2, 16}), b.b(false)}, {8, 2, 2, 16});
  NodeId ex = b.last();
  auto all = enumerate(b.g, *mesh::DeviceMesh::parse("2"));
  EXPECT_EQ(strategyStrings(all, tr),
            (Strings{"R -> R", "S(0) -> S(0)", "S(1) -> S(2)", "S(2) -> S(1)", "P -> P"}));
  EXPECT_EQ(strategyStrings(all, perm),
            (Strings{"R -> R", "S(0) -> S(1)", "S(1) -> S(2)", "S(2) -> S(0)", "P -> P"}));
  EXPECT_EQ(strategyStrings(all, ex), (Strings{"R -> R", "S(0) -> S(0)", "S(1) -> S(1)",
                                               "R -> S(2)", "S(3) -> S(3)", "P -> P"}));
}

TEST(TensorOps, ListConstructCatSplitUnpack) {
  Builder b;
  ValueId x = b.input("x", {4, 6});
  ValueId y = b.input("y", {4, 6});
  ValueId list = b.listOp("prim::ListConstruct", {x, y}, {{4, 6}, {4, 6}});
  NodeId lc = b.last();
  ValueId cat = b.op("aten::cat", {list, b.i(-1)}, {4, 12});
  NodeId catn = b.last();
  ValueId parts = b.listOp("aten::split.Tensor", {cat, b.i(4), b.i(1)}, {{4, 4}, {4, 4}, {4, 4}});
  NodeId split = b.last();
  b.multiOp("prim::ListUnpack", {parts}, {{4, 4}, {4, 4}, {4, 4}});
  NodeId unpack = b.last();
  auto all = enumerate(b.g, *mesh::DeviceMesh::parse("2"));
  EXPECT_EQ(strategyStrings(all, lc),
            (Strings{"R,R -> R", "S(0),S(0) -> S(0)", "S(1),S(1) -> S(1)", "P,P -> P"}));
  EXPECT_EQ(strategyStrings(all, catn), (Strings{"R -> R", "S(0) -> S(0)", "P -> P"}));
  EXPECT_EQ(strategyStrings(all, split), (Strings{"R -> R", "S(0) -> S(0)", "P -> P"}));
  EXPECT_EQ(strategyStrings(all, unpack), (Strings{"R -> R,R,R", "S(0) -> S(0),S(0),S(0)",
                                                   "S(1) -> S(1),S(1),S(1)", "P -> P,P,P"}));
}

// A Tensor[] of elements that broadcast (Hugging Face's mask build: index.Tensor with indices
// [B, 1, 1, 1] and [1, 1, S, 1]): the list cut in a dim where some element has size 1 holds that
// element whole (layout::elementPlacement), so ListConstruct reads it Replicate and index.Tensor
// gathers each rank's piece of the broadcast shape.
TEST(TensorOps, BroadcastingListElementsStayWholeUnderTheCut) {
  Builder b;
  ValueId self = b.input("mask", {4, 6});
  ValueId i0 = b.input("i0", {4, 1, 1, 1}, DType::kI64);
  ValueId i1 = b.input("i1", {1, 1, 6, 1}, DType::kI64);
  ValueId list =
      b.listOp("prim::ListConstruct", {i0, i1}, {{4, 1, 1, 1}, {1, 1, 6, 1}}, DType::kI64);
  NodeId lc = b.last();
  b.op("aten::index.Tensor", {self, list}, {4, 1, 6, 1});
  NodeId index = b.last();
  ValueId j0 = b.input("j0", {4, 1}, DType::kI64);
  ValueId j1 = b.input("j1", {1, 6}, DType::kI64);
  ValueId list2 = b.listOp("prim::ListConstruct", {j0, j1}, {{4, 1}, {1, 6}}, DType::kI64);
  b.op("aten::index.Tensor", {b.input("x", {4, 6, 8}), list2}, {4, 6, 8});
  NodeId index2 = b.last();
  // Indices of different ranks, and sizes that do not broadcast: no rule.
  ValueId k0 = b.input("k0", {4, 1}, DType::kI64);
  ValueId k1 = b.input("k1", {6}, DType::kI64);
  ValueId list3 = b.listOp("prim::ListConstruct", {k0, k1}, {{4, 1}, {6}}, DType::kI64);
  b.op("aten::index.Tensor", {self, list3}, {4, 6});
  NodeId ranks = b.last();
  ValueId m0 = b.input("m0", {4, 3}, DType::kI64);
  ValueId m1 = b.input("m1", {1, 6}, DType::kI64);
  ValueId list4 = b.listOp("prim::ListConstruct", {m0, m1}, {{4, 3}, {1, 6}}, DType::kI64);
  b.op("aten::index.Tensor", {self, list4}, {4, 6});
  NodeId clash = b.last();
  auto all = enumerate(b.g, *mesh::DeviceMesh::parse("2"));
  EXPECT_EQ(strategyStrings(all, lc),
            (Strings{"R,R -> R", "S(0),R -> S(0)", "R,S(2) -> S(2)", "P,P -> P"}));
  EXPECT_EQ(strategyStrings(all, index),
            (Strings{"R,R -> R", "R,S(0) -> S(0)", "R,S(2) -> S(2)", "P,R -> P"}));
  EXPECT_EQ(strategyStrings(all, index2), (Strings{"R,R -> R", "S(2),R -> S(2)", "R,S(0) -> S(0)",
                                                   "R,S(1) -> S(1)", "P,R -> P"}));
  for (NodeId n : {ranks, clash}) {
    for (const NodeStrategies& ns : all) {
      if (ns.node == n) {
        EXPECT_TRUE(ns.fallback) << "node " << n.v;
      }
    }
  }
  // On 2x2 the list cut twice in dim 0 still leaves the size-1 element whole.
  auto all22 = enumerate(b.g, *mesh::DeviceMesh::parse("2x2"));
  Strings lc22 = strategyStrings(all22, lc);
  EXPECT_NE(std::find(lc22.begin(), lc22.end(), "S(0)S(0),RR -> S(0)S(0)"), lc22.end());
}

TEST(TensorOps, SliceSelectIndexSelectTriu) {
  Builder b;
  ValueId x = b.input("x", {8, 16});
  b.op("aten::slice.Tensor", {x, b.i(1), b.i(0), b.i(8), b.i(1)}, {8, 8});
  NodeId part = b.last();
  b.op("aten::slice.Tensor", {x, b.i(1), b.i(0), b.i(std::numeric_limits<int64_t>::max()), b.i(1)},
       {8, 16});
  NodeId whole = b.last();
  b.op("aten::select.int", {x, b.i(0), b.i(3)}, {16});
  NodeId sel = b.last();
  ValueId idx = b.input("idx", {5}, DType::kI64);
  b.op("aten::index_select", {x, b.i(0), idx}, {5, 16});
  NodeId isel = b.last();
  b.op("aten::triu", {x, b.i(1)}, {8, 16});
  NodeId triu = b.last();
  auto all = enumerate(b.g, *mesh::DeviceMesh::parse("2"));
  EXPECT_EQ(strategyStrings(all, part), (Strings{"R -> R", "S(0) -> S(0)", "P -> P"}));
  EXPECT_EQ(strategyStrings(all, whole),
            (Strings{"R -> R", "S(0) -> S(0)", "S(1) -> S(1)", "P -> P"}));
  EXPECT_EQ(strategyStrings(all, sel), (Strings{"R -> R", "S(1) -> S(0)", "P -> P"}));
  EXPECT_EQ(strategyStrings(all, isel),
            (Strings{"R,R -> R", "S(1),R -> S(1)", "R,S(0) -> S(0)", "P,R -> P"}));
  EXPECT_EQ(strategyStrings(all, triu), (Strings{"R -> R", "P -> P"}));
}

TEST(TensorOps, NoPartialOfBoolOrAverageOfIntegers) {
  Builder b;
  ValueId ones = b.op("aten::ones", {b.ints({64, 64}), b.i(11), b.none(), b.str("cpu"), b.b(false)},
                      {64, 64}, DType::kBool, false);
  b.op("aten::triu", {ones, b.i(1)}, {64, 64}, DType::kBool, false);
  NodeId triu = b.last();
  ValueId i = b.input("i", {8, 16}, DType::kI64);
  b.op("aten::add.Tensor", {i, i, b.i(1)}, {8, 16}, DType::kI64);
  NodeId add = b.last();
  auto all = enumerate(b.g, *mesh::DeviceMesh::parse("2"));
  EXPECT_EQ(strategyStrings(all, triu), (Strings{"R -> R"}));
  EXPECT_EQ(strategyStrings(all, add),
            (Strings{"R,R -> R", "S(0),S(0) -> S(0)", "S(1),S(1) -> S(1)", "P,P -> P"}));
}

TEST(TensorOps, FactoriesReplicateOnly) {
  Builder b;
  b.op("aten::ones", {b.ints({64, 64}), b.i(11), b.none(), b.str("cpu"), b.b(false)}, {64, 64},
       DType::kBool, false);
  EXPECT_EQ(strategiesOf(b.g, b.last(), "2x2"), (Strings{" -> RR"}));
}

TEST(Loss, CrossEntropyBatchShardedMean) {
  Builder b;
  ValueId logits = b.input("logits", {512, 50257});
  ValueId target = b.input("target", {512}, DType::kI64);
  b.op("aten::cross_entropy_loss", {logits, target, b.none(), b.i(1), b.i(-100), b.f(0.0)}, {});
  EXPECT_EQ(strategiesOf(b.g, b.last(), "8"), (Strings{"R,R -> R", "S(0),S(0) -> P(avg)"}));
  // 512 over 3 ranks is uneven: no mean of means.
  EXPECT_EQ(strategiesOf(b.g, b.last(), "3"), (Strings{"R,R -> R"}));
  EnumerateOptions exact;
  exact.rules.loss_mean_partial = false;
  EXPECT_EQ(strategiesOf(b.g, b.last(), "8", exact), (Strings{"R,R -> R"}));
  Builder s;
  ValueId l2 = s.input("logits", {7, 10});
  ValueId t2 = s.input("target", {7}, DType::kI64);
  s.op("aten::nll_loss_nd", {l2, t2, s.none(), s.i(2), s.i(-100)}, {});
  EXPECT_EQ(strategiesOf(s.g, s.last(), "4"), (Strings{"R,R -> R", "S(0),S(0) -> P"}));
}

TEST(Conv, BatchOutputAndInputChannels) {
  Builder b;
  ValueId x = b.input("x", {8, 16, 8, 8});
  ValueId w = b.param("w", {32, 16, 3, 3});
  ValueId bias = b.param("b", {32});
  b.op("aten::_convolution",
       {x, w, bias, b.ints({1, 1}), b.ints({1, 1}), b.ints({1, 1}), b.b(false), b.ints({0, 0}),
        b.i(1), b.b(false), b.b(false), b.b(true), b.b(true)},
       {8, 32, 8, 8});
  EXPECT_EQ(strategiesOf(b.g, b.last(), "2"),
            (Strings{"R,R,R -> R", "S(0),R,R -> S(0)", "R,S(0),S(0) -> S(1)", "S(1),S(1),P -> P",
                     "P,R,P -> P"}));
  Builder g;
  ValueId gx = g.input("x", {8, 16, 8, 8});
  ValueId gw = g.param("w", {16, 1, 3, 3});
  g.op("aten::conv2d", {gx, gw, g.none(), g.ints({1, 1}), g.ints({1, 1}), g.ints({1, 1}), g.i(16)},
       {8, 16, 8, 8});
  EXPECT_EQ(strategiesOf(g.g, g.last(), "2"), (Strings{"R,R -> R", "S(0),R -> S(0)", "P,R -> P"}));
}

TEST(Conv, Pooling) {
  Builder b;
  ValueId x = b.input("x", {8, 16, 8, 8});
  b.op("aten::max_pool2d",
       {x, b.ints({2, 2}), b.ints({2, 2}), b.ints({0, 0}), b.ints({1, 1}), b.b(false)},
       {8, 16, 4, 4});
  NodeId mp = b.last();
  b.op("aten::adaptive_avg_pool2d", {x, b.ints({1, 1})}, {8, 16, 1, 1});
  NodeId ap = b.last();
  auto all = enumerate(b.g, *mesh::DeviceMesh::parse("2"));
  EXPECT_EQ(strategyStrings(all, mp), (Strings{"R -> R", "S(0) -> S(0)", "S(1) -> S(1)"}));
  EXPECT_EQ(strategyStrings(all, ap),
            (Strings{"R -> R", "S(0) -> S(0)", "S(1) -> S(1)", "P -> P"}));
}

TEST(Attention, ScaledDotProductAttention) {
  Builder b;
  ValueId q = b.input("q", {8, 4, 64, 16}), k = b.input("k", {8, 4, 64, 16}),
          v = b.input("v", {8, 4, 64, 16});
  b.op("aten::scaled_dot_product_attention", {q, k, v, b.none(), b.f(0.0), b.b(true)},
       {8, 4, 64, 16});
  EXPECT_EQ(strategiesOf(b.g, b.last(), "2"),
            (Strings{"R,R,R -> R", "S(0),S(0),S(0) -> S(0)", "S(1),S(1),S(1) -> S(1)"}));
}

TEST(Dropout, EvalIsIdentityTrainingHasNoPartial) {
  Builder b;
  ValueId x = b.input("x", {8, 16});
  b.op("aten::dropout", {x, b.f(0.1), b.b(false)}, {8, 16});
  NodeId eval = b.last();
  b.op("aten::dropout", {x, b.f(0.1), b.b(true)}, {8, 16});
  NodeId train = b.last();
  auto all = enumerate(b.g, *mesh::DeviceMesh::parse("2"));
  EXPECT_EQ(strategyStrings(all, eval),
            (Strings{"R -> R", "S(0) -> S(0)", "S(1) -> S(1)", "P -> P", "P(avg) -> P(avg)"}));
  EXPECT_EQ(strategyStrings(all, train), (Strings{"R -> R", "S(0) -> S(0)", "S(1) -> S(1)"}));
}

}  // namespace
}  // namespace apc::strategy::testing
