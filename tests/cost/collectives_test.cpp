//===- tests/cost/collectives_test.cpp - Alpha-beta collective costs ------===//
//
// Hand-computed costs for 2, 4 and 8 ranks. Link: beta = 100 GB/s, alpha = 5 us; n = 1e6 bytes, so
// n / beta = 1e6 B / (100 * 1e3 B/us) = 10 us.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <cmath>

#include "apc/cost/collectives.h"

namespace apc::cost {
namespace {

const mesh::LinkParams kLink{100.0, 5.0};
constexpr double kN = 1e6;

TEST(Collectives, TwoRanks) {
  // all-gather: (2-1)*5 + 1/2 * 10 = 10; all-reduce twice that; all-to-all: 5 + 1/4 * 10 = 7.5.
  EXPECT_DOUBLE_EQ(allGatherUs(kLink, 2, kN), 10.0);
  EXPECT_DOUBLE_EQ(reduceScatterUs(kLink, 2, kN), 10.0);
  EXPECT_DOUBLE_EQ(allReduceUs(kLink, 2, kN), 20.0);
  EXPECT_DOUBLE_EQ(allToAllUs(kLink, 2, kN), 7.5);
}

TEST(Collectives, FourRanks) {
  // all-gather: 3*5 + 3/4 * 10 = 22.5; all-reduce 45; all-to-all: 15 + 3/16 * 10 = 16.875.
  EXPECT_DOUBLE_EQ(allGatherUs(kLink, 4, kN), 22.5);
  EXPECT_DOUBLE_EQ(reduceScatterUs(kLink, 4, kN), 22.5);
  EXPECT_DOUBLE_EQ(allReduceUs(kLink, 4, kN), 45.0);
  EXPECT_DOUBLE_EQ(allToAllUs(kLink, 4, kN), 16.875);
}

TEST(Collectives, EightRanks) {
  // all-gather: 7*5 + 7/8 * 10 = 43.75; all-reduce 87.5; all-to-all: 35 + 7/64 * 10 = 36.09375.
  EXPECT_DOUBLE_EQ(allGatherUs(kLink, 8, kN), 43.75);
  EXPECT_DOUBLE_EQ(reduceScatterUs(kLink, 8, kN), 43.75);
  EXPECT_DOUBLE_EQ(allReduceUs(kLink, 8, kN), 87.5);
  EXPECT_DOUBLE_EQ(allToAllUs(kLink, 8, kN), 36.09375);
}

TEST(Collectives, Dispatch) {
  EXPECT_EQ(collectiveUs(CollectiveKind::kNone, kLink, 8, kN), 0.0);
  EXPECT_DOUBLE_EQ(collectiveUs(CollectiveKind::kAllGather, kLink, 8, kN), 43.75);
  EXPECT_DOUBLE_EQ(collectiveUs(CollectiveKind::kReduceScatter, kLink, 8, kN), 43.75);
  EXPECT_DOUBLE_EQ(collectiveUs(CollectiveKind::kAllReduce, kLink, 8, kN), 87.5);
  EXPECT_DOUBLE_EQ(collectiveUs(CollectiveKind::kAllToAll, kLink, 8, kN), 36.09375);
  EXPECT_STREQ(collectiveName(CollectiveKind::kReduceScatter), "reduce-scatter");
}

TEST(Collectives, DegenerateCases) {
  EXPECT_EQ(allReduceUs(kLink, 1, kN), 0.0);    // one rank: nothing to do
  EXPECT_EQ(allGatherUs(kLink, 4, 0.0), 15.0);  // latency only
  EXPECT_TRUE(std::isinf(allGatherUs(mesh::LinkParams{0.0, 1.0}, 2, kN)));
  EXPECT_TRUE(std::isinf(allToAllUs(mesh::LinkParams{10.0, -1.0}, 2, kN)));
}

TEST(Collectives, DefaultLinks) {
  // Default 1-d mesh link: 450 GB/s, 2 us. 8 ranks, 4 MiB = 4194304 B:
  // 7*2 + 7/8 * 4194304 / 450e3 = 14 + 8.15559... = 22.1556 us.
  mesh::LinkParams nvlink = mesh::defaultLinks(1)[0];
  EXPECT_NEAR(allGatherUs(nvlink, 8, 4194304.0), 14.0 + 0.875 * 4194304.0 / 450e3, 1e-12);
}

}  // namespace
}  // namespace apc::cost
