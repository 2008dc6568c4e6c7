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

TEST(Calibration, TimesThatDoNotGrowWithTheBytesFitLatencyOnly) {
  std::vector<CollectiveSample> s = {{CollectiveKind::kReduceScatter, 2, 4096, 300.0},
                                     {CollectiveKind::kReduceScatter, 2, 16384, 280.0},
                                     {CollectiveKind::kReduceScatter, 2, 65536, 260.0}};
  auto fit = fitLink(s);
  ASSERT_TRUE(fit.ok()) << fit.error().message();
  EXPECT_EQ(fit->link.bandwidth_gbps, mesh::kMaxBandwidthGbps);
  EXPECT_GT(fit->link.latency_us, 260.0);  // one step of latency per call at p = 2
  EXPECT_LT(fit->link.latency_us, 300.0);
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

TEST(Calibration, DeviceFitRecoversExactRates) {
  // Kernels timed exactly at 0.05 TFLOP/s (f32), 0.1 (bf16) and 20 GB/s.
  std::vector<KernelSample> s;
  for (double n : {128.0, 256.0, 512.0, 1024.0}) {
    const double flops = 2 * n * n * n;
    s.push_back({flops, 0, ir::DType::kF32, flops / 0.05e6});
    s.push_back({flops, 0, ir::DType::kBF16, flops / 0.1e6});
    s.push_back({0, 12 * n * n, ir::DType::kF32, 12 * n * n / 20e3});
  }
  auto fit = fitDevice(s, 3.5);
  ASSERT_TRUE(fit.ok()) << fit.error().message();
  EXPECT_NEAR(fit->peak_tflops.at(ir::DType::kF32), 0.05, 1e-12);
  EXPECT_NEAR(fit->peak_tflops.at(ir::DType::kBF16), 0.1, 1e-12);
  EXPECT_NEAR(fit->memory_gbps, 20.0, 1e-9);
  EXPECT_EQ(fit->kernel_floor_us, 3.5);
}

TEST(Calibration, DeviceFitMinimisesTheRelativeError) {
  // Two matmuls at rates 1 and 3 (TFLOP/s): the rate R minimising (1/R - 1)^2 + (3/R - 1)^2 (each
  // time relative to its own) is (1 + 9) / (1 + 3) = 2.5, not the best (3) nor the mean (2).
  std::vector<KernelSample> s = {{1e6, 0, ir::DType::kF32, 1.0},
                                 {3e6, 0, ir::DType::kF32, 1.0},
                                 {0, 1e3, ir::DType::kF32, 1.0}};
  auto fit = fitDevice(s, 0);
  ASSERT_TRUE(fit.ok()) << fit.error().message();
  EXPECT_NEAR(fit->peak_tflops.at(ir::DType::kF32), 2.5, 1e-12);
  double best = 0;
  for (double r = 1; r <= 3; r += 0.01) {
    auto err = [&](double rate) { return std::pow(1 / rate - 1, 2) + std::pow(3 / rate - 1, 2); };
    if (best == 0 || err(r) < err(best)) best = r;
  }
  EXPECT_NEAR(best, 2.5, 0.01);
}

TEST(Calibration, DeviceFitErrors) {
  std::vector<KernelSample> s = {{1e6, 0, ir::DType::kF32, 10}, {0, 1e6, ir::DType::kF32, 10}};
  EXPECT_TRUE(fitDevice(s, 1).ok());
  EXPECT_FALSE(fitDevice({{0, 1e6, ir::DType::kF32, 10}}, 1).ok());  // no matmul
  EXPECT_FALSE(fitDevice({{1e6, 0, ir::DType::kF32, 10}}, 1).ok());  // no memory-bound kernel
  EXPECT_FALSE(fitDevice(s, -1).ok());
  EXPECT_FALSE(fitDevice({{1e6, 0, ir::DType::kF32, 0}, {0, 1e6, ir::DType::kF32, 10}}, 1).ok());
}

}  // namespace
}  // namespace apc::cost

namespace apc::cost {
namespace {

TEST(Calibration, MonotoneTablesPoolTheViolatorsAndKeepTheRest) {
  // Already non-decreasing: unchanged.
  EXPECT_EQ(monotoneUs({1, 2, 2, 5}), (std::vector<double>{1, 2, 2, 5}));
  // A spike at the smallest size is pooled with the sizes it exceeds, then the rest follows.
  const std::vector<double> spike = monotoneUs({2480, 472, 902, 1468, 1385, 3801});
  const std::vector<double> want = {3854.0 / 3, 3854.0 / 3, 3854.0 / 3, 1426.5, 1426.5, 3801};
  ASSERT_EQ(spike.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(spike[i], want[i], 1e-9) << i;
  // Pools keep the total (least squares with equal weights).
  const std::vector<double> in = {5, 1, 4, 2, 8, 7, 9};
  const std::vector<double> out = monotoneUs(in);
  ASSERT_EQ(out.size(), in.size());
  double a = 0, b = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    a += in[i];
    b += out[i];
    if (i > 0) {
      EXPECT_LE(out[i - 1], out[i]);
    }
  }
  EXPECT_NEAR(a, b, 1e-12);
  EXPECT_TRUE(monotoneUs({}).empty());
}

// The overlap efficiency from three times: side by side (the longer of the two), taking turns
// (their sum), halfway, and the clamps; bad times are errors.
// A convolution's time beyond its flops, against its weight's bytes (DeviceSpec::
// conv_weight_gbps): a known rate and per-call intercept come back; extra time that does not grow
// with the bytes is no rate; too few samples or a bad value are errors.
TEST(Calibration, ExtraTimeRateRecoversTheSlope) {
  std::vector<ExtraSample> samples;
  for (double mib : {0.15, 0.6, 2.4, 9.4}) {
    const double bytes = mib * 1024 * 1024;
    samples.push_back({bytes, 40.0 + bytes / (2.5 * 1e3)});  // 2.5 GB/s beyond 40 us
  }
  auto rate = fitExtraRateGbps(samples);
  ASSERT_TRUE(rate.ok()) << rate.error().message();
  EXPECT_NEAR(*rate, 2.5, 1e-9);
  for (ExtraSample& s : samples) s.extra_us = 40.0 - s.bytes * 1e-6;  // falls with the bytes
  rate = fitExtraRateGbps(samples);
  ASSERT_TRUE(rate.ok());
  EXPECT_EQ(*rate, 0.0);
  EXPECT_FALSE(fitExtraRateGbps({{1e6, 5.0}}).ok());
  EXPECT_FALSE(fitExtraRateGbps({{1e6, 5.0}, {1e6, 7.0}}).ok());  // one size
  EXPECT_FALSE(fitExtraRateGbps({{-1.0, 5.0}, {1e6, 7.0}}).ok());
  EXPECT_FALSE(fitExtraRateGbps({{1e5, std::nan("")}, {1e6, 7.0}}).ok());
}

TEST(Calibration, OverlapEfficiencyFromComputeCollectiveAndBoth) {
  EXPECT_DOUBLE_EQ(*overlapEfficiency(1000, 400, 1000), 1.0);
  EXPECT_DOUBLE_EQ(*overlapEfficiency(1000, 400, 1400), 0.0);
  EXPECT_DOUBLE_EQ(*overlapEfficiency(1000, 400, 1200), 0.5);
  EXPECT_DOUBLE_EQ(*overlapEfficiency(300, 400, 380), 1.0);    // faster than either: noise
  EXPECT_DOUBLE_EQ(*overlapEfficiency(1000, 400, 1900), 0.0);  // slower than both in turn
  EXPECT_FALSE(overlapEfficiency(0, 400, 500).ok());
  EXPECT_FALSE(overlapEfficiency(1000, std::nan(""), 500).ok());
}

}  // namespace
}  // namespace apc::cost
