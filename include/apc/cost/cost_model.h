//===- apc/cost/cost_model.h - The one seam through which plans are priced --===//
//
// CostModel prices what a plan runs, for every client: strategy enumeration (compute of each op
// and the collectives inside an op), the problem builder and lowering (redistributions), explain
// and the artifact's predictions. It is built from a spec (costModelFor): the device's roofline
// (apc/cost/compute.h) and, per mesh dim, the alpha-beta link of apc/cost/collectives.h with the
// spec's refinements (spec::MeshDimNetwork):
//   - measured times per collective kind (apc calibrate's tables) for groups of the measured size:
//     interpolated in log-log between measured sizes, the first time below the smallest, and
//     proportionally to the bytes above the largest (bandwidth-bound);
//   - else a link per collective kind (apc calibrate fits each: on Gloo an all-gather is not half
//     an all-reduce), else the mesh dim's link;
//   - (compute) the device's measured curves, when it has them: matmul time by flops per dtype
//     for contractions, elementwise time by bytes for the rest, interpolated as the tables;
//   - topology: when a mesh dim's groups span nodes (ranks_per_node q < group size p, q dividing
//     p), collectives are hierarchical, inside a node on the kind's link, between nodes on
//     inter_node (r = p / q nodes):
//       all-gather(n)      inter all-gather(r, n/q), then intra all-gather(q, n)
//       reduce-scatter(n)  intra reduce-scatter(q, n), then inter reduce-scatter(r, n/q)
//       all-reduce(n)      intra reduce-scatter(q, n), inter all-reduce(r, n/q), intra all-gather
//       all-to-all(n)      (q-1) intra steps of n/p^2 and (p-q) inter steps of n/p^2
//     A q that does not divide p prices the whole group on inter_node.
// A calibrated device adds to every collective call the compute its rank loses after the wait
// (DeviceSpec::wait_resume_us; 0 on the datasheet devices).
// Without refinements every price is exactly the free functions' (collectiveUs over the mesh
// dim's link, computeCostUs over the device): plans made through the seam are byte-identical to
// plans made before it.
//
// No LibTorch: the planner core prices through this; the runtime only reads prices from artifacts.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "apc/cost/collectives.h"
#include "apc/cost/compute.h"
#include "apc/cost/device.h"
#include "apc/mesh/device_mesh.h"
#include "apc/spec/spec.h"
#include "apc/support/error.h"

namespace apc::cost {

class CostModel {
 public:
  /// The analytical model over the mesh's own links (no refinements) and `device`.
  CostModel(DeviceSpec device, const mesh::DeviceMesh& mesh);
  /// With per mesh dim refinements: `network` is empty or has one entry per mesh dim.
  CostModel(DeviceSpec device, const mesh::DeviceMesh& mesh,
            std::vector<spec::MeshDimNetwork> network);

  const DeviceSpec& device() const { return device_; }
  size_t ndim() const { return links_.size(); }

  /// Roofline time of one kernel (computeCostUs).
  double computeUs(double flops, double bytes, ir::DType dtype) const {
    return computeCostUs(device_, flops, bytes, dtype);
  }
  /// The time of one kernel of `family`: the device's measured curves where it has them (a
  /// contraction by its flops in the matmul curve of its dtype, any other kernel by its bytes in
  /// the elementwise curve; interpolated, never below the kernel floor), else the roofline. A
  /// contraction is never priced below its bytes in the elementwise curve either (the roofline's
  /// memory term: a batched matvec that reads a weight matrix per token is memory-bound, where the
  /// square matmuls of the curve are not).
  double computeUs(OpFamily family, double flops, double bytes, ir::DType dtype) const;
  /// The forward kernel of op `op` (a node's op, "aten::tanh") moving `bytes`, from the device's
  /// measured curve of that op (DeviceSpec::op_curves, interpolated, never below the kernel
  /// floor); nullopt where it has none.
  std::optional<double> opKernelUs(const std::string& op, double bytes) const;
  /// Whether the device has measured op nodes (DeviceSpec::node_us).
  bool hasMeasuredNodes() const { return !device_.node_us.empty(); }
  /// The measured {forward, backward} passes of the op node with strategy::nodeTimeKey `key`;
  /// nullopt where not measured.
  std::optional<std::array<double, 2>> measuredNodeUs(const std::string& key) const {
    auto it = device_.node_us.find(key);
    if (it == device_.node_us.end()) return std::nullopt;
    return it->second;
  }
  /// The backward of a node of `family` whose forward takes `forward_us`.
  double backwardUs(OpFamily family, double forward_us) const {
    return backwardComputeUs(family, forward_us);
  }
  /// One pass (forward, or backward) of an op node whose kernels take `kernel_us`, with its host
  /// dispatch (DeviceSpec::dispatch_us): their sum, or where the host runs ahead of the device
  /// (DeviceSpec::dispatch_overlaps) the larger of the two.
  double passUs(double kernel_us) const {
    return device_.dispatch_overlaps ? std::max(kernel_us, device_.dispatch_us)
                                     : kernel_us + device_.dispatch_us;
  }
  /// A kernel the runtime calls through ATen directly, outside the interpreter and autograd (the
  /// optimizer's): on the CPU the kernel and a node's dispatch; where the host runs ahead, the
  /// kernel alone, whose launch its kernel floor holds (calibrated on CUDA as an add's host time
  /// less a view's). H200: SGD on gpt2_small's 148 parameters took 2.0 ms, where a node's
  /// dispatch per kernel predicted 5.1.
  double directKernelUs(double kernel_us) const {
    return device_.dispatch_overlaps ? kernel_us : kernel_us + device_.dispatch_us;
  }
  /// What writing `bytes` of a contraction's output adds to its flops' price
  /// (DeviceSpec::matmul_output_gbps; 0 where not measured).
  double matmulOutputUs(double bytes) const {
    return bytes > 0 && device_.matmul_output_gbps > 0 ? bytes / (device_.matmul_output_gbps * 1e3)
                                                       : 0.0;
  }
  /// A matrix-vector product reading `matrix_bytes` (DeviceSpec::matvec_gbps), or nullopt where
  /// not measured.
  std::optional<double> matvecUs(double matrix_bytes) const {
    if (!(device_.matvec_gbps > 0)) return std::nullopt;
    return matrix_bytes / (device_.matvec_gbps * 1e3);
  }
  /// An outer product writing `output_bytes` (DeviceSpec::outer_product_gbps), or nullopt where
  /// not measured.
  std::optional<double> outerProductUs(double output_bytes) const {
    if (!(device_.outer_product_gbps > 0)) return std::nullopt;
    return output_bytes / (device_.outer_product_gbps * 1e3);
  }
  /// What a convolution with `weight_bytes` of local weight costs beyond its flops, forward or
  /// backward (DeviceSpec::conv_weight_gbps, conv_weight_grad_gbps); 0 where the device has none.
  double convWeightUs(double weight_bytes, bool backward) const {
    const double gbps = backward ? device_.conv_weight_grad_gbps : device_.conv_weight_gbps;
    return gbps > 0 && weight_bytes > 0 ? weight_bytes / (gbps * 1e3) : 0.0;
  }
  /// A node whose op runs no kernel (OpFamily::kView): its dispatch, forward and again backward
  /// when `backward` (DeviceSpec::view_dispatch_us, else dispatch_us).
  double viewNodeUs(bool backward) const {
    return device_.view_dispatch_us ? *device_.view_dispatch_us * (backward ? 2 : 1)
                                    : nodeUs(0, 0, backward);
  }
  /// An op node's forward pass, and its backward pass when `backward` (passUs of each).
  double nodeUs(double forward_kernel_us, double backward_kernel_us, bool backward) const {
    if (device_.dispatch_overlaps)
      return passUs(forward_kernel_us) + (backward ? passUs(backward_kernel_us) : 0.0);
    return forward_kernel_us + (backward ? backward_kernel_us : 0.0) +
           device_.dispatch_us * (backward ? 2 : 1);
  }
  /// One collective call of `kind` on a group of `group_size` ranks along `mesh_dim`, with the
  /// full bytes of collectives.h, as the rank pays it: its time on the wire (wireUs) and the
  /// compute the rank loses after waiting for it (DeviceSpec::wait_resume_us). kNone and groups
  /// of one cost 0.
  double collectiveUs(CollectiveKind kind, size_t mesh_dim, int64_t group_size,
                      double full_bytes) const;
  /// The call's time on the wire alone: the measured tables, the links, the topology.
  double wireUs(CollectiveKind kind, size_t mesh_dim, int64_t group_size, double full_bytes) const;
  /// One local copy of `bytes` (read once, written once) that a redistribution step makes beside
  /// its collective (an all-reduce's clone, a local slice made contiguous, a gathered dim moved
  /// back into place): the device's measured elementwise curve at twice the bytes, never below
  /// the kernel floor; 0 on a device without a measured curve (the datasheet devices price a
  /// redistribution's collectives alone: their copies run at HBM rates, a small share).
  double localCopyUs(double bytes) const;
  /// The link a collective of `kind` uses within a node of `mesh_dim`.
  const mesh::LinkParams& link(CollectiveKind kind, size_t mesh_dim) const;

  /// "cpu: bf16 0.1 TFLOPS, ...; mesh dim 0 0.823 GB/s, 183.6 us", a refined dim with its link per
  /// kind ("mesh dim 0 all-gather 0.3 GB/s, 250 us, reduce-scatter ...") and its topology.
  std::string describe() const;

 private:
  struct Dim {
    std::array<mesh::LinkParams, 4> by_kind;  // all-gather, reduce-scatter, all-reduce, all-to-all
    std::array<std::optional<spec::CollectiveTable>, 4> tables;
    bool refined = false;  // some kind has a link of its own
    int64_t ranks_per_node = 0;
    mesh::LinkParams inter_node;
  };
  DeviceSpec device_;
  std::vector<Dim> links_;
};

/// The spec's device (built-in kind with its overrides) as the cost model takes it.
Expected<DeviceSpec> deviceForSpec(const spec::Spec& spec);
/// The cost model of a spec: its device, mesh links and network. Errors: an unknown device kind,
/// a bad override, a network whose length is not the mesh's number of dims.
Expected<CostModel> costModelFor(const spec::Spec& spec);

}  // namespace apc::cost
