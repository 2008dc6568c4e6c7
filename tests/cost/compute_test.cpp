//===- tests/cost/compute_test.cpp - Roofline, backward multiples, layout -===//
//
// Hand-computed roofline times on h100, the backward multiples, and the nested torch.chunk layout
// (localPiece, maxLocalSizes, localNumel) including uneven dims.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include "../common/placements.h"
#include "apc/cost/compute.h"
#include "apc/layout/layout.h"

namespace apc::cost {

using layout::DimPiece;
using layout::localPiece;
using layout::maxLocalSizes;
namespace {

using mesh::Placement;

using testing::tuple;

ir::TensorMeta meta(std::vector<int64_t> sizes, ir::DType dtype = ir::DType::kF32) {
  ir::TensorMeta t;
  t.shape = ir::makeShape(sizes);
  t.dtype = dtype;
  return t;
}

TEST(Compute, ComputeBound) {
  DeviceSpec h100 = *deviceByName("h100");
  // 1e12 flop / (989 TFLOPS * 0.7 * 1e6 flop/us/TFLOPS) = 1e12 / 6.923e8 = 1444.46 us;
  // memory 1e6 B / (3350 * 0.8 * 1e3 B/us) = 0.373 us.
  EXPECT_NEAR(computeCostUs(h100, 1e12, 1e6, ir::DType::kBF16), 1e12 / 6.923e8, 1e-6);
  // The same flops in f32 (67 TFLOPS): 1e12 / (67 * 0.7 * 1e6) = 21321.96 us.
  EXPECT_NEAR(computeCostUs(h100, 1e12, 1e6, ir::DType::kF32), 1e12 / 4.69e7, 1e-6);
}

TEST(Compute, MemoryBound) {
  DeviceSpec h100 = *deviceByName("h100");
  // 2.68e9 B / (3350 GB/s * 0.8 * 1e3) = 2.68e9 / 2.68e6 = 1000 us; flops 1e9 -> 1.44 us.
  EXPECT_NEAR(computeCostUs(h100, 1e9, 2.68e9, ir::DType::kBF16), 1000.0, 1e-9);
}

TEST(Compute, FloorAndZeroWork) {
  DeviceSpec h100 = *deviceByName("h100");
  EXPECT_EQ(computeCostUs(h100, 100, 400, ir::DType::kF32), 2.0);  // floor
  EXPECT_EQ(computeCostUs(h100, 0, 0, ir::DType::kF32), 0.0);      // views launch nothing
  EXPECT_EQ(computeCostUs(h100, 0, 400, ir::DType::kF32), 2.0);
}

TEST(Compute, BackwardMultiples) {
  EXPECT_EQ(backwardMultiplier(OpFamily::kContraction), 2.0);
  EXPECT_EQ(backwardMultiplier(OpFamily::kView), 0.0);
  EXPECT_EQ(backwardMultiplier(OpFamily::kPointwise), 1.0);
  EXPECT_EQ(backwardMultiplier(OpFamily::kNormalization), 2.0);
  EXPECT_EQ(backwardMultiplier(OpFamily::kAttention), 2.5);
  EXPECT_EQ(backwardMultiplier(OpFamily::kFactory), 0.0);
  EXPECT_EQ(backwardComputeUs(OpFamily::kContraction, 10.0), 20.0);
  EXPECT_STREQ(opFamilyName(OpFamily::kEmbedding), "embedding");
}

TEST(Layout, NestedChunksOfUnevenDim) {
  mesh::DeviceMesh m = *mesh::DeviceMesh::create({2, 2});
  // Dim of 5 over [S(0), S(0)]: outer chunks 3 | 2, inner 2 | 1 and 1 | 1 (not 2, 2, 1, 0).
  std::vector<DimPiece> want = {{0, 2}, {2, 1}, {3, 1}, {4, 1}};
  for (int64_t r = 0; r < 4; ++r) {
    std::vector<DimPiece> p = localPiece({5, 3}, tuple("S(0),S(0)"), m, m.coordinate(r));
    EXPECT_EQ(p[0], want[static_cast<size_t>(r)]) << r;
    EXPECT_EQ(p[1], (DimPiece{0, 3}));
  }
}

TEST(Layout, EmptyPiecesAndMixedDims) {
  mesh::DeviceMesh m = *mesh::DeviceMesh::create({2, 4});
  // Dim 0 of 3 over mesh dim 1 (4 ranks): chunk 1 -> 1, 1, 1, 0. Dim 1 of 10 over mesh dim 0: 5
  // | 5.
  std::vector<DimPiece> p = localPiece({3, 10}, tuple("S(1),S(0)"), m, {1, 3});
  EXPECT_EQ(p[0], (DimPiece{3, 0}));
  EXPECT_EQ(p[1], (DimPiece{5, 5}));
  p = localPiece({3, 10}, tuple("P,R"), m, {1, 3});
  EXPECT_EQ(p[0], (DimPiece{0, 3}));
  EXPECT_EQ(p[1], (DimPiece{0, 10}));
}

TEST(Layout, LocalNumelIsTheLargestPiece) {
  mesh::DeviceMesh m = *mesh::DeviceMesh::create({2, 4});
  // [7, 5] under [S(0), S(0)]: ceil(7 / 8) = 1, times 5.
  EXPECT_EQ(localNumel(meta({7, 5}), tuple("S(0),S(0)"), m), 5.0);
  // [7, 5] under [S(1), S(0)]: ceil(7 / 4) = 2, ceil(5 / 2) = 3.
  EXPECT_EQ(localNumel(meta({7, 5}), tuple("S(1),S(0)"), m), 6.0);
  EXPECT_EQ(maxLocalSizes(meta({7, 5}), tuple("S(1),S(0)"), m), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(localNumel(meta({7, 5}), tuple("P,R"), m), 35.0);
  ir::TensorMeta sym = meta({0, 5});
  sym.shape[0] = ir::Dim::symbolic("B", 16);  // hints stand in for symbols
  EXPECT_EQ(localNumel(sym, tuple("S(0),R"), m), 40.0);
}

}  // namespace
}  // namespace apc::cost
