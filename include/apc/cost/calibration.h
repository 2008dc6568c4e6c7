//===- apc/cost/calibration.h - Fitting the cost model to measurements ----===//
//
// `apc calibrate` measures, on the ranks' own device, kernels and collectives; this file turns the
// measurements into the cost model's parameters (no LibTorch here: the fits are plain arithmetic,
// tested on synthetic data).
//
// Collectives: per mesh dim, every (kind, group size p, full bytes n, measured us) sample is
// explained by the alpha-beta formulas of apc/cost/collectives.h,
//   t = steps(kind, p) * alpha + fraction(kind, p) * n * (1 / beta),
// so (alpha, 1/beta) is a linear least-squares fit over all kinds at once. Each row is weighted by
// 1/t (the fit minimises relative errors, so 4 KiB messages count as much as 256 MiB ones), and
// both parameters are kept non-negative (a negative one is fixed at 0 and the other refitted).
// Times that do not grow with the bytes over the measured sizes give a latency-only link whose
// bandwidth is mesh::kMaxBandwidthGbps.
//
// Compute: the roofline of apc/cost/compute.h with measured rates (efficiencies 1): per dtype the
// matmul throughput, and the elementwise bandwidth, that minimise the relative error of
// t = work / rate over the timed sizes (sum r^2 / sum r over the measured rates r); the time of a
// minimal op is the kernel floor.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "apc/cost/collectives.h"
#include "apc/ir/types.h"
#include "apc/mesh/device_mesh.h"
#include "apc/support/error.h"

namespace apc::cost {

/// One timed collective on a group of `group_size` ranks; `full_bytes` as in collectives.h.
struct CollectiveSample {
  CollectiveKind kind = CollectiveKind::kAllGather;
  int64_t group_size = 2;
  double full_bytes = 0;
  double us = 0;
};

/// The latency steps and bandwidth fraction of the ring formulas: t = steps * alpha + fraction *
/// n / beta. (0, 0) for kNone or a group of one.
struct AlphaBetaTerms {
  double steps = 0;
  double fraction = 0;
};
AlphaBetaTerms alphaBetaTerms(CollectiveKind kind, int64_t group_size);

struct LinkFit {
  mesh::LinkParams link;  // bandwidth_gbps (GB/s), latency_us
  /// Mean absolute percentage error of the fitted formulas over the samples.
  double mape_pct = 0;
  size_t samples = 0;
};

/// Fits one link to the samples of one mesh dim. Errors (kInvalidArgument): fewer than two
/// samples, a sample with a non-positive or non-finite time, negative bytes, a kind of kNone or a
/// group of one, or samples all of one size ("needs samples of at least two sizes").
Expected<LinkFit> fitLink(const std::vector<CollectiveSample>& samples);

/// The fitted formula's time for one sample (collectiveUs over the fitted link).
double fittedUs(const LinkFit& fit, const CollectiveSample& s);

/// One timed kernel: a matmul-class op (flops > 0) or a memory-bound one (flops == 0).
struct KernelSample {
  double flops = 0;
  double bytes = 0;  // read + written
  ir::DType dtype = ir::DType::kF32;
  double us = 0;
};

struct DeviceFit {
  std::map<ir::DType, double> peak_tflops;  // fitted throughput per dtype of flops > 0
  double memory_gbps = 0;                   // fitted bandwidth of memory-bound kernels
  double kernel_floor_us = 0;               // the floor given to fitDevice
};

/// Fits the roofline's peaks to kernel samples; `floor_us` is the measured time of a minimal op.
/// Errors: no compute sample, no memory-bound sample, a non-positive time, a negative floor.
Expected<DeviceFit> fitDevice(const std::vector<KernelSample>& samples, double floor_us);

/// The share of a collective's time that compute running beside it does not pay
/// (DeviceSpec::overlap_efficiency), from a compute loop alone (`compute_us`), the collective
/// alone (`comm_us`) and the collective issued asynchronously with the loop run before its wait
/// (`both_us`): (compute + comm - both) / min(compute, comm), clamped to [0, 1]. 1 when the two
/// ran side by side (both = the longer), 0 when they took turns (both = their sum). Errors: a
/// time that is not positive and finite.
Expected<double> overlapEfficiency(double compute_us, double comm_us, double both_us);

/// One kernel timed beyond what its flops explain: `bytes` of the operand whose size sets the
/// rest (a convolution's weight), `extra_us` its time minus the flops' price.
struct ExtraSample {
  double bytes = 0;
  double extra_us = 0;
};

/// The rate in GB/s at which the samples' extra time grows with their bytes
/// (DeviceSpec::conv_weight_gbps): the slope of the least-squares line extra = a + bytes / rate
/// (the intercept a is the per-call time the floor and dispatch price already). 0 where the extra
/// does not grow with the bytes (a slope <= 0: the flops explain the times). Errors: fewer than
/// two samples of different sizes, a negative or non-finite value.
Expected<double> fitExtraRateGbps(const std::vector<ExtraSample>& samples);

/// The least-squares non-decreasing sequence closest to `us` (pool-adjacent-violators): the
/// times of a measured table in ascending order of size, made monotone. A larger message or
/// kernel never takes less time; on a shared machine single sizes land in slow or fast bands (a
/// 4 KiB all-reduce measured 341 us in one calibration and 2480 us in the next), and pooling the
/// violators averages them with their neighbours instead of interpolating through the spike.
std::vector<double> monotoneUs(const std::vector<double>& us);

}  // namespace apc::cost
