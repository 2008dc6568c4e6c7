// Fitting the cost model to measurements (apc/cost/calibration.h): synthetic measurements made
// with a known link and device are fitted back to it.
#include "apc/cost/calibration.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace apc::cost {
namespace {

std::vector<CollectiveSample> synthetic(const mesh::LinkParams& link, int64_t p, double noise,
                                        uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> jitter(1 - noise, 1 + noise);
  std::vector<CollectiveSample> out;
  for (CollectiveKind k : {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter,
                           CollectiveKind::kAllReduce, CollectiveKind::kAllToAll})
    for (double n = 4096; n <= 256.0 * 1024 * 1024; n *= 4) {
      CollectiveSample s{k, p, n, 0};
      s.us = collectiveUs(k, link, p, n) * (noise > 0 ? jitter(gen) : 1.0);
      out.push_back(s);
    }
  return out;
}

TEST(Calibration, ExactMeasurementsGiveBackTheLink) {
  for (int64_t p : {2, 4, 8}) {
    const mesh::LinkParams truth{12.5, 35.0};  // 12.5 GB/s, 35 us
    auto fit = fitLink(synthetic(truth, p, 0.0, 1));
    ASSERT_TRUE(fit.ok()) << fit.error().message();
    EXPECT_NEAR(fit->link.bandwidth_gbps, 12.5, 1e-6 * 12.5) << "p=" << p;
    EXPECT_NEAR(fit->link.latency_us, 35.0, 1e-6 * 35.0) << "p=" << p;
    EXPECT_LT(fit->mape_pct, 1e-6);
    EXPECT_EQ(fit->samples, 36u);
  }
}

TEST(Calibration, NoisyMeasurementsFitWithinTheirNoise) {
  const mesh::LinkParams truth{3.2, 80.0};
  auto fit = fitLink(synthetic(truth, 2, 0.05, 7));
  ASSERT_TRUE(fit.ok()) << fit.error().message();
  EXPECT_NEAR(fit->link.bandwidth_gbps, 3.2, 0.05 * 3.2);
  EXPECT_NEAR(fit->link.latency_us, 80.0, 0.05 * 80.0);
  EXPECT_LT(fit->mape_pct, 5.0);
  EXPECT_GT(fit->mape_pct, 0.0);
}

TEST(Calibration, ANegativeLatencyIsClampedAndBandwidthRefitted) {
  // Times proportional to bytes with no latency at all, a few slightly below the line: the free
  // fit's latency would be negative.
  std::vector<CollectiveSample> s = {{CollectiveKind::kAllReduce, 2, 1e6, 99.0},
                                     {CollectiveKind::kAllReduce, 2, 4e6, 400.0},
                                     {CollectiveKind::kAllReduce, 2, 16e6, 1600.0}};
  auto fit = fitLink(s);
  ASSERT_TRUE(fit.ok()) << fit.error().message();
  EXPECT_EQ(fit->link.latency_us, 0.0);
  EXPECT_NEAR(fit->link.bandwidth_gbps, 10.0, 0.1);  // all-reduce of n moves n per rank here
}

TEST(Calibration, BadSamplesAreErrors) {
  EXPECT_FALSE(fitLink({}).ok());
  EXPECT_FALSE(fitLink({{CollectiveKind::kAllGather, 2, 1e6, 10}}).ok());
  auto zero =
      fitLink({{CollectiveKind::kAllGather, 2, 1e6, 10}, {CollectiveKind::kAllGather, 2, 2e6, 0}});
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.error().message().find("sample 1"), std::string::npos);
  EXPECT_FALSE(
      fitLink({{CollectiveKind::kAllGather, 1, 1e6, 10}, {CollectiveKind::kAllGather, 1, 2e6, 20}})
          .ok());
  EXPECT_FALSE(
      fitLink({{CollectiveKind::kAllGather, 2, 1e6, NAN}, {CollectiveKind::kAllGather, 2, 2e6, 20}})
          .ok());
  // One size only: the bandwidth cannot be told from the latency.
  auto one =
      fitLink({{CollectiveKind::kAllGather, 2, 1e6, 10}, {CollectiveKind::kAllGather, 2, 1e6, 11}});
  ASSERT_FALSE(one.ok());
  EXPECT_NE(one.error().message().find("two sizes"), std::string::npos);
}

TEST(Calibration, DeviceFitTakesTheBestThroughputAndBandwidth) {
  std::vector<KernelSample> s = {
      {2.0 * 256 * 256 * 256, 3.0 * 256 * 256 * 4, ir::DType::kF32, 400.0},     // 0.0839 TFLOP/s
      {2.0 * 1024 * 1024 * 1024, 3.0 * 1024 * 1024 * 4, ir::DType::kF32, 2e4},  // 0.107 TFLOP/s
      {2.0 * 512 * 512 * 512, 0, ir::DType::kBF16, 1e4},                        // 0.0268
      {0, 12e6, ir::DType::kF32, 1000.0},                                       // 12 GB/s
      {0, 48e6, ir::DType::kF32, 3000.0},                                       // 16 GB/s
  };
  auto fit = fitDevice(s, 3.5);
  ASSERT_TRUE(fit.ok()) << fit.error().message();
  EXPECT_NEAR(fit->peak_tflops.at(ir::DType::kF32), 2.0 * 1024 * 1024 * 1024 / 2e4 / 1e6, 1e-12);
  EXPECT_NEAR(fit->peak_tflops.at(ir::DType::kBF16), 2.0 * 512 * 512 * 512 / 1e4 / 1e6, 1e-12);
  EXPECT_DOUBLE_EQ(fit->memory_gbps, 16.0);
  EXPECT_EQ(fit->kernel_floor_us, 3.5);
  EXPECT_FALSE(fitDevice({{0, 1e6, ir::DType::kF32, 10}}, 1).ok());  // no matmul
  EXPECT_FALSE(fitDevice({{1e6, 0, ir::DType::kF32, 10}}, 1).ok());  // no memory-bound kernel
  EXPECT_FALSE(fitDevice(s, -1).ok());
}

}  // namespace
}  // namespace apc::cost
