//===- lib/cost/calibration.cpp - Fitting the cost model to measurements --===//
//
// The fits of apc/cost/calibration.h.
//
//===----------------------------------------------------------------------===//
#include "apc/cost/calibration.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "apc/support/strings.h"

namespace apc::cost {

AlphaBetaTerms alphaBetaTerms(CollectiveKind kind, int64_t group_size) {
  const double p = static_cast<double>(group_size);
  if (group_size <= 1) return {};
  switch (kind) {
    case CollectiveKind::kNone:
      return {};
    case CollectiveKind::kAllGather:
    case CollectiveKind::kReduceScatter:
      return {p - 1, (p - 1) / p};
    case CollectiveKind::kAllReduce:
      return {2 * (p - 1), 2 * (p - 1) / p};
    case CollectiveKind::kAllToAll:
      return {p - 1, (p - 1) / (p * p)};
  }
  return {};
}

namespace {

/// Weighted least squares of t ~ a * x + b * y over rows (x, y, t), weights 1/t; a or b may be
/// forced to zero. Returns false when the system is singular.
bool solve2(const std::vector<CollectiveSample>& rows, bool use_a, bool use_b, double& a,
            double& b) {
  double sxx = 0, sxy = 0, syy = 0, sxt = 0, syt = 0;
  for (const CollectiveSample& s : rows) {
    AlphaBetaTerms t = alphaBetaTerms(s.kind, s.group_size);
    const double w = 1.0 / (s.us * s.us);  // squared weight of a 1/t-scaled row
    const double x = use_a ? t.steps : 0.0, y = use_b ? t.fraction * s.full_bytes : 0.0;
    sxx += w * x * x;
    sxy += w * x * y;
    syy += w * y * y;
    sxt += w * x * s.us;
    syt += w * y * s.us;
  }
  a = b = 0;
  if (use_a && use_b) {
    const double det = sxx * syy - sxy * sxy;
    if (!(std::fabs(det) > 1e-12 * sxx * syy)) return false;
    a = (sxt * syy - syt * sxy) / det;
    b = (syt * sxx - sxt * sxy) / det;
    return true;
  }
  if (use_a) {
    if (!(sxx > 0)) return false;
    a = sxt / sxx;
    return true;
  }
  if (!(syy > 0)) return false;
  b = syt / syy;
  return true;
}

}  // namespace

double fittedUs(const LinkFit& fit, const CollectiveSample& s) {
  return collectiveUs(s.kind, fit.link, s.group_size, s.full_bytes);
}

Expected<LinkFit> fitLink(const std::vector<CollectiveSample>& samples) {
  if (samples.size() < 2)
    return invalidArgument("fitting a link needs at least two timed collectives, got " +
                           std::to_string(samples.size()));
  for (size_t i = 0; i < samples.size(); ++i) {
    const CollectiveSample& s = samples[i];
    const std::string where = "collective sample " + std::to_string(i);
    if (!(s.us > 0) || !std::isfinite(s.us))
      return invalidArgument(where + ": time must be positive and finite");
    if (!(s.full_bytes >= 0) || !std::isfinite(s.full_bytes))
      return invalidArgument(where + ": bytes must be non-negative and finite");
    if (s.kind == CollectiveKind::kNone || s.group_size <= 1)
      return invalidArgument(where + ": needs a collective kind and a group of two or more ranks");
  }
  bool two_sizes = false;
  for (const CollectiveSample& s : samples) two_sizes |= s.full_bytes != samples[0].full_bytes;
  if (!two_sizes)
    return invalidArgument(
        "cannot fit a bandwidth: the collectives need samples of at least two sizes");
  double a = 0, b = 0;
  bool ok = solve2(samples, true, true, a, b);
  if (!ok || a < 0 || b < 0) {
    // Keep the parameter that stays positive, refit the other alone.
    if (ok && a < 0) {
      ok = solve2(samples, false, true, a, b);
    } else if (ok && b < 0) {
      ok = solve2(samples, true, false, a, b);
    } else {
      ok = solve2(samples, false, true, a, b);
    }
  }
  if (!ok) return invalidArgument("cannot fit a link: the samples are degenerate");
  LinkFit fit;
  fit.link.latency_us = std::max(a, 0.0);
  // b is microseconds per byte; none left (times that do not grow with the bytes over the
  // measured sizes): latency-bound, the fastest link a spec may name.
  fit.link.bandwidth_gbps =
      b > 0 ? std::min(1.0 / (b * 1e3), mesh::kMaxBandwidthGbps) : mesh::kMaxBandwidthGbps;
  fit.samples = samples.size();
  double err = 0;
  for (const CollectiveSample& s : samples) err += std::fabs(fittedUs(fit, s) - s.us) / s.us;
  fit.mape_pct = 100.0 * err / static_cast<double>(samples.size());
  return fit;
}

Expected<DeviceFit> fitDevice(const std::vector<KernelSample>& samples, double floor_us) {
  if (!(floor_us >= 0) || !std::isfinite(floor_us))
    return invalidArgument("the kernel floor must be non-negative and finite");
  DeviceFit fit;
  fit.kernel_floor_us = floor_us;
  // Per dtype (and for the memory-bound kernels) the sums of r and r^2, r the measured rate: the
  // rate R minimising sum_i (w_i / R - t_i)^2 / t_i^2 over samples of work w_i is
  // sum r_i^2 / sum r_i.
  std::map<ir::DType, std::pair<double, double>> flop_sums;
  std::pair<double, double> byte_sums{0, 0};
  for (size_t i = 0; i < samples.size(); ++i) {
    const KernelSample& s = samples[i];
    if (!(s.us > 0) || !std::isfinite(s.us))
      return invalidArgument("kernel sample " + std::to_string(i) +
                             ": time must be positive and finite");
    if (s.flops > 0) {
      const double r = s.flops / (s.us * 1e6);  // flop/us -> TFLOP/s
      flop_sums[s.dtype].first += r;
      flop_sums[s.dtype].second += r * r;
    } else if (s.bytes > 0) {
      const double r = s.bytes / (s.us * 1e3);  // B/us -> GB/s
      byte_sums.first += r;
      byte_sums.second += r * r;
    }
  }
  for (const auto& [dtype, sums] : flop_sums) fit.peak_tflops[dtype] = sums.second / sums.first;
  if (fit.peak_tflops.empty()) return invalidArgument("no timed matmul to fit a peak to");
  if (!(byte_sums.first > 0))
    return invalidArgument("no timed memory-bound kernel to fit a bandwidth to");
  fit.memory_gbps = byte_sums.second / byte_sums.first;
  return fit;
}

Expected<double> overlapEfficiency(double compute_us, double comm_us, double both_us) {
  for (double t : {compute_us, comm_us, both_us})
    if (!(t > 0) || !std::isfinite(t))
      return invalidArgument("overlap: times must be positive and finite, got compute " +
                             formatNumber(compute_us) + " us, collective " + formatNumber(comm_us) +
                             " us, both " + formatNumber(both_us) + " us");
  const double e = (compute_us + comm_us - both_us) / std::min(compute_us, comm_us);
  return std::clamp(e, 0.0, 1.0);
}

Expected<double> fitExtraRateGbps(const std::vector<ExtraSample>& samples) {
  double n = 0, sx = 0, sy = 0;
  for (const ExtraSample& s : samples) {
    if (!(s.bytes >= 0) || !std::isfinite(s.bytes) || !std::isfinite(s.extra_us))
      return invalidArgument("extra-time sample with bytes " + std::to_string(s.bytes) +
                             " and extra " + std::to_string(s.extra_us) + " us");
    n += 1;
    sx += s.bytes;
    sy += s.extra_us;
  }
  if (n < 2) return invalidArgument("fitting an extra-time rate needs at least two samples");
  const double mx = sx / n, my = sy / n;
  double sxx = 0, sxy = 0;
  for (const ExtraSample& s : samples) {
    sxx += (s.bytes - mx) * (s.bytes - mx);
    sxy += (s.bytes - mx) * (s.extra_us - my);
  }
  if (!(sxx > 0)) return invalidArgument("fitting an extra-time rate needs samples of two sizes");
  const double us_per_byte = sxy / sxx;
  if (!(us_per_byte > 0)) return 0.0;
  return 1.0 / (us_per_byte * 1e3);  // bytes per us / 1e3 = GB/s
}

std::vector<double> monotoneUs(const std::vector<double>& us) {
  // Blocks of pooled values: (mean, count); merge while a block's mean exceeds the next one's.
  std::vector<std::pair<double, size_t>> blocks;
  for (double v : us) {
    blocks.push_back({v, 1});
    while (blocks.size() >= 2 && blocks[blocks.size() - 2].first > blocks.back().first) {
      auto [m2, n2] = blocks.back();
      blocks.pop_back();
      auto& [m1, n1] = blocks.back();
      m1 = (m1 * static_cast<double>(n1) + m2 * static_cast<double>(n2)) /
           static_cast<double>(n1 + n2);
      n1 += n2;
    }
  }
  std::vector<double> out;
  out.reserve(us.size());
  for (const auto& [m, n] : blocks) out.insert(out.end(), n, m);
  return out;
}

}  // namespace apc::cost
