//===- tests/cost/device_test.cpp - Device table and overrides ------------===//
//
// Built-in lookup (case-insensitive, unknown names listed), per-dtype peaks, and the checks applied
// to overrides.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "apc/cost/device.h"

namespace apc::cost {
namespace {

TEST(Device, BuiltinsAreSortedAndFound) {
  EXPECT_EQ(deviceNames(), (std::vector<std::string>{"a100", "b200", "cpu", "h100", "h200"}));
  for (const std::string& n : deviceNames()) {
    Expected<DeviceSpec> d = deviceByName(n);
    ASSERT_TRUE(d.ok()) << n;
    EXPECT_EQ(d->name, n);
    EXPECT_GT(d->hbm_gbps, 0);
    EXPECT_GT(d->peak.bf16, 0);
    EXPECT_GT(d->peak.f32, 0);
    EXPECT_GT(d->kernel_floor_us, 0);
  }
}

TEST(Device, DatasheetNumbers) {
  DeviceSpec h100 = *deviceByName("H100");  // case-insensitive
  EXPECT_EQ(h100.peak.bf16, 989.0);
  EXPECT_EQ(h100.hbm_gbps, 3350.0);
  DeviceSpec h200 = *deviceByName("h200");
  EXPECT_EQ(h200.peak.bf16, 989.0);
  EXPECT_EQ(h200.hbm_gbps, 4800.0);
  DeviceSpec a100 = *deviceByName(" a100 ");
  EXPECT_EQ(a100.peak.bf16, 312.0);
  EXPECT_EQ(a100.hbm_gbps, 2039.0);
  DeviceSpec b200 = *deviceByName("b200");
  EXPECT_EQ(b200.peak.bf16, 2250.0);
  EXPECT_EQ(b200.hbm_gbps, 8000.0);
}

TEST(Device, PeakPerDtype) {
  DeviceSpec h100 = *deviceByName("h100");
  EXPECT_EQ(h100.peakTflops(ir::DType::kBF16), 989.0);
  EXPECT_EQ(h100.peakTflops(ir::DType::kF16), 989.0);
  EXPECT_EQ(h100.peakTflops(ir::DType::kF32), 67.0);
  EXPECT_EQ(h100.peakTflops(ir::DType::kF64), 67.0);
  EXPECT_EQ(h100.peakTflops(ir::DType::kI8), 1979.0);
  EXPECT_EQ(h100.peakTflops(ir::DType::kI64), 67.0);  // other integers at the f32 peak
  h100.f32_uses_tf32 = true;
  EXPECT_EQ(h100.peakTflops(ir::DType::kF32), 494.5);
}

TEST(Device, UnknownNameListsKnownOnes) {
  Expected<DeviceSpec> d = deviceByName("v100");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(d.error().message(), "unknown device 'v100' (known: a100, b200, cpu, h100, h200)");
}

TEST(Device, OverridesApply) {
  DeviceOverrides o;
  o.peak_bf16 = 500.0;
  o.hbm_gbps = 3000.0;
  o.compute_efficiency = 1.0;
  o.kernel_floor_us = 0.0;
  o.f32_uses_tf32 = true;
  Expected<DeviceSpec> d = applyOverrides(*deviceByName("h100"), o);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->peak.bf16, 500.0);
  EXPECT_EQ(d->peak.f16, 989.0);  // untouched
  EXPECT_EQ(d->hbm_gbps, 3000.0);
  EXPECT_EQ(d->compute_efficiency, 1.0);
  EXPECT_EQ(d->memory_efficiency, 0.8);
  EXPECT_EQ(d->kernel_floor_us, 0.0);
  EXPECT_TRUE(d->f32_uses_tf32);
}

TEST(Device, BadOverridesAreErrors) {
  DeviceSpec h100 = *deviceByName("h100");
  auto fails = [&](DeviceOverrides o, const std::string& message) {
    Expected<DeviceSpec> d = applyOverrides(h100, o);
    ASSERT_FALSE(d.ok()) << message;
    EXPECT_EQ(d.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(d.error().message(), message);
  };
  DeviceOverrides o;
  o.peak_bf16 = 0.0;
  fails(o, "device override peak_bf16 must be positive, got 0");
  o = {};
  o.peak_f32 = -5.0;
  fails(o, "device override peak_f32 must be positive, got -5");
  o = {};
  o.hbm_gbps = -1.0;
  fails(o, "device override hbm_gbps must be positive, got -1");
  o = {};
  o.hbm_gbps = std::numeric_limits<double>::infinity();
  fails(o, "device override hbm_gbps must be positive, got inf");
  o = {};
  o.memory_efficiency = 1.5;
  fails(o, "device override memory_efficiency must be in (0, 1], got 1.5");
  o = {};
  o.compute_efficiency = 0.0;
  fails(o, "device override compute_efficiency must be in (0, 1], got 0");
  o = {};
  o.kernel_floor_us = -1.0;
  fails(o, "device override kernel_floor_us must be >= 0, got -1");
}

TEST(Device, SetPeakByDtypeName) {
  DeviceSpec d = *deviceByName("a100");
  ASSERT_TRUE(setPeakTflops(d, "bfloat16", 300.0).ok());
  EXPECT_EQ(d.peak.bf16, 300.0);
  ASSERT_TRUE(setPeakTflops(d, "TF32", 100.0).ok());
  EXPECT_EQ(d.peak.tf32, 100.0);
  Status bad = setPeakTflops(d, "i64", 1.0);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message(),
            "no peak for dtype 'i64' (known: f64, f32, tf32, bf16, f16, i8)");
  Status neg = setPeakTflops(d, "f16", -2.0);
  ASSERT_FALSE(neg.ok());
  EXPECT_EQ(neg.error().message(), "device override peak_f16 must be positive, got -2");
  EXPECT_EQ(d.peak.f16, 312.0);
}

TEST(Device, TextForm) {
  EXPECT_EQ(toString(*deviceByName("h100")),
            "h100: bf16 989 TFLOPS, f32 67 TFLOPS, HBM 3350 GB/s, eff 0.70/0.80, floor 2.0 us");
}

}  // namespace
}  // namespace apc::cost
