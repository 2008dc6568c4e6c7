//===- tests/cost/edge_test.cpp - Edge semantics ---------------------------===//
//
// The rules of apc/cost/edge.h, which the planner prices and lowering emits: gradient placements
// (Shard kept, Partial summed, Replicate Partial where the op splits its work), where a gradient
// lands on its producer, the dtypes under mixed precision, and which producers are regathered.
//
//===----------------------------------------------------------------------===//
#include "apc/cost/edge.h"
#include "../common/placements.h"

#include <gtest/gtest.h>

namespace apc::cost {
namespace {

using mesh::Placement;
using mesh::PlacementTuple;

using testing::tuple;

TEST(EdgeSemantics, PartialAsReplicateSumsOnlyPartialDims) {
  EXPECT_EQ(partialAsReplicate(tuple("P,S(0)")), tuple("R,S(0)"));
  EXPECT_EQ(partialAsReplicate(tuple("S(1),R")), tuple("S(1),R"));
}

TEST(EdgeSemantics, OpSplitMarksMeshDimsWhereAnyTensorIsNotReplicate) {
  // A matmul x[S(0),R] @ w[R,S(1)] -> [S(0),S(1)], plus a non-tensor argument.
  std::vector<bool> split =
      opSplit({tuple("S(0),R"), tuple("R,S(1)"), std::nullopt}, {tuple("S(0),S(1)")}, 2);
  EXPECT_EQ(split, (std::vector<bool>{true, true}));
  EXPECT_EQ(opSplit({tuple("R,R")}, {tuple("R,P")}, 2), (std::vector<bool>{false, true}));
  EXPECT_EQ(opSplit({tuple("R,R")}, {tuple("R,R")}, 2), (std::vector<bool>{false, false}));
}

TEST(EdgeSemantics, GradientPlacementOfAnInput) {
  // Shard stays Shard; Partial input: the gradient is whole (Replicate).
  EXPECT_EQ(gradientPlacement(tuple("S(0),P"), {true, true}), tuple("S(0),R"));
  // A Replicate input of an op split on that mesh dim: each rank's part of the op contributes a
  // part of the gradient (Partial); of an op not split there: Replicate.
  EXPECT_EQ(gradientPlacement(tuple("R,R"), {true, false}), tuple("P,R"));
  EXPECT_EQ(gradientPlacement(tuple("R,R"), {false, false}), tuple("R,R"));
}

TEST(EdgeSemantics, DtypesUnderMixedPrecision) {
  ir::TensorMeta w{{ir::Dim::fixed(8), ir::Dim::fixed(4)}, ir::DType::kF32, true};
  ir::TensorMeta ids{{ir::Dim::fixed(8)}, ir::DType::kI64, false};
  const Precision none{spec::MixedPrecision{}};
  EXPECT_EQ(none.compute(w).dtype, ir::DType::kF32);
  EXPECT_EQ(none.reduceDtype(w), ir::DType::kF32);
  const Precision bf16{spec::MixedPrecision{ir::DType::kBF16, std::nullopt, std::nullopt}};
  EXPECT_EQ(bf16.compute(w).dtype, ir::DType::kBF16);
  EXPECT_EQ(bf16.reduceDtype(w), ir::DType::kBF16);     // reduce_dtype defaults to param_dtype
  EXPECT_EQ(bf16.compute(ids).dtype, ir::DType::kI64);  // integers are not cast
  const Precision bf16_f32{spec::MixedPrecision{ir::DType::kBF16, ir::DType::kF32, std::nullopt}};
  EXPECT_EQ(bf16_f32.compute(w).dtype, ir::DType::kBF16);
  EXPECT_EQ(bf16_f32.reduceDtype(w), ir::DType::kF32);
}

TEST(EdgeSemantics, OnlyParametersAreRegathered) {
  ir::Node n;
  n.kind = ir::NodeKind::kParameter;
  EXPECT_TRUE(regatheredInBackward(n));
  n.kind = ir::NodeKind::kInput;
  EXPECT_FALSE(regatheredInBackward(n));
  n.kind = ir::NodeKind::kOp;
  EXPECT_FALSE(regatheredInBackward(n));
}

}  // namespace
}  // namespace apc::cost
