//===- tests/strategy/enumerate_test.cpp - Expansion, pruning, cache, speed -===//
//
// enumerate() as a whole: expansion counts on 2-d meshes, pruning of small dims, the Replicate
// fallback, registry lookup, determinism and cache transparency, compute costs, the sample-model
// blocks (no fallback for any of their ops, every rule output well formed, all-R first), and a
// timing of a LLaMA-3-8B-shaped graph on an 8x8 mesh.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>

#include "apc/layout/layout.h"
#include "apc/strategy/node_time.h"
#include "apc/strategy/rules.h"
#include "apc/strategy/strategy.h"
#include "builder.h"

namespace apc::strategy::testing {
namespace {

using Strings = std::vector<std::string>;

mesh::DeviceMesh meshOf(const char* text) {
  return *mesh::DeviceMesh::parse(text);
}

TEST(Expansion, ProductOverMeshDimsInOrder) {
  Builder b;
  ValueId x = b.input("x", {8, 8});
  b.op("aten::relu", {x}, {8, 8});
  // Single-dim: R, S(0), S(1); on 2x2 all 3 * 3 pairs, mesh dim 0 most significant.
  EXPECT_EQ(strategiesOf(b.g, b.last(), "2x2"),
            (Strings{"RR -> RR", "RS(0) -> RS(0)", "RS(1) -> RS(1)", "S(0)R -> S(0)R",
                     "S(0)S(0) -> S(0)S(0)", "S(0)S(1) -> S(0)S(1)", "S(1)R -> S(1)R",
                     "S(1)S(0) -> S(1)S(0)", "S(1)S(1) -> S(1)S(1)"}));
}

TEST(Expansion, CountsOnTwoByTwo) {
  Builder b;
  ValueId x = b.input("x", {8, 16, 32});
  ValueId w = b.param("w", {64, 32});
  b.op("aten::linear", {x, w, b.none()}, {8, 16, 64});
  // 6 single-dim strategies, all dims >= 4: 36 pairs, none pruned.
  EXPECT_EQ(strategiesOf(b.g, b.last(), "2x2").size(), 36u);
  EXPECT_EQ(strategiesOf(b.g, b.last(), "2x2x2").size(), 216u);
}

TEST(Pruning, DimsSmallerThanTheirPieceCount) {
  Builder b;
  ValueId x = b.input("x", {2, 8});
  b.op("aten::relu", {x}, {2, 8});
  Strings s = strategiesOf(b.g, b.last(), "2x2");
  EXPECT_EQ(s.size(), 8u);  // S(0)S(0) would cut a dim of 2 into 4
  EXPECT_EQ(std::count(s.begin(), s.end(), "S(0)S(0) -> S(0)S(0)"), 0);
  Builder c;
  ValueId y = c.input("y", {3, 8});
  c.op("aten::relu", {y}, {3, 8});
  EXPECT_EQ(strategiesOf(c.g, c.last(), "4"), (Strings{"R -> R", "S(1) -> S(1)"}));
  // 3 over 2 is uneven but allowed (pieces 2 and 1).
  EXPECT_EQ(strategiesOf(c.g, c.last(), "2"), (Strings{"R -> R", "S(0) -> S(0)", "S(1) -> S(1)"}));
}

TEST(Pruning, NoEmptyTorchChunkPieces) {
  // 4 over 3 is 2, 2, 0 and 5 over 4 is 2, 2, 1, 0: n >= p, yet a rank would hold nothing.
  Builder b;
  ValueId x = b.input("x", {4, 5, 7});
  b.op("aten::relu", {x}, {4, 5, 7});
  EXPECT_EQ(strategiesOf(b.g, b.last(), "3"),
            (Strings{"R -> R", "S(1) -> S(1)", "S(2) -> S(2)"}));  // 5: 2, 2, 1; 7: 3, 3, 1
  EXPECT_EQ(strategiesOf(b.g, b.last(), "4"),
            (Strings{"R -> R", "S(0) -> S(0)", "S(2) -> S(2)"}));  // 7: 2, 2, 2, 1
  // Nested: 7 over 2 is 4, 3; each over 2 is 2, 2 and 2, 1: fine. 5 over 2x2 is 3, 2 then 2, 1
  // and 1, 1: fine. 4 over 2x3: 2, 2 then 1, 1, 0: empty.
  Strings s = strategiesOf(b.g, b.last(), "2x2");
  EXPECT_NE(std::find(s.begin(), s.end(), "S(2)S(2) -> S(2)S(2)"), s.end());
  EXPECT_NE(std::find(s.begin(), s.end(), "S(1)S(1) -> S(1)S(1)"), s.end());
  Strings t = strategiesOf(b.g, b.last(), "2x3");
  EXPECT_EQ(std::find(t.begin(), t.end(), "S(0)S(0) -> S(0)S(0)"), t.end());
  // GPT-2's vocabulary on 8 and on 8x8.
  Builder v;
  ValueId w = v.param("wte", {50257, 48});
  v.op("aten::relu", {w}, {50257, 48});
  Strings vs = strategiesOf(v.g, v.last(), "8x8");
  EXPECT_NE(std::find(vs.begin(), vs.end(), "S(0)S(0) -> S(0)S(0)"), vs.end());
}

TEST(Pruning, NonCommutingPartialsOnOneTensor) {
  Builder b;
  ValueId x = b.input("x", {8, 16});
  b.op("aten::amax", {x, b.ints({1}), b.b(false)}, {8});
  Strings s = strategiesOf(b.g, b.last(), "2x2");
  // P(max) on both mesh dims is fine; P(max) never meets P(sum) here because amax has no sum.
  EXPECT_NE(std::find(s.begin(), s.end(), "S(1)S(1) -> P(max)P(max)"), s.end());
  Builder c;
  ValueId y = c.input("y", {8, 16});
  c.op("aten::mean.dim", {y, c.ints({1}), c.b(false), c.none()}, {8});
  Strings m = strategiesOf(c.g, c.last(), "2x2");
  EXPECT_NE(std::find(m.begin(), m.end(), "S(1)P -> P(avg)P"), m.end());  // avg and sum commute
}

TEST(Fallback, UnknownOpGetsOneReplicateStrategy) {
  Builder b;
  ValueId x = b.input("x", {8, 8});
  ValueId y = b.op("aten::frobnicate", {x, b.i(3)}, {8, 8});
  b.op("aten::relu", {y}, {8, 8});
  auto all = enumerate(b.g, meshOf("2x2"));
  ASSERT_EQ(all.size(), 2u);
  EXPECT_TRUE(all[0].fallback);
  EXPECT_FALSE(all[1].fallback);
  ASSERT_EQ(all[0].strategies.size(), 1u);
  EXPECT_EQ(all[0].strategies[0].toString(), "RR -> RR");
  EXPECT_FALSE(all[0].strategies[0].inputs[1].has_value());  // the int argument
  EXPECT_EQ(fallbackOps(b.g, all), (Strings{"aten::frobnicate"}));
}

TEST(Fallback, MalformedRuleOutputFallsBack) {
  Registry r;
  r.add("aten::relu", [](const RuleContext&) {
    DimStrategy s;  // no entries at all
    return std::vector<DimStrategy>{s};
  });
  Builder b;
  ValueId x = b.input("x", {8, 8});
  b.op("aten::relu", {x}, {8, 8});
  auto all = enumerate(b.g, meshOf("2"), r);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_TRUE(all[0].fallback);
  RuleContext c{b.g, b.g.node(b.last())};
  EXPECT_FALSE(checkDimStrategy(c, DimStrategy{}).ok());
}

TEST(Fallback, EveryStrategyPrunedFallsBack) {
  Registry r;  // a rule without the all-R strategy whose only strategy cannot fit
  r.add("aten::relu", [](const RuleContext& c) {
    return std::vector<DimStrategy>{DimStrategy{{Placement::shard(0)}, {Placement::shard(0)}, {}}};
  });
  Builder b;
  ValueId x = b.input("x", {1, 8});
  b.op("aten::relu", {x}, {1, 8});
  auto all = enumerate(b.g, meshOf("2"), r);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_TRUE(all[0].fallback);
  ASSERT_EQ(all[0].strategies.size(), 1u);
  EXPECT_EQ(all[0].strategies[0].toString(), "R -> R");
}

// `h[:, pos]` exports index.Tensor(h, [None, pos]): a list that is not a Tensor[] and has no
// placement. Its prim::ListConstruct is planned (not skipped as a size node), reading pos whole,
// so a batch-split pos is gathered on its edge instead of entering the list as a rank's piece;
// index cuts h along the None dim and after the indexed one, never through the list.
TEST(OptionalTensorLists, TheirTensorsAreReadWholeAndSelfIsCutOutsideTheIndexedDim) {
  Builder b;
  ValueId h = b.input("h", {8, 6, 16});
  ValueId idx = b.input("idx", {8}, ir::DType::kI64);
  ValueId pos = b.op("aten::remainder.Scalar", {idx, b.i(6)}, {8}, ir::DType::kI64);
  ir::Value list;
  list.type = ir::ValueType::kOther;
  list.debug_name = "indices";
  ValueId l = b.g.addValue(list);
  NodeId build = b.addOp("prim::ListConstruct", {b.none(), pos}, {l});
  b.op("aten::index.Tensor", {h, l}, {8, 8, 16});
  NodeId index = b.last();
  auto all = enumerate(b.g, meshOf("2"));
  const NodeStrategies* of_build = nullptr;
  const NodeStrategies* of_index = nullptr;
  for (const NodeStrategies& ns : all) {
    if (ns.node == build) of_build = &ns;
    if (ns.node == index) of_index = &ns;
  }
  ASSERT_NE(of_build, nullptr) << "the list's construction is not planned";
  EXPECT_FALSE(of_build->fallback);
  ASSERT_EQ(of_build->strategies.size(), 1u);
  EXPECT_EQ(of_build->strategies[0].inputs[1], mesh::replicated(1));
  EXPECT_FALSE(of_build->strategies[0].outputs[0].has_value());
  ASSERT_NE(of_index, nullptr);
  EXPECT_FALSE(of_index->fallback);
  Strings got;
  for (const Strategy& s : of_index->strategies) {
    EXPECT_FALSE(s.inputs[1].has_value()) << "the list has no placement: " << s.toString();
    got.push_back(s.toString());
  }
  EXPECT_EQ(got, (Strings{"R -> R", "S(0) -> S(0)", "S(2) -> S(2)", "P -> P"}));
  EXPECT_TRUE(fallbackOps(b.g, all).empty());
}

TEST(Registry, ExactOverloadFirstThenBareName) {
  Registry r;
  auto one = [](const RuleContext& c) {
    return std::vector<DimStrategy>{
        DimStrategy{{Placement::replicate()}, {Placement::replicate()}, {}}};
  };
  r.add("aten::add", one, cost::OpFamily::kPointwise);
  r.add("aten::add.Tensor", one, cost::OpFamily::kContraction);
  ir::Node n;
  n.op = "aten::add";
  n.overload = "Tensor";
  EXPECT_EQ(r.findEntry(n)->family, cost::OpFamily::kContraction);
  n.overload = "Scalar";
  EXPECT_EQ(r.findEntry(n)->family, cost::OpFamily::kPointwise);
  n.op = "aten::sub";
  EXPECT_EQ(r.find(n), nullptr);
  EXPECT_EQ(r.ops(), (Strings{"aten::add", "aten::add.Tensor"}));
  Strings ops = defaultRegistry().ops();
  EXPECT_TRUE(std::is_sorted(ops.begin(), ops.end()));
}

TEST(Determinism, SameResultTwiceAndWithoutCache) {
  Graph g = llamaModel(2, 4, 32, 64, 4, 2, 96, 1000);
  auto m = meshOf("2x4");
  auto a = enumerate(g, m);
  auto b = enumerate(g, m);
  EnumerateOptions nocache;
  nocache.use_cache = false;
  auto c = enumerate(g, m, defaultRegistry(), nocache);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), c.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].node, c[i].node);
    ASSERT_EQ(a[i].strategies.size(), c[i].strategies.size());
    for (size_t k = 0; k < a[i].strategies.size(); ++k) {
      EXPECT_EQ(a[i].strategies[k], b[i].strategies[k]);
      EXPECT_EQ(a[i].strategies[k], c[i].strategies[k]);
      EXPECT_EQ(a[i].strategies[k].compute_us, c[i].strategies[k].compute_us);
    }
  }
}

TEST(Sharing, NodesOfOneCacheEntryShareOneList) {
  // The layers' nodes hit the cache after the first layer and get its list itself (StrategyList):
  // shared exactly where the uncached lists are equal; without the cache nothing is shared.
  Graph g = llamaModel(3, 4, 32, 64, 4, 2, 96, 1000);
  auto m = meshOf("2x2");
  auto a = enumerate(g, m);
  EnumerateOptions nocache;
  nocache.use_cache = false;
  auto c = enumerate(g, m, defaultRegistry(), nocache);
  ASSERT_EQ(a.size(), c.size());
  std::map<const void*, size_t> first_with;
  std::set<const void*> uncached;
  size_t shared = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(uncached.insert(c[i].strategies.identity()).second) << i;
    auto [it, fresh] = first_with.emplace(a[i].strategies.identity(), i);
    if (fresh) continue;
    ++shared;
    EXPECT_EQ(c[i].strategies, c[it->second].strategies) << i << " shares " << it->second;
  }
  EXPECT_GT(shared, a.size() / 2);
}

TEST(Cost, ShardedContractionIsCheaperAndViewsAreFree) {
  Builder b;
  ValueId x = b.input("x", {8, 128, 1024});
  ValueId w = b.param("w", {4096, 1024});
  ValueId h = b.op("aten::linear", {x, w, b.none()}, {8, 128, 4096});
  NodeId lin = b.last();
  b.op("aten::view", {h, b.ints({8, 128, 32, 128})}, {8, 128, 32, 128});
  NodeId view = b.last();
  auto all = enumerate(b.g, meshOf("4"));
  const auto& ls = all[0].strategies;
  ASSERT_EQ(all[0].node, lin);
  ASSERT_GE(ls.size(), 4u);
  // 2 * 8*128 * 4096 * 1024 flops = 8.6 GFLOP in f32: compute bound; 4 ranks do a quarter each.
  EXPECT_GT(ls[0].compute_us, 0.0);
  for (size_t k = 1; k < ls.size(); ++k) {
    if (ls[k].outputs[0]->front().isPartial() && ls[k].inputs[0]->front().isPartial()) continue;
    EXPECT_NEAR(ls[k].compute_us, ls[0].compute_us / 4, ls[0].compute_us * 0.02)
        << ls[k].toString();
  }
  ASSERT_EQ(all[1].node, view);
  for (const auto& s : all[1].strategies) EXPECT_EQ(s.compute_us, 0.0);
}

// An op's backward is priced from what its autograd formula runs (OpInfo::backward_multiplier):
// of two binary ops moving the same bytes forward, mul (two products backward) costs three times
// add (the gradient passes through); of two unary ones, relu (a kernel reading the gradient and the
// result) 1.25 times neg (one pass over the gradient).
TEST(Cost, BackwardIsPricedFromTheOpsAutogradFormula) {
  Builder b;
  ValueId x = b.param("x", {8, 128, 1024});
  ValueId y = b.param("y", {8, 128, 1024});
  b.op("aten::mul", {x, y}, {8, 128, 1024});
  b.op("aten::add", {x, y, b.i(1)}, {8, 128, 1024});
  b.op("aten::relu", {x}, {8, 128, 1024});
  b.op("aten::neg", {x}, {8, 128, 1024});
  auto all = enumerate(b.g, meshOf("2"));
  std::map<std::string, double> replicated;
  for (const auto& ns : all) {
    const ir::Node& n = b.g.node(ns.node);
    if (n.kind == ir::NodeKind::kOp) replicated[n.op] = ns.strategies.at(0).compute_us;
  }
  ASSERT_EQ(replicated.size(), 4u);
  EXPECT_GT(replicated["aten::add"], 0.0);
  EXPECT_NEAR(replicated["aten::mul"], 3.0 * replicated["aten::add"], 1e-9);
  EXPECT_NEAR(replicated["aten::relu"], 1.25 * replicated["aten::neg"], 1e-9);
}

/// A CPU-like device whose host dispatch and kernels are both visible in the prices.
cost::CostModel dispatchingModel(const mesh::DeviceMesh& mesh) {
  cost::DeviceSpec d = cost::deviceByName("h100").value();
  d.dispatch_us = 10;
  d.dispatch_overlaps = false;
  d.view_dispatch_us = 3;
  return cost::CostModel(d, mesh);
}

/// The replicated price of each op node of `g` (the first strategy, all-R), by its output.
std::map<ValueId, double> replicatedPrices(const Graph& g, const mesh::DeviceMesh& mesh,
                                           const cost::CostModel& model) {
  EnumerateOptions o;
  o.cost_model = &model;
  std::map<ValueId, double> out;
  for (const auto& ns : enumerate(g, mesh, defaultRegistry(), o))
    out[g.node(ns.node).outputs.at(0)] = ns.strategies.at(0).compute_us;
  return out;
}

// What backward runs beyond a node's pass and its multiple of the forward kernel is priced as
// the kernels it is (each dispatched on its own): expand's gradient summed back to its input, the
// sum a broadcast operand's gradient needs, and the formula's kernels beyond its first. A cast to
// its own dtype costs what a view does.
TEST(Cost, BackwardPaysEveryKernelItLaunches) {
  const mesh::DeviceMesh mesh = meshOf("2");
  const cost::CostModel model = dispatchingModel(mesh);
  const double f32 = 4;
  auto elementwise = [&](double bytes) {
    return model.directKernelUs(
        model.computeUs(cost::OpFamily::kPointwise, 0, bytes, ir::DType::kF32));
  };
  // expand [64, 1] -> [64, 64]: a view forward, a sum backward; unsqueeze: a view both ways.
  Builder v;
  ValueId col = v.param("col", {64, 1});
  ValueId wide = v.op("aten::expand", {col, v.ints({64, 64}), v.b(false)}, {64, 64});
  ValueId flat = v.param("flat", {64});
  ValueId lifted = v.op("aten::unsqueeze", {flat, v.i(0)}, {1, 64});
  ValueId square = v.param("square", {64, 64});
  ValueId unexpanded = v.op("aten::expand", {square, v.ints({64, 64}), v.b(false)}, {64, 64});
  const auto pv = replicatedPrices(v.g, mesh, model);
  EXPECT_NEAR(pv.at(lifted), model.viewNodeUs(true), 1e-9);
  EXPECT_NEAR(pv.at(unexpanded), model.viewNodeUs(true), 1e-9);  // nothing expanded: no sum
  EXPECT_NEAR(pv.at(wide), model.viewNodeUs(true) + elementwise((64 + 64 * 64) * f32), 1e-9);

  // mul by a broadcast [64] weight against mul by a full [64, 64] one: the same forward, plus a
  // reduction of the [64, 64] gradient into [64] (the broadcast operand) backward.
  Builder m;
  ValueId x = m.param("x", {64, 64});
  ValueId w = m.param("w", {64});
  ValueId full = m.param("full", {64, 64});
  ValueId by_w = m.op("aten::mul", {x, w}, {64, 64});
  ValueId by_full = m.op("aten::mul", {x, full}, {64, 64});
  const auto pm = replicatedPrices(m.g, mesh, model);
  const double fwd_w = model.computeUs(cost::OpFamily::kPointwise, 64 * 64,
                                       (2 * 64 * 64 + 64) * f32, ir::DType::kF32);
  const double fwd_full =
      model.computeUs(cost::OpFamily::kPointwise, 64 * 64, 3 * 64 * 64 * f32, ir::DType::kF32);
  // mul's backward: twice its forward kernel (OpInfo::backward_multiplier), two kernels.
  EXPECT_NEAR(pm.at(by_full), model.nodeUs(fwd_full, 2 * fwd_full, true) + model.directKernelUs(0),
              1e-9);
  EXPECT_NEAR(pm.at(by_w),
              model.nodeUs(fwd_w, 2 * fwd_w, true) + model.directKernelUs(0) +
                  model.directKernelUs(model.computeUs(cost::OpFamily::kReduction, 0,
                                                       (64 * 64 + 64) * f32, ir::DType::kF32)),
              1e-9);

  // An op with its own measured curve: the forward from it, the backward the multiple of what
  // the family's curve prices (tanh_backward is a cheap pass over the saved result).
  cost::DeviceSpec with_tanh = model.device();
  with_tanh.op_curves["aten::tanh"] = cost::KernelCurve{{1e3, 1e6}, {50.0, 50000.0}};
  const cost::CostModel tanh_model(with_tanh, mesh);
  Builder a;
  ValueId z = a.param("z", {64, 64});
  ValueId th = a.op("aten::tanh", {z}, {64, 64});
  const double bytes = 2 * 64 * 64 * f32;
  const double family_fwd =
      tanh_model.computeUs(cost::OpFamily::kPointwise, 64 * 64, bytes, ir::DType::kF32);
  const double own_fwd = *tanh_model.opKernelUs("aten::tanh", bytes);
  EXPECT_GT(own_fwd, 10 * family_fwd);
  EXPECT_NEAR(replicatedPrices(a.g, mesh, tanh_model).at(th),
              tanh_model.nodeUs(own_fwd, 1.5 * family_fwd, true), 1e-9);

  // An index op's backward scatters what its forward gathered, at the forward's measured time:
  // under flat curves of 500 and 800 us the node's prices differ by 300 us forward and backward.
  Builder ix;
  ValueId table = ix.param("table", {8, 64, 64});
  ValueId rows = ix.input("rows", {32}, DType::kI64);
  ValueId index_list = ix.listOp("prim::ListConstruct", {rows}, {{32}}, DType::kI64);
  ValueId gathered = ix.op("aten::index.Tensor", {table, index_list}, {32, 64, 64});
  auto indexPrice = [&](double us) {
    cost::DeviceSpec d = model.device();
    d.op_curves["aten::index"] = cost::KernelCurve{{1.0, 1e12}, {us, us}};
    return replicatedPrices(ix.g, mesh, cost::CostModel(d, mesh)).at(gathered);
  };
  EXPECT_NEAR(indexPrice(800) - indexPrice(500), 2 * 300.0, 1e-9);

  // A linear reading a model input (no gradient) computes its weight's gradient only: one
  // product backward of the two, one kernel.
  Builder first, inner;
  ValueId first_out, inner_out;
  {
    ValueId x0 = first.input("x", {64, 64});
    ValueId w0 = first.param("w", {64, 64});
    first_out = first.op("aten::linear", {x0, w0, first.none()}, {64, 64});
    ValueId x1 = inner.param("x", {64, 64});
    ValueId w1 = inner.param("w", {64, 64});
    inner_out = inner.op("aten::linear", {x1, w1, inner.none()}, {64, 64});
  }
  const double mm = model.computeUs(cost::OpFamily::kContraction, 2.0 * 64 * 64 * 64,
                                    3 * 64 * 64 * f32, ir::DType::kF32);
  EXPECT_NEAR(replicatedPrices(inner.g, mesh, model).at(inner_out),
              model.nodeUs(mm, 2 * mm, true) + model.directKernelUs(0), 1e-9);
  EXPECT_NEAR(replicatedPrices(first.g, mesh, model).at(first_out), model.nodeUs(mm, mm, true),
              1e-9);

  // to(f32) of an f32 tensor returns it; to(bf16) runs a kernel.
  Builder t;
  ValueId y = t.param("y", {64, 64});
  ValueId same = t.op("aten::to", {y, t.i(6), t.b(false), t.b(false), t.none()}, {64, 64});
  ValueId half =
      t.op("aten::to", {y, t.i(15), t.b(false), t.b(false), t.none()}, {64, 64}, DType::kBF16);
  const auto pt = replicatedPrices(t.g, mesh, model);
  EXPECT_NEAR(pt.at(same), model.viewNodeUs(true), 1e-9);
  EXPECT_GT(pt.at(half), model.nodeUs(0, 0, true));
}

// A contraction pays its output's bytes at the device's matmul output rate beyond its flops:
// forward its result, backward the gradients of its matrix operands that take one. A vocabulary
// projection [512, 48] x [48, 4096] writes a result 85 times its input's size, and its backward
// writes only the operands' sizes.
TEST(Cost, ContractionsPayTheirOutputsBeyondTheFlops) {
  const mesh::DeviceMesh mesh = meshOf("2");
  const cost::CostModel plain = dispatchingModel(mesh);
  cost::DeviceSpec with_rate = plain.device();
  with_rate.matmul_output_gbps = 2.0;
  const cost::CostModel model(with_rate, mesh);
  const double f32 = 4;
  Builder b;
  ValueId x = b.param("x", {512, 48});
  ValueId w = b.param("w", {4096, 48});
  ValueId logits = b.op("aten::linear", {x, w, b.none()}, {512, 4096});
  ValueId frozen_in = b.input("frozen", {512, 48});
  ValueId first = b.op("aten::linear", {frozen_in, w, b.none()}, {512, 4096});
  const double mm = model.computeUs(cost::OpFamily::kContraction, 2.0 * 512 * 48 * 4096,
                                    (512 * 48 + 4096 * 48 + 512 * 4096) * f32, ir::DType::kF32);
  const double out_us = 512 * 4096 * f32 / 2e3, x_us = 512 * 48 * f32 / 2e3,
               w_us = 4096 * 48 * f32 / 2e3;
  EXPECT_DOUBLE_EQ(model.matmulOutputUs(512 * 4096 * f32), out_us);
  EXPECT_EQ(plain.matmulOutputUs(512 * 4096 * f32), 0.0);  // not measured: nothing
  const auto priced = replicatedPrices(b.g, mesh, model);
  EXPECT_NEAR(priced.at(logits),
              model.nodeUs(mm + out_us, 2 * mm + x_us + w_us, true) + model.directKernelUs(0),
              1e-6);
  // An operand that takes no gradient writes none backward.
  EXPECT_NEAR(priced.at(first), model.nodeUs(mm + out_us, mm + w_us, true), 1e-6);
  // The same graph without the rate: the flops alone.
  EXPECT_NEAR(replicatedPrices(b.g, mesh, plain).at(logits),
              plain.nodeUs(mm, 2 * mm, true) + plain.directKernelUs(0), 1e-6);
}

// A product with a dim of one runs as a matrix-vector or outer product, priced by its bytes at the
// device's rates: a batched matvec [16,256,64] x [16,64,1] (a batched_mm expert) reads its
// matrices forward, and backward writes the matrices' gradient (an outer product per matrix) and
// reads them again for the vector's (a transposed matvec); each at least its GEMM price. A product
// with no dim of one, or a device without the rates, is priced as before.
TEST(Cost, ProductsWithADimOfOneAreMatrixVectorOrOuterProducts) {
  const mesh::DeviceMesh mesh = meshOf("2");
  const cost::CostModel plain = dispatchingModel(mesh);
  cost::DeviceSpec with_rates = plain.device();
  with_rates.matvec_gbps = 0.5;
  with_rates.outer_product_gbps = 0.25;
  const cost::CostModel model(with_rates, mesh);
  const double f32 = 4, matrices = 16.0 * 256 * 64 * f32;
  Builder b;
  ValueId w = b.param("w", {16, 256, 64});
  ValueId v = b.param("v", {16, 64, 1});
  ValueId mv = b.op("aten::bmm", {w, v}, {16, 256, 1});
  ValueId frozen = b.input("frozen", {16, 64, 1});
  ValueId mv_frozen = b.op("aten::bmm", {w, frozen}, {16, 256, 1});
  ValueId u = b.param("u", {16, 64, 64});
  ValueId mm = b.op("aten::bmm", {w, u}, {16, 256, 64});
  const double read_us = matrices / 0.5e3, write_us = matrices / 0.25e3;
  EXPECT_DOUBLE_EQ(*model.matvecUs(matrices), read_us);
  EXPECT_DOUBLE_EQ(*model.outerProductUs(matrices), write_us);
  EXPECT_FALSE(plain.matvecUs(matrices));
  const auto priced = replicatedPrices(b.g, mesh, model);
  EXPECT_NEAR(priced.at(mv),
              model.nodeUs(read_us, write_us + read_us, true) + model.directKernelUs(0), 1e-6);
  // The vector takes no gradient: backward writes the matrices' gradient only.
  EXPECT_NEAR(priced.at(mv_frozen), model.nodeUs(read_us, write_us, true), 1e-6);
  // A batched GEMM keeps the flops' price; without the rates the matvec does too.
  EXPECT_NEAR(priced.at(mm), replicatedPrices(b.g, mesh, plain).at(mm), 1e-9);
  const double gemv = plain.computeUs(cost::OpFamily::kContraction, 2.0 * 16 * 256 * 64,
                                      (16 * 256 * 64 + 16 * 64 + 16 * 256) * f32, ir::DType::kF32);
  EXPECT_NEAR(replicatedPrices(b.g, mesh, plain).at(mv),
              plain.nodeUs(gemv, 2 * gemv, true) + plain.directKernelUs(0), 1e-6);
  EXPECT_GT(priced.at(mv), 10 * replicatedPrices(b.g, mesh, plain).at(mv));
}

// A convolution pays its local weight's bytes beyond its flops at the device's rates
// (DeviceSpec::conv_weight_gbps forward, conv_weight_grad_gbps backward where the weight takes a
// gradient); a frozen weight pays the forward's only, and a device without the rates prices the
// flops alone. Under tp's Shard(0) weight the term halves with the weight.
TEST(Cost, ConvolutionsPayTheirWeightBeyondTheirFlops) {
  const mesh::DeviceMesh mesh = meshOf("2");
  const cost::CostModel plain = dispatchingModel(mesh);
  cost::DeviceSpec with_rates = plain.device();
  with_rates.conv_weight_gbps = 8;
  with_rates.conv_weight_grad_gbps = 2;
  const cost::CostModel model(with_rates, mesh);
  const double weight_bytes = 256.0 * 256 * 9 * 4;
  Builder b;
  ValueId x = b.param("x", {4, 256, 2, 2});
  ValueId w = b.param("w", {256, 256, 3, 3});
  auto conv = [&](ValueId in, ValueId weight) {
    return b.op("aten::conv2d",
                {in, weight, b.none(), b.ints({1, 1}), b.ints({1, 1}), b.ints({1, 1}), b.i(1)},
                {4, 256, 2, 2});
  };
  ValueId trained = conv(x, w);
  ValueId frozen_w = b.input("frozen_w", {256, 256, 3, 3});
  ValueId frozen = conv(x, frozen_w);
  const auto priced = replicatedPrices(b.g, mesh, model);
  const auto flops_only = replicatedPrices(b.g, mesh, plain);
  const double fwd_us = weight_bytes / 8e3, bwd_us = weight_bytes / 2e3;
  EXPECT_DOUBLE_EQ(model.convWeightUs(weight_bytes, false), fwd_us);
  EXPECT_DOUBLE_EQ(model.convWeightUs(weight_bytes, true), bwd_us);
  EXPECT_EQ(plain.convWeightUs(weight_bytes, true), 0.0);
  EXPECT_NEAR(priced.at(trained) - flops_only.at(trained), fwd_us + bwd_us, 1e-6);
  EXPECT_NEAR(priced.at(frozen) - flops_only.at(frozen), fwd_us, 1e-6);
  // The strategy that cuts the weight's output channels pays half of it.
  EnumerateOptions o;
  o.cost_model = &model;
  EnumerateOptions p;
  p.cost_model = &plain;
  const auto all = enumerate(b.g, mesh, defaultRegistry(), o);
  const auto all_plain = enumerate(b.g, mesh, defaultRegistry(), p);
  bool found = false;
  for (size_t i = 0; i < all.size(); ++i) {
    if (b.g.node(all[i].node).outputs.at(0) != trained) continue;
    for (size_t k = 0; k < all[i].strategies.size(); ++k) {
      const Strategy& st = all[i].strategies[k];
      if (!st.inputs.at(1) || !(*st.inputs.at(1))[0].isShard(0)) continue;
      found = true;
      EXPECT_NEAR(st.compute_us - all_plain[i].strategies[k].compute_us, (fwd_us + bwd_us) / 2,
                  1e-6);
    }
  }
  EXPECT_TRUE(found);
}

// apc calibrate --model's samples: one per distinct (op, local input shapes, constants) that a
// node's strategies run, views left out; a strategy whose key the device measured costs its
// measured passes, the others what they cost without.
TEST(Cost, MeasuredNodesReplaceTheirPrice) {
  const mesh::DeviceMesh mesh = meshOf("2");
  const cost::CostModel plain = dispatchingModel(mesh);
  Builder b;
  ValueId x = b.input("x", {8, 64});
  ValueId w = b.param("w", {32, 64});
  ValueId y = b.op("aten::linear", {x, w, b.none()}, {8, 32});
  ValueId yt = b.op("aten::t", {y}, {32, 8});
  b.op("aten::relu", {yt}, {32, 8});
  EnumerateOptions po;
  po.cost_model = &plain;
  const auto all_plain = enumerate(b.g, mesh, defaultRegistry(), po);
  const std::vector<NodeSample> samples = nodeSamples(b.g, mesh, all_plain);
  std::set<std::string> keys;
  for (const NodeSample& s : samples) {
    EXPECT_TRUE(keys.insert(s.key).second) << s.key;  // distinct
    EXPECT_EQ(b.g.node(s.node).op == "aten::t", false) << s.key;
    // The sample's shapes give its key back.
    EXPECT_EQ(nodeTimeKey(b.g, b.g.node(s.node), s.local_inputs), s.key);
  }
  EXPECT_TRUE(
      std::is_sorted(samples.begin(), samples.end(),
                     [](const NodeSample& a, const NodeSample& c) { return a.key < c.key; }));
  const std::string replicated = "aten::linear(f32[8,64], f32[32,64]g, None)";
  for (const std::string& k :
       {replicated, std::string("aten::linear(f32[4,64], f32[32,64]g, None)"),
        std::string("aten::linear(f32[8,64], f32[16,64]g, None)"),
        std::string("aten::relu(f32[32,8]g)"), std::string("aten::relu(f32[16,8]g)")})
    EXPECT_TRUE(keys.count(k)) << k << " not among the samples";

  cost::DeviceSpec d = plain.device();
  d.node_us[replicated] = {100, 250};
  const cost::CostModel measured(d, mesh);
  EnumerateOptions mo;
  mo.cost_model = &measured;
  const auto all = enumerate(b.g, mesh, defaultRegistry(), mo);
  ASSERT_EQ(all.size(), all_plain.size());
  int replaced = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const ir::Node& n = b.g.node(all[i].node);
    ASSERT_EQ(all[i].strategies.size(), all_plain[i].strategies.size()) << n.op;
    for (size_t k = 0; k < all[i].strategies.size(); ++k) {
      const Strategy& st = all[i].strategies[k];
      LocalShapes local;
      local.inputs.resize(n.inputs.size());
      for (size_t j = 0; j < n.inputs.size(); ++j)
        if (st.inputs[j])
          local.inputs[j].push_back(
              layout::maxLocalSizes(*b.g.value(n.inputs[j]).tensor, *st.inputs[j], mesh));
      if (nodeTimeKey(b.g, n, local.inputs) == replicated) {
        ++replaced;
        EXPECT_DOUBLE_EQ(st.compute_us, 350.0);
        EXPECT_NE(all_plain[i].strategies[k].compute_us, 350.0);
      } else {
        EXPECT_DOUBLE_EQ(st.compute_us, all_plain[i].strategies[k].compute_us) << st.toString();
      }
    }
  }
  EXPECT_GE(replaced, 1);
  // A size computed in the graph is no constant: such a node has no key.
  Builder s;
  ValueId in = s.input("in", {8, 64});
  ir::Value computed;
  computed.type = ValueType::kInt;
  computed.debug_name = "n";
  computed.producer = s.g.node(ir::NodeId{0}).id;  // not a graph-level constant
  ValueId n0 = s.g.addValue(computed);
  s.addOp("aten::sum.dim_IntList", {in, n0}, {s.tensor("out", {64})});
  EXPECT_FALSE(nodeTimeKey(s.g, s.g.node(s.last()), {{{8, 64}}, {}}).has_value());
}

/// Every node of a graph: enumerated without fallback, all-R first, every rule output well
/// formed; returns the number of enumerated nodes.
size_t checkGraph(const Graph& g, const char* mesh_text) {
  auto all = enumerate(g, meshOf(mesh_text));
  EXPECT_EQ(fallbackOps(g, all), Strings{}) << g.name;
  for (const auto& ns : all) {
    const ir::Node& n = g.node(ns.node);
    EXPECT_FALSE(ns.strategies.empty()) << n.qualifiedOp();
    if (ns.strategies.empty()) continue;
    const Strategy& first = ns.strategies.front();
    for (const auto& list : {first.inputs, first.outputs}) {
      for (const auto& t : list) {
        if (!t) continue;
        for (const Placement& p : *t) EXPECT_TRUE(p.isReplicate()) << n.qualifiedOp();
      }
    }
    RuleContext c{g, n};
    const Rule* rule = defaultRegistry().find(n);
    if (!rule) continue;
    for (const DimStrategy& d : (*rule)(c)) {
      Status st = checkDimStrategy(c, d);
      EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().message());
    }
  }
  return all.size();
}

TEST(Samples, Gpt2BlockHasNoFallback) {
  Graph g = gpt2Block(8, 64, 48, 4, 50257);
  EXPECT_GT(checkGraph(g, "8"), 30u);
  checkGraph(g, "2x4");
  // The vocabulary-sharded head and the batch-sharded loss exist on 8 ranks.
  auto all = enumerate(g, meshOf("8"));
  bool head = false, loss = false;
  for (const auto& ns : all) {
    const ir::Node& n = g.node(ns.node);
    for (const auto& s : ns.strategies) {
      if (n.op == "aten::linear" && s.toString() == "R,S(0) -> S(2)" &&
          g.value(n.outputs[0]).tensor->shape.back().size == 50257)
        head = true;
      if (n.op == "aten::cross_entropy_loss" && s.toString() == "S(0),S(0) -> P(avg)") loss = true;
    }
  }
  EXPECT_TRUE(head);
  EXPECT_TRUE(loss);
}

TEST(Samples, LlamaAndCnnHaveNoFallback) {
  checkGraph(llamaModel(2, 8, 128, 64, 4, 2, 160, 1000), "2x2");
  checkGraph(cnnSmall(), "2");
  checkGraph(cnnSmall(), "2x4");
}

TEST(Speed, Llama3_8bOnEightByEight) {
  // LLaMA-3-8B's shapes: 32 layers, dim 4096, 32 heads, 8 KV heads, FFN 14336, vocab 128256;
  // batch 8, sequence 128 as `apc inspect --input tokens:i64[8,128]`.
  Graph g = llamaModel(32, 8, 128, 4096, 32, 8, 14336, 128256);
  auto m = meshOf("8x8");
  auto t0 = std::chrono::steady_clock::now();
  auto all = enumerate(g, m);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  size_t total = 0;
  for (const auto& ns : all) total += ns.strategies.size();
  std::printf("[ speed    ] llama3_8b-shaped: %zu nodes, %zu enumerated, %zu strategies, %.3f s\n",
              g.numNodes(), all.size(), total, s);
  EXPECT_EQ(fallbackOps(g, all), Strings{});
  EXPECT_LT(s, 1.0);
}

}  // namespace
}  // namespace apc::strategy::testing
