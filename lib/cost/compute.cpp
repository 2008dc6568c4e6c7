//===- lib/cost/compute.cpp - Roofline, backward multiples, local pieces --===//
//
// The compute roofline of apc/cost/compute.h and the layout arithmetic of apc/layout/layout.h.
//
//===----------------------------------------------------------------------===//
#include <algorithm>

#include "apc/cost/compute.h"
#include "apc/layout/layout.h"

namespace apc::cost {

// Memberwise equality, defaulted here rather than in the header so that the header stays
// C++17 (installed headers, apcConfig.cmake).

const char* opFamilyName(OpFamily family) {
  switch (family) {
    case OpFamily::kContraction:
      return "contraction";
    case OpFamily::kConvolution:
      return "convolution";
    case OpFamily::kAttention:
      return "attention";
    case OpFamily::kPointwise:
      return "pointwise";
    case OpFamily::kReduction:
      return "reduction";
    case OpFamily::kNormalization:
      return "normalization";
    case OpFamily::kSoftmax:
      return "softmax";
    case OpFamily::kView:
      return "view";
    case OpFamily::kEmbedding:
      return "embedding";
    case OpFamily::kIndex:
      return "index";
    case OpFamily::kLoss:
      return "loss";
    case OpFamily::kFactory:
      return "factory";
    case OpFamily::kOther:
      return "other";
  }
  return "other";
}

double backwardMultiplier(OpFamily family) {
  switch (family) {
    case OpFamily::kContraction:
    case OpFamily::kConvolution:
      return 2.0;
    case OpFamily::kAttention:
      return 2.5;
    case OpFamily::kNormalization:
      return 2.0;
    case OpFamily::kView:
    case OpFamily::kFactory:
      return 0.0;
    case OpFamily::kPointwise:
    case OpFamily::kReduction:
    case OpFamily::kSoftmax:
    case OpFamily::kEmbedding:
    case OpFamily::kIndex:
    case OpFamily::kLoss:
    case OpFamily::kOther:
      return 1.0;
  }
  return 1.0;
}

int backwardKernels(OpFamily family) {
  switch (family) {
    case OpFamily::kContraction:
      return 2;
    case OpFamily::kView:
    case OpFamily::kFactory:
      return 0;
    default:
      return 1;
  }
}

double computeCostUs(const DeviceSpec& device, double flops, double bytes, ir::DType dtype) {
  if (flops <= 0 && bytes <= 0) return 0.0;
  double compute_us = 0.0;
  if (flops > 0)  // TFLOPS * 1e12 flop/s = TFLOPS * 1e6 flop/us
    compute_us = flops / (device.peakTflops(dtype) * device.compute_efficiency * 1e6);
  double memory_us = 0.0;
  if (bytes > 0)  // GB/s * 1e9 B/s = GB/s * 1e3 B/us
    memory_us = bytes / (device.hbm_gbps * device.memory_efficiency * 1e3);
  return std::max({compute_us, memory_us, device.kernel_floor_us});
}

double backwardComputeUs(OpFamily family, double forward_us) {
  return backwardMultiplier(family) * forward_us;
}

double localNumel(const ir::TensorMeta& global, const mesh::PlacementTuple& placements,
                  const mesh::DeviceMesh& mesh) {
  double n = 1.0;
  for (size_t d = 0; d < global.shape.size(); ++d) {
    int64_t f = 1;
    for (size_t m = 0; m < placements.size(); ++m)
      if (placements[m].isShard(static_cast<int>(d))) f *= mesh.size(m);
    n *= static_cast<double>((global.shape[d].size + f - 1) / f);
  }
  return n;
}

}  // namespace apc::cost
