//===- lib/cost/device.cpp - Built-in device specs and overrides ----------===//
//
// The built-in table and the checks applied to user overrides. Numbers are per GPU, SXM form
// factor, dense (datasheet "with sparsity" figures halved), from the NVIDIA datasheets: H100 SXM,
// H200 SXM, A100 SXM 80GB, and HGX B200 (the 8-GPU totals divided by 8).
//
//===----------------------------------------------------------------------===//
#include "apc/cost/device.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <tuple>

#include "apc/support/strings.h"

namespace apc::cost {

namespace {

DeviceSpec make(const char* name, PeakTflops peak, double hbm_gbps, double memory_gb) {
  DeviceSpec s;
  s.name = name;
  s.peak = peak;
  s.hbm_gbps = hbm_gbps;
  s.memory_gb = memory_gb;
  return s;
}

// Sorted by name.
std::vector<DeviceSpec> builtins() {
  std::vector<DeviceSpec> out;
  //                           f64    f32    tf32    bf16    f16     i8
  out.push_back(make("a100", {19.5, 19.5, 156.0, 312.0, 312.0, 624.0}, 2039.0, 80.0));
  out.push_back(make("b200", {37.0, 75.0, 1125.0, 2250.0, 2250.0, 4500.0}, 8000.0, 180.0));
  DeviceSpec cpu = make("cpu", {1.0, 2.0, 2.0, 2.0, 2.0, 4.0}, 200.0, 0.0);
  cpu.compute_efficiency = 0.5;
  cpu.memory_efficiency = 0.7;
  cpu.kernel_floor_us = 5.0;
  out.push_back(cpu);
  out.push_back(make("h100", {67.0, 67.0, 494.5, 989.0, 989.0, 1979.0}, 3350.0, 80.0));
  out.push_back(make("h200", {67.0, 67.0, 494.5, 989.0, 989.0, 1979.0}, 4800.0, 141.0));
  return out;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string fmt(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

Status checkPositive(const char* field, double v) {
  if (!(v > 0) || !std::isfinite(v))
    return invalidArgument(std::string("device override ") + field + " must be positive, got " +
                           fmt(v));
  return Status::success();
}

Status checkEfficiency(const char* field, double v) {
  if (!(v > 0 && v <= 1))
    return invalidArgument(std::string("device override ") + field + " must be in (0, 1], got " +
                           fmt(v));
  return Status::success();
}

// The peak field for a dtype name, or nullptr.
double* peakField(PeakTflops& p, std::string_view dtype_name) {
  std::string n = lower(dtype_name);
  if (n == "tf32") return &p.tf32;
  std::optional<ir::DType> d = ir::parseDType(n);
  if (!d) return nullptr;
  switch (*d) {
    case ir::DType::kF64:
      return &p.f64;
    case ir::DType::kF32:
      return &p.f32;
    case ir::DType::kBF16:
      return &p.bf16;
    case ir::DType::kF16:
      return &p.f16;
    case ir::DType::kI8:
      return &p.i8;
    default:
      return nullptr;
  }
}

}  // namespace

double DeviceSpec::peakTflops(ir::DType dtype) const {
  switch (dtype) {
    case ir::DType::kF64:
      return peak.f64;
    case ir::DType::kF32:
      return f32_uses_tf32 ? peak.tf32 : peak.f32;
    case ir::DType::kBF16:
      return peak.bf16;
    case ir::DType::kF16:
      return peak.f16;
    case ir::DType::kI8:
    case ir::DType::kU8:
      return peak.i8;
    default:
      return peak.f32;
  }
}

std::vector<std::string> deviceNames() {
  std::vector<std::string> names;
  for (const DeviceSpec& s : builtins()) names.push_back(s.name);
  return names;
}

Expected<DeviceSpec> deviceByName(std::string_view name) {
  std::string key = lower(trim(name));
  for (DeviceSpec& s : builtins())
    if (s.name == key) return std::move(s);
  return notFound("unknown device '" + std::string(name) +
                  "' (known: " + join(deviceNames(), ", ") + ")");
}

Expected<DeviceSpec> applyOverrides(DeviceSpec spec, const DeviceOverrides& o) {
  struct PeakOverride {
    const char* field;
    const std::optional<double>& value;
    double& target;
  };
  const PeakOverride peaks[] = {
      {"peak_f64", o.peak_f64, spec.peak.f64},    {"peak_f32", o.peak_f32, spec.peak.f32},
      {"peak_tf32", o.peak_tf32, spec.peak.tf32}, {"peak_bf16", o.peak_bf16, spec.peak.bf16},
      {"peak_f16", o.peak_f16, spec.peak.f16},    {"peak_i8", o.peak_i8, spec.peak.i8},
      {"hbm_gbps", o.hbm_gbps, spec.hbm_gbps},
  };
  for (const PeakOverride& p : peaks) {
    if (!p.value) continue;
    APC_RETURN_IF_ERROR(checkPositive(p.field, *p.value));
    p.target = *p.value;
  }
  if (o.compute_efficiency) {
    APC_RETURN_IF_ERROR(checkEfficiency("compute_efficiency", *o.compute_efficiency));
    spec.compute_efficiency = *o.compute_efficiency;
  }
  if (o.memory_efficiency) {
    APC_RETURN_IF_ERROR(checkEfficiency("memory_efficiency", *o.memory_efficiency));
    spec.memory_efficiency = *o.memory_efficiency;
  }
  if (o.kernel_floor_us) {
    double v = *o.kernel_floor_us;
    if (!(v >= 0) || !std::isfinite(v))
      return invalidArgument("device override kernel_floor_us must be >= 0, got " + fmt(v));
    spec.kernel_floor_us = v;
  }
  if (o.dispatch_us) {
    double v = *o.dispatch_us;
    if (!(v >= 0) || !std::isfinite(v))
      return invalidArgument("device override dispatch_us must be >= 0, got " + fmt(v));
    spec.dispatch_us = v;
  }
  if (o.dispatch_overlaps) spec.dispatch_overlaps = *o.dispatch_overlaps;
  if (o.view_dispatch_us) {
    double v = *o.view_dispatch_us;
    if (!(v >= 0) || !std::isfinite(v))
      return invalidArgument("device override view_dispatch_us must be >= 0, got " + fmt(v));
    spec.view_dispatch_us = v;
  }
  if (o.overlap_efficiency) {
    double v = *o.overlap_efficiency;
    if (!(v >= 0 && v <= 1))
      return invalidArgument("device override overlap_efficiency must be in [0, 1], got " + fmt(v));
    spec.overlap_efficiency = v;
  }
  if (o.wait_resume_us) {
    double v = *o.wait_resume_us;
    if (!(v >= 0) || !std::isfinite(v))
      return invalidArgument("device override wait_resume_us must be >= 0, got " + fmt(v));
    spec.wait_resume_us = v;
  }
  if (o.matmul_output_gbps) {
    double v = *o.matmul_output_gbps;
    if (!(v >= 0) || !std::isfinite(v))
      return invalidArgument("device override matmul_output_gbps must be >= 0, got " + fmt(v));
    spec.matmul_output_gbps = v;
  }
  for (auto [value, field, name] :
       {std::tuple{o.matvec_gbps, &spec.matvec_gbps, "matvec_gbps"},
        std::tuple{o.outer_product_gbps, &spec.outer_product_gbps, "outer_product_gbps"},
        std::tuple{o.conv_weight_gbps, &spec.conv_weight_gbps, "conv_weight_gbps"},
        std::tuple{o.conv_weight_grad_gbps, &spec.conv_weight_grad_gbps,
                   "conv_weight_grad_gbps"}}) {
    if (!value) continue;
    if (!(*value >= 0) || !std::isfinite(*value))
      return invalidArgument(std::string("device override ") + name + " must be >= 0, got " +
                             fmt(*value));
    *field = *value;
  }
  if (o.f32_uses_tf32) spec.f32_uses_tf32 = *o.f32_uses_tf32;
  return spec;
}

Status setPeakTflops(DeviceSpec& spec, std::string_view dtype_name, double tflops) {
  double* field = peakField(spec.peak, dtype_name);
  if (!field)
    return invalidArgument("no peak for dtype '" + std::string(dtype_name) +
                           "' (known: f64, f32, tf32, bf16, f16, i8)");
  std::string what = "peak_" + lower(dtype_name);
  APC_RETURN_IF_ERROR(checkPositive(what.c_str(), tflops));
  *field = tflops;
  return Status::success();
}

std::string toString(const DeviceSpec& s) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%s: bf16 %g TFLOPS, f32 %g TFLOPS%s, HBM %g GB/s, eff %.2f/%.2f, floor %.1f us",
                s.name.c_str(), s.peak.bf16, s.peakTflops(ir::DType::kF32),
                s.f32_uses_tf32 ? " (tf32)" : "", s.hbm_gbps, s.compute_efficiency,
                s.memory_efficiency, s.kernel_floor_us);
  std::string out = buf;
  if (s.dispatch_us > 0) {
    std::snprintf(buf, sizeof buf, ", dispatch %.1f us%s", s.dispatch_us,
                  s.dispatch_overlaps ? " (overlapping kernels)" : "");
    out += buf;
  }
  if (s.view_dispatch_us) {
    std::snprintf(buf, sizeof buf, ", views %.1f us", *s.view_dispatch_us);
    out += buf;
  }
  if (s.overlap_efficiency != 1.0) {
    std::snprintf(buf, sizeof buf, ", overlap %.2f", s.overlap_efficiency);
    out += buf;
  }
  if (s.wait_resume_us > 0) {
    std::snprintf(buf, sizeof buf, ", wait resume %.1f us", s.wait_resume_us);
    out += buf;
  }
  return out;
}

}  // namespace apc::cost
