//===- tests/strategy/token_local_test.cpp - Token-local regions of grouped MoE layers ===//
//
// findTokenLocalRegions and the region strategies enumerate appends (apc/strategy/token_local.h)
// on a hand-built copy of Hugging Face's grouped_mm experts forward (transformers 5.x moe.py, as
// torch.export records it for Mixtral): which nodes are members, which values are cut, the exact
// region strategies, and the variants that are not token-local and must get none. That the
// region computes what the model does is the differential tests' part (tests/runtime/moe_test.cpp
// trains the grouped_mm samples under ddp and fsdp plans that take the region).
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <algorithm>

#include "apc/strategy/token_local.h"
#include "builder.h"

namespace apc::strategy::testing {
namespace {

using Strings = std::vector<std::string>;

/// What to change in the experts forward (each makes it not token-local).
enum class Variant {
  kModel,             // as exported
  kSortedIdsOut,      // the sorted expert ids are also a graph output
  kScanOverPairs,     // a cumsum along the pairs (a global prefix) feeds the expert rows
  kNoInversePermute,  // the rows are put back by the permutation itself, not its inverse
  kBiasAfterExperts,  // a per-expert bias added after the last grouped matmul (GPT-OSS): still
                      // token-local, but not cut by experts (every rank would add it)
};

/// The experts forward on N tokens of hidden size H with top-k of E experts (intermediate I).
struct ExpertsGraph {
  Builder b;
  NodeId sort, histc, cumsum, gmm1, exit, after;
  ValueId hidden, gate_up;
};

ExpertsGraph expertsGraph(Variant variant = Variant::kModel, int64_t n = 8) {
  const int64_t k = 2, h = 4, e = 4, i = 6, s = n * k;
  ExpertsGraph x;
  Builder& b = x.b;
  using D = DType;
  ValueId in = b.input("x", {n, h});
  ValueId router = b.param("router", {e, h});
  x.gate_up = b.param("gate_up", {e, 2 * i, h});
  ValueId down = b.param("down", {e, h, i});
  x.hidden = b.op("aten::mul.Tensor", {in, b.f(1.0)}, {n, h});
  ValueId logits = b.op("aten::linear", {x.hidden, router, b.none()}, {n, e});
  ValueId probs = b.op("aten::softmax.int", {logits, b.i(-1), b.none()}, {n, e});
  std::vector<ValueId> top =
      b.g.node(b.addOp("aten::topk", {probs, b.i(k), b.i(-1), b.b(true), b.b(true)},
                       {b.tensor("tw", {n, k}, D::kF32, true), b.tensor("ti", {n, k}, D::kI64)}))
          .outputs;
  ValueId weights = b.op("aten::reshape", {top[0], b.ints({-1})}, {s});
  ValueId ids = b.op("aten::reshape", {top[1], b.ints({-1})}, {s}, D::kI64, false);
  std::vector<ValueId> sorted = {b.tensor("sorted", {s}, D::kI64), b.tensor("perm", {s}, D::kI64)};
  x.sort = b.addOp("aten::sort", {ids, b.i(-1), b.b(false)}, sorted);
  ValueId token = b.op("aten::floor_divide", {sorted[1], b.i(k)}, {s}, D::kI64, false);
  if (variant == Variant::kScanOverPairs)
    token = b.op("aten::cumsum", {token, b.i(0), b.none()}, {s}, D::kI64, false);
  ValueId token_list = b.listOp("prim::ListConstruct", {token}, {{s}}, D::kI64);
  ValueId rows = b.op("aten::index.Tensor", {x.hidden, token_list}, {s, h});
  ValueId perm_list = b.listOp("prim::ListConstruct", {sorted[1]}, {{s}}, D::kI64);
  ValueId row_weights = b.op("aten::index.Tensor", {weights, perm_list}, {s});
  ValueId fids = b.op("aten::to.dtype", {sorted[0], b.i(6), b.b(false), b.b(false), b.none()}, {s},
                      D::kF32, false);
  ValueId counts = b.op("aten::histc", {fids, b.i(e), b.i(0), b.i(e - 1)}, {e}, D::kF32, false);
  x.histc = b.last();
  ValueId offs = b.op("aten::cumsum", {counts, b.i(0), b.i(3)}, {e}, D::kI32, false);
  x.cumsum = b.last();
  ValueId w1 = b.op("aten::transpose.int", {x.gate_up, b.i(-2), b.i(-1)}, {e, h, 2 * i});
  ValueId up = b.op("aten::_grouped_mm", {rows, w1, offs, b.none(), b.none()}, {s, 2 * i});
  x.gmm1 = b.last();
  ValueId halves = b.listOp("aten::chunk", {up, b.i(2), b.i(-1)}, {{s, i}, {s, i}});
  std::vector<ValueId> parts = b.multiOp("prim::ListUnpack", {halves}, {{s, i}, {s, i}});
  ValueId act =
      b.op("aten::mul.Tensor", {b.op("aten::silu", {parts[0]}, {s, i}), parts[1]}, {s, i});
  ValueId w2 = b.op("aten::transpose.int", {down, b.i(-2), b.i(-1)}, {e, i, h});
  ValueId out = b.op("aten::_grouped_mm", {act, w2, offs, b.none(), b.none()}, {s, h});
  if (variant == Variant::kBiasAfterExperts) {
    ValueId bias = b.param("bias", {e, h});
    ValueId expert_list = b.listOp("prim::ListConstruct", {sorted[0]}, {{s}}, D::kI64);
    ValueId per_row = b.op("aten::index.Tensor", {bias, expert_list}, {s, h});
    out = b.op("aten::add.Tensor", {out, per_row, b.i(1)}, {s, h});
  }
  ValueId scaled = b.op("aten::mul.Tensor",
                        {out, b.op("aten::unsqueeze", {row_weights, b.i(-1)}, {s, 1})}, {s, h});
  ValueId back_index = sorted[1];
  if (variant != Variant::kNoInversePermute) {
    ValueId empty =
        b.op("aten::empty_like", {sorted[1], b.none(), b.none(), b.none(), b.b(false), b.none()},
             {s}, D::kI64, false);
    ValueId positions = b.op("aten::arange", {b.i(s), b.none(), b.none(), b.str("cpu"), b.b(false)},
                             {s}, D::kI64, false);
    ValueId put_list = b.listOp("prim::ListConstruct", {sorted[1]}, {{s}}, D::kI64);
    back_index =
        b.op("aten::index_put", {empty, put_list, positions, b.b(false)}, {s}, D::kI64, false);
  }
  ValueId back_list = b.listOp("prim::ListConstruct", {back_index}, {{s}}, D::kI64);
  ValueId pairs = b.op("aten::index.Tensor", {scaled, back_list}, {s, h});
  x.exit = b.last();
  ValueId per_token = b.op("aten::view", {pairs, b.ints({n, k, h})}, {n, k, h});
  ValueId y = b.op("aten::sum.dim_IntList", {per_token, b.ints({1}), b.b(false), b.none()}, {n, h});
  x.after = b.last();
  ir::OutputTree t = ir::OutputTree::makeLeaf(y);
  if (variant == Variant::kSortedIdsOut) {
    t.kind = ir::OutputTree::Kind::kTuple;
    t.children = {ir::OutputTree::makeLeaf(y), ir::OutputTree::makeLeaf(sorted[0])};
  }
  b.g.setOutputs(t);
  return x;
}

bool isRegionLocal(const std::string& s) {
  return s.find("(token-local #") != std::string::npos;
}

Strings regionStrategies(const Graph& g, NodeId n, const std::string& mesh) {
  Strings all = strategiesOf(g, n, mesh), out;
  for (const std::string& s : all)
    if (isRegionLocal(s)) out.push_back(s);
  return out;
}

TEST(TokenLocal, FindsTheGroupedExpertsRegion) {
  ExpertsGraph x = expertsGraph();
  ASSERT_TRUE(x.b.g.verify().ok());
  std::vector<TokenLocalRegion> regions = findTokenLocalRegions(x.b.g);
  ASSERT_EQ(regions.size(), 1u);
  const TokenLocalRegion& r = regions[0];
  EXPECT_EQ(r.root, x.sort);
  EXPECT_EQ(r.exit, x.exit);
  EXPECT_EQ(r.pairs, 16);
  EXPECT_EQ(r.tokens, 8);
  auto member = [&](NodeId n) {
    return std::find(r.members.begin(), r.members.end(), n) != r.members.end();
  };
  EXPECT_TRUE(member(x.histc) && member(x.cumsum) && member(x.gmm1) && member(x.exit));
  EXPECT_FALSE(member(x.after));  // the exit's consumers are ordinary nodes
  // The token rows come in cut; the expert weights (a transpose of a parameter) whole; the counts
  // and offsets are the rank's own, whole.
  EXPECT_TRUE(r.cut.at(x.hidden.v));
  const ir::Node& gmm = x.b.g.node(x.gmm1);
  EXPECT_TRUE(r.cut.at(gmm.inputs[0].v));
  EXPECT_FALSE(r.cut.at(gmm.inputs[1].v));
  EXPECT_FALSE(r.cut.at(gmm.inputs[2].v));
  EXPECT_FALSE(r.cut.at(x.b.g.node(x.histc).outputs[0].v));

  // The expert cut: 4 experts; the grouped matmuls' outputs on to the exit Partial there, their
  // weights (transposed parameters) S(0).
  EXPECT_EQ(r.experts, 4);
  EXPECT_TRUE(r.expert_rows.count(gmm.outputs[0].v));
  EXPECT_TRUE(r.expert_rows.count(x.b.g.node(x.exit).outputs[0].v));
  EXPECT_FALSE(r.expert_rows.count(gmm.inputs[0].v));
  EXPECT_TRUE(r.expert_weights.count(gmm.inputs[1].v));
  EXPECT_EQ(r.expert_weights.size(), 2u);

  // After the rule's own: one variant per set of mesh dims that cuts the 8 tokens evenly, then
  // per mesh dim that cuts the 4 experts evenly, one per token cut of the other dims.
  EXPECT_EQ(regionStrategies(x.b.g, x.sort, "2"),
            (Strings{"S(0) -> S(0),S(0) (token-local #1)", "R -> R,R (token-local #2)"}));
  EXPECT_EQ(regionStrategies(x.b.g, x.histc, "2"),
            (Strings{"S(0) -> R (token-local #1)", "R -> R (token-local #2)"}));
  EXPECT_EQ(regionStrategies(x.b.g, x.gmm1, "2"),
            (Strings{"S(0),R,R -> S(0) (token-local #1)", "R,S(0),R -> P (token-local #2)"}));
  EXPECT_EQ(regionStrategies(x.b.g, x.exit, "4"),
            (Strings{"S(0),S(0) -> S(0) (token-local #1)", "P,R -> P (token-local #2)"}));
  EXPECT_EQ(
      regionStrategies(x.b.g, x.gmm1, "2x2"),
      (Strings{"S(0)R,RR,RR -> S(0)R (token-local #1)", "RS(0),RR,RR -> RS(0) (token-local #2)",
               "S(0)S(0),RR,RR -> S(0)S(0) (token-local #3)", "RR,S(0)R,RR -> PR (token-local #4)",
               "RS(0),S(0)R,RR -> PS(0) (token-local #5)", "RR,RS(0),RR -> RP (token-local #6)",
               "S(0)R,RS(0),RR -> S(0)P (token-local #7)"}));
  Strings all = strategiesOf(x.b.g, x.sort, "2");
  ASSERT_FALSE(all.empty());
  EXPECT_TRUE(isRegionLocal(all.back()));
  EXPECT_FALSE(isRegionLocal(all.front()));
  // 8 tokens and 4 experts do not cut into 3 equal pieces: no region strategy (on any member).
  EXPECT_TRUE(regionStrategies(x.b.g, x.sort, "3").empty());
  EXPECT_TRUE(regionStrategies(x.b.g, x.exit, "3").empty());
  EXPECT_EQ(regionStrategies(x.b.g, x.sort, "2x3"),
            (Strings{"S(0)R -> S(0)R,S(0)R (token-local #1)", "RR -> RR,RR (token-local #2)"}));
  // Nodes outside the region get none.
  EXPECT_TRUE(regionStrategies(x.b.g, x.after, "2").empty());
}

TEST(TokenLocal, DeclinesWhatIsNotTokenLocal) {
  for (Variant v : {Variant::kSortedIdsOut, Variant::kScanOverPairs, Variant::kNoInversePermute}) {
    ExpertsGraph x = expertsGraph(v);
    SCOPED_TRACE(static_cast<int>(v));
    ASSERT_TRUE(x.b.g.verify().ok());
    EXPECT_TRUE(findTokenLocalRegions(x.b.g).empty());
    EXPECT_TRUE(regionStrategies(x.b.g, x.sort, "2").empty());
  }
  // The model itself is found (the variants differ from it in one thing only).
  EXPECT_EQ(findTokenLocalRegions(expertsGraph().b.g).size(), 1u);
}

TEST(TokenLocal, NoExpertCutWhereTheCombineIsNotLinear) {
  // A bias added to the last grouped matmul's rows: each rank would add it to the zero rows of
  // the other ranks' experts too. The region stays token-local, without the expert cut.
  ExpertsGraph x = expertsGraph(Variant::kBiasAfterExperts);
  ASSERT_TRUE(x.b.g.verify().ok());
  std::vector<TokenLocalRegion> regions = findTokenLocalRegions(x.b.g);
  ASSERT_EQ(regions.size(), 1u);
  EXPECT_EQ(regions[0].experts, 0);
  EXPECT_EQ(regionStrategies(x.b.g, x.gmm1, "2"), (Strings{"S(0),R,R -> S(0) (token-local #1)"}));
}

}  // namespace
}  // namespace apc::strategy::testing
