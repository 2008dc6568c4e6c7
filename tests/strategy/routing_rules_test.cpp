//===- tests/strategy/routing_rules_test.cpp - Exact strategies of the MoE ops ===//
//
// The mixture-of-experts rules (lib/strategy/routing.cpp) on hand-built nodes: the exact list of
// strategies on a 1-d mesh of 2, derived from the op's semantics in the comments, and the cases
// where a rule must decline a cut (a data-dependent histc range, a bincount of unknown length,
// the group dim of _grouped_mm). Each strategy's correctness is executed by the strategy
// validator (tests/strategy_validator, HandBuiltOpCasesMatchTheUnshardedOp).
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include "apc/strategy/strategy.h"
#include "builder.h"

namespace apc::strategy::testing {
namespace {

using Strings = std::vector<std::string>;

/// An op node with tensor outputs of the given shapes and dtypes; returns the node.
NodeId node(Builder& b, const std::string& op, std::vector<ValueId> ins,
            std::vector<std::pair<std::vector<int64_t>, DType>> outs) {
  std::vector<ValueId> vs;
  for (auto& [shape, dt] : outs) vs.push_back(b.tensor("o", shape, dt, true));
  return b.addOp(op, std::move(ins), std::move(vs));
}

Strings on2(const Builder& b, NodeId n) {
  return strategyStrings(enumerate(b.g, *mesh::DeviceMesh::parse("2")), n);
}

TEST(Routing, TopkSortArgsortCutEveryDimButTheOrderedOne) {
  Builder b;
  ValueId x = b.input("x", {8, 6, 4});
  NodeId topk = node(b, "aten::topk", {x, b.i(2), b.i(-1), b.b(true), b.b(true)},
                     {{{8, 6, 2}, DType::kF32}, {{8, 6, 2}, DType::kI64}});
  NodeId sort = node(b, "aten::sort.stable", {x, b.b(true), b.i(1), b.b(false)},
                     {{{8, 6, 4}, DType::kF32}, {{8, 6, 4}, DType::kI64}});
  NodeId argsort = node(b, "aten::argsort", {x, b.i(0), b.b(false)}, {{{8, 6, 4}, DType::kI64}});
  // No Partial: ordering is not linear.
  EXPECT_EQ(on2(b, topk), (Strings{"R -> R,R", "S(0) -> S(0),S(0)", "S(1) -> S(1),S(1)"}));
  EXPECT_EQ(on2(b, sort), (Strings{"R -> R,R", "S(0) -> S(0),S(0)", "S(2) -> S(2),S(2)"}));
  EXPECT_EQ(on2(b, argsort), (Strings{"R -> R", "S(1) -> S(1)", "S(2) -> S(2)"}));
}

TEST(Routing, GatherScatterAddIndexAdd) {
  Builder b;
  ValueId x = b.input("x", {8, 6});
  ValueId gi = b.input("gi", {8, 2}, DType::kI64);
  // gather(x, 1, gi): dim 0 has one size in self and index (S(0) both); index S(1) with self R
  // (each rank gathers its own indices along dim 1; index S(0) alone would read the wrong rows
  // of self); self P (linear).
  NodeId gather = node(b, "aten::gather", {x, b.i(1), gi, b.b(false)}, {{{8, 2}, DType::kF32}});
  // scatter_add(zeros [4, 6], 0, index [8, 6], src [8, 6]): dim 1 agrees everywhere; P with P src;
  // P self with index and src cut along the scattered dim.
  ValueId self = b.input("self", {4, 6});
  ValueId si = b.input("si", {8, 6}, DType::kI64);
  NodeId scatter = node(b, "aten::scatter_add", {self, b.i(0), si, x}, {{{4, 6}, DType::kF32}});
  // index_add(self [4, 6], 0, index [8], source [8, 6]).
  ValueId ii = b.input("ii", {8}, DType::kI64);
  NodeId index_add =
      node(b, "aten::index_add", {self, b.i(0), ii, x, b.i(1)}, {{{4, 6}, DType::kF32}});
  EXPECT_EQ(on2(b, gather),
            (Strings{"R,R -> R", "S(0),S(0) -> S(0)", "R,S(1) -> S(1)", "P,R -> P"}));
  EXPECT_EQ(on2(b, scatter),
            (Strings{"R,R,R -> R", "S(1),S(1),S(1) -> S(1)", "P,R,P -> P", "P,S(0),S(0) -> P"}));
  EXPECT_EQ(on2(b, index_add),
            (Strings{"R,R,R -> R", "S(1),R,S(1) -> S(1)", "P,R,P -> P", "P,S(0),S(0) -> P"}));
}

TEST(Routing, CountsArePartialOnlyWithAStaticLengthAndRange) {
  Builder b;
  ValueId ids = b.input("ids", {16}, DType::kI64);
  NodeId counted = node(b, "aten::bincount", {ids, b.none(), b.i(8)}, {{{8}, DType::kI64}});
  NodeId unknown = node(b, "aten::bincount", {ids, b.none(), b.i(0)}, {{{8}, DType::kI64}});
  ValueId f = b.input("f", {16});
  NodeId ranged = node(b, "aten::histc", {f, b.i(4), b.i(0), b.i(3)}, {{{4}, DType::kF32}});
  // min == max: the data's own range, which a piece does not share.
  NodeId own = node(b, "aten::histc", {f, b.i(4), b.i(0), b.i(0)}, {{{4}, DType::kF32}});
  EXPECT_EQ(on2(b, counted), (Strings{"R -> R", "S(0) -> P"}));
  EXPECT_EQ(on2(b, unknown), (Strings{"R -> R"}));
  EXPECT_EQ(on2(b, ranged), (Strings{"R -> R", "S(0) -> P"}));
  EXPECT_EQ(on2(b, own), (Strings{"R -> R"}));
}

TEST(Routing, RepeatInterleave) {
  Builder b;
  ValueId x = b.input("x", {8, 6});
  // An int count along dim 0: dim 1 free, dim 0 too when it divides evenly, P linear.
  NodeId by_int = node(b, "aten::repeat_interleave.self_int", {x, b.i(2), b.i(0), b.none()},
                       {{{16, 6}, DType::kF32}});
  ValueId odd = b.input("odd", {5, 6});
  NodeId uneven = node(b, "aten::repeat_interleave.self_int", {odd, b.i(2), b.i(0), b.none()},
                       {{{10, 6}, DType::kF32}});
  // output_size names the global size: no cut of the repeated dim.
  NodeId sized = node(b, "aten::repeat_interleave.self_int", {x, b.i(2), b.i(0), b.i(16)},
                      {{{16, 6}, DType::kF32}});
  // Tensor repeats along dim 1: only dim 0 (the repeats stay whole).
  ValueId reps = b.input("reps", {6}, DType::kI64);
  NodeId by_tensor = node(b, "aten::repeat_interleave.self_Tensor", {x, reps, b.i(1), b.none()},
                          {{{8, 9}, DType::kF32}});
  // The index form gives global positions: Replicate only.
  NodeId positions =
      node(b, "aten::repeat_interleave.Tensor", {reps, b.none()}, {{{9}, DType::kI64}});
  EXPECT_EQ(on2(b, by_int), (Strings{"R -> R", "S(1) -> S(1)", "S(0) -> S(0)", "P -> P"}));
  EXPECT_EQ(on2(b, uneven), (Strings{"R -> R", "S(1) -> S(1)", "P -> P"}));
  EXPECT_EQ(on2(b, sized), (Strings{"R -> R", "S(1) -> S(1)", "P -> P"}));
  EXPECT_EQ(on2(b, by_tensor), (Strings{"R,R -> R", "S(0),R -> S(0)", "P,R -> P"}));
  EXPECT_EQ(on2(b, positions), (Strings{"R -> R"}));
}

TEST(Routing, GroupedMmCutsNOrKOfTheExpertsNeverTheGroups) {
  Builder b;
  ValueId x = b.input("x", {10, 32});
  ValueId w = b.param("w", {4, 32, 16});
  ValueId offs = b.input("offs", {4}, DType::kI32);
  NodeId mm =
      node(b, "aten::_grouped_mm", {x, w, offs, b.none(), b.none()}, {{{10, 16}, DType::kF32}});
  // N: out S(1); K: Partial; P through either operand. Nothing cuts the groups or the rows.
  EXPECT_EQ(on2(b, mm), (Strings{"R,R,R -> R", "R,S(2),R -> S(1)", "S(1),S(1),R -> P", "P,R,R -> P",
                                 "R,P,R -> P"}));
  // Batched 3D x 3D: the group dim is a batch dim there.
  ValueId xb = b.input("xb", {4, 6, 32});
  NodeId bmm = node(b, "aten::_grouped_mm", {xb, w, b.none(), b.none(), b.none()},
                    {{{4, 6, 16}, DType::kF32}});
  EXPECT_EQ(on2(b, bmm), (Strings{"R,R -> R", "S(0),S(0) -> S(0)", "S(1),R -> S(1)",
                                  "R,S(2) -> S(2)", "S(2),S(1) -> P", "P,R -> P", "R,P -> P"}));
  // K and N must divide evenly: on 3 ranks 16 does not, 32 does not either.
  Strings on3 = strategyStrings(enumerate(b.g, *mesh::DeviceMesh::parse("3")), mm);
  EXPECT_EQ(on3, (Strings{"R,R,R -> R", "P,R,R -> P", "R,P,R -> P"}));
  // ... into pieces of 16 bytes: on 8 ranks an f32 K of 32 gives pieces of 4 (kept), an N of 16
  // pieces of 2 (8 bytes: dropped).
  Strings on8 = strategyStrings(enumerate(b.g, *mesh::DeviceMesh::parse("8")), mm);
  EXPECT_EQ(on8, (Strings{"R,R,R -> R", "S(1),S(1),R -> P", "P,R,R -> P", "R,P,R -> P"}));
}

}  // namespace
}  // namespace apc::strategy::testing
