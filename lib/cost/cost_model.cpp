//===- lib/cost/cost_model.cpp - The one seam through which plans are priced --===//
//
// See apc/cost/cost_model.h.
//
//===----------------------------------------------------------------------===//
#include "apc/cost/cost_model.h"

#include "apc/support/strings.h"

#include <cmath>

namespace apc::cost {

namespace {

int kindIndex(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllGather:
      return 0;
    case CollectiveKind::kReduceScatter:
      return 1;
    case CollectiveKind::kAllReduce:
      return 2;
    case CollectiveKind::kAllToAll:
      return 3;
    case CollectiveKind::kNone:
      break;
  }
  return -1;
}

/// The measured time at `v` (x ascending, at least two points): log-log interpolation between
/// the measured points, the first time below the smallest, proportional above the largest.
double interpolate(const std::vector<double>& x, const std::vector<double>& us, double v) {
  const size_t last = x.size() - 1;
  if (!(v > x[0])) return us[0];
  if (v >= x[last]) return us[last] * (v / x[last]);
  size_t i = 0;
  while (i + 1 < last && v >= x[i + 1]) ++i;
  const double f = (std::log(v) - std::log(x[i])) / (std::log(x[i + 1]) - std::log(x[i]));
  return std::exp(std::log(us[i]) + f * (std::log(us[i + 1]) - std::log(us[i])));
}

}  // namespace

CostModel::CostModel(DeviceSpec device, const mesh::DeviceMesh& mesh)
    : CostModel(std::move(device), mesh, {}) {}

CostModel::CostModel(DeviceSpec device, const mesh::DeviceMesh& mesh,
                     std::vector<spec::MeshDimNetwork> network)
    : device_(std::move(device)) {
  links_.resize(mesh.ndim());
  for (size_t m = 0; m < mesh.ndim(); ++m) {
    Dim& d = links_[m];
    d.by_kind.fill(mesh.link(m));
    if (m >= network.size()) continue;
    const spec::MeshDimNetwork& n = network[m];
    for (size_t k = 0; k < 4; ++k) {
      if (n.by_kind[k]) {
        d.by_kind[k] = *n.by_kind[k];
        d.refined = true;
      }
      if (n.tables[k] && n.tables[k]->bytes.size() >= 2 &&
          n.tables[k]->bytes.size() == n.tables[k]->us.size())
        d.tables[k] = n.tables[k];
    }
    if (n.ranks_per_node > 0 && n.inter_node) {
      d.ranks_per_node = n.ranks_per_node;
      d.inter_node = *n.inter_node;
    }
  }
}

double CostModel::computeUs(OpFamily family, double flops, double bytes, ir::DType dtype) const {
  if (flops <= 0 && bytes <= 0) return 0.0;
  const bool contraction = family == OpFamily::kContraction || family == OpFamily::kAttention ||
                           family == OpFamily::kConvolution;
  // The memory term of a measured contraction: its bytes as the elementwise kernels move them.
  const double memory_us =
      bytes > 0 && !device_.elementwise_curve.empty()
          ? interpolate(device_.elementwise_curve.x, device_.elementwise_curve.us, bytes)
          : 0.0;
  for (const auto& [own, curves] : {std::pair{OpFamily::kConvolution, &device_.conv_curve},
                                    std::pair{OpFamily::kAttention, &device_.attention_curve}}) {
    if (family != own || flops <= 0) continue;
    auto it = curves->find(dtype);
    if (it != curves->end() && !it->second.empty())
      return std::max(
          {interpolate(it->second.x, it->second.us, flops), memory_us, device_.kernel_floor_us});
  }
  if (contraction && flops > 0) {
    auto it = device_.matmul_curve.find(dtype);
    if (it != device_.matmul_curve.end() && !it->second.empty())
      return std::max(
          {interpolate(it->second.x, it->second.us, flops), memory_us, device_.kernel_floor_us});
  } else if (!contraction && bytes > 0 && !device_.elementwise_curve.empty()) {
    return std::max(interpolate(device_.elementwise_curve.x, device_.elementwise_curve.us, bytes),
                    device_.kernel_floor_us);
  }
  return computeCostUs(device_, flops, bytes, dtype);
}

double CostModel::localCopyUs(double bytes) const {
  if (!(bytes > 0) || device_.elementwise_curve.empty()) return 0.0;
  return std::max(interpolate(device_.elementwise_curve.x, device_.elementwise_curve.us, 2 * bytes),
                  device_.kernel_floor_us);
}

std::optional<double> CostModel::opKernelUs(const std::string& op, double bytes) const {
  auto it = device_.op_curves.find(op);
  if (it == device_.op_curves.end() || it->second.empty() || bytes <= 0) return std::nullopt;
  return std::max(interpolate(it->second.x, it->second.us, bytes), device_.kernel_floor_us);
}

const mesh::LinkParams& CostModel::link(CollectiveKind kind, size_t mesh_dim) const {
  const int k = kindIndex(kind);
  return links_.at(mesh_dim).by_kind[static_cast<size_t>(k < 0 ? 0 : k)];
}

double CostModel::collectiveUs(CollectiveKind kind, size_t mesh_dim, int64_t p,
                               double full_bytes) const {
  if (kind == CollectiveKind::kNone || p <= 1) return 0.0;
  return device_.wait_resume_us + wireUs(kind, mesh_dim, p, full_bytes);
}

double CostModel::wireUs(CollectiveKind kind, size_t mesh_dim, int64_t p, double full_bytes) const {
  const Dim& d = links_[mesh_dim];
  const mesh::LinkParams& intra = d.by_kind[static_cast<size_t>(kindIndex(kind))];
  const int64_t q = d.ranks_per_node;
  if (q <= 0 || q >= p) {
    const auto& table = d.tables[static_cast<size_t>(kindIndex(kind))];
    if (table && table->group_size == p) return interpolate(table->bytes, table->us, full_bytes);
    return cost::collectiveUs(kind, intra, p, full_bytes);
  }
  if (p % q != 0) return cost::collectiveUs(kind, d.inter_node, p, full_bytes);
  const int64_t r = p / q;
  const double qd = static_cast<double>(q);
  const mesh::LinkParams& inter = d.inter_node;
  switch (kind) {
    case CollectiveKind::kAllGather:
      return allGatherUs(inter, r, full_bytes / qd) + allGatherUs(intra, q, full_bytes);
    case CollectiveKind::kReduceScatter:
      return reduceScatterUs(intra, q, full_bytes) + reduceScatterUs(inter, r, full_bytes / qd);
    case CollectiveKind::kAllReduce:
      // Its intra-node halves on the reduce-scatter and all-gather links.
      return reduceScatterUs(d.by_kind[1], q, full_bytes) + allReduceUs(inter, r, full_bytes / qd) +
             allGatherUs(d.by_kind[0], q, full_bytes);
    case CollectiveKind::kAllToAll: {
      // Every rank sends n/p^2 to each of the p-1 others: q-1 of them in its node.
      const double pd = static_cast<double>(p), piece = full_bytes / (pd * pd);
      if (!(intra.bandwidth_gbps > 0) || !(inter.bandwidth_gbps > 0))
        return cost::collectiveUs(kind, intra, p, full_bytes);
      return (qd - 1) * (intra.latency_us + piece / (intra.bandwidth_gbps * 1e3)) +
             (pd - qd) * (inter.latency_us + piece / (inter.bandwidth_gbps * 1e3));
    }
    case CollectiveKind::kNone:
      break;
  }
  return 0.0;
}

std::string CostModel::describe() const {
  std::string s = toString(device_);
  auto link = [](const mesh::LinkParams& l) {
    return formatNumber(l.bandwidth_gbps) + " GB/s, " + formatNumber(l.latency_us) + " us";
  };
  static constexpr CollectiveKind kKinds[4] = {
      CollectiveKind::kAllGather, CollectiveKind::kReduceScatter, CollectiveKind::kAllReduce,
      CollectiveKind::kAllToAll};
  for (size_t m = 0; m < links_.size(); ++m) {
    const Dim& d = links_[m];
    s += "; mesh dim " + std::to_string(m) + " ";
    bool measured = false;
    for (const auto& t : d.tables) measured |= t.has_value();
    if (!d.refined && !measured) {
      s += link(d.by_kind[0]);
    } else {
      for (size_t k = 0; k < 4; ++k)
        s += std::string(k ? ", " : "") + collectiveName(kKinds[k]) + " " +
             (d.tables[k] ? "measured (" + std::to_string(d.tables[k]->bytes.size()) + " sizes, " +
                                std::to_string(d.tables[k]->group_size) + " ranks)"
                          : link(d.by_kind[k]));
    }
    if (d.ranks_per_node > 0)
      s += " (" + std::to_string(d.ranks_per_node) + " ranks per node, between nodes " +
           link(d.inter_node) + ")";
  }
  return s;
}

Expected<DeviceSpec> deviceForSpec(const spec::Spec& spec) {
  APC_ASSIGN_OR_RETURN(DeviceSpec d, deviceByName(spec.device));
  // A built-in kind that stands for a measured profile (the "cpu" of this project's machines)
  // is that profile, unless the spec describes its device itself.
  const spec::ClusterProfile* builtin = spec::builtinClusterProfile(spec.device);
  const spec::DeviceOverrides& given =
      builtin && spec.device_overrides.empty() ? builtin->device_overrides : spec.device_overrides;
  for (const auto& [dtype, tflops] : given.peak_tflops)
    APC_RETURN_IF_ERROR(setPeakTflops(d, ir::dtypeName(dtype), tflops));
  DeviceOverrides o;
  o.hbm_gbps = given.hbm_bandwidth_gbps;
  o.compute_efficiency = given.compute_efficiency;
  o.memory_efficiency = given.memory_efficiency;
  o.kernel_floor_us = given.kernel_floor_us;
  o.dispatch_us = given.dispatch_us;
  o.dispatch_overlaps = given.dispatch_overlaps;
  o.view_dispatch_us = given.view_dispatch_us;
  o.overlap_efficiency = given.overlap_efficiency;
  o.wait_resume_us = given.wait_resume_us;
  o.matmul_output_gbps = given.matmul_output_gbps;
  o.matvec_gbps = given.matvec_gbps;
  o.outer_product_gbps = given.outer_product_gbps;
  o.conv_weight_gbps = given.conv_weight_gbps;
  o.conv_weight_grad_gbps = given.conv_weight_grad_gbps;
  APC_ASSIGN_OR_RETURN(d, applyOverrides(std::move(d), o));
  for (const auto& [dtype, t] : given.matmul_us) d.matmul_curve[dtype] = KernelCurve{t.work, t.us};
  for (const auto& [dtype, t] : given.conv_us) d.conv_curve[dtype] = KernelCurve{t.work, t.us};
  for (const auto& [dtype, t] : given.attention_us)
    d.attention_curve[dtype] = KernelCurve{t.work, t.us};
  for (const auto& [op, t] : given.op_us) d.op_curves[op] = KernelCurve{t.work, t.us};
  if (const auto& t = given.elementwise_us) d.elementwise_curve = KernelCurve{t->work, t->us};
  d.node_us = given.node_us;
  return d;
}

Expected<CostModel> costModelFor(const spec::Spec& spec) {
  APC_ASSIGN_OR_RETURN(DeviceSpec device, deviceForSpec(spec));
  if (!spec.network.empty() && spec.network.size() != spec.mesh.ndim())
    return invalidArgument("the spec's network has " + std::to_string(spec.network.size()) +
                           " entries but the mesh " + spec.mesh.toString() + " has " +
                           std::to_string(spec.mesh.ndim()) + " dims");
  // The built-in profile's link (and its measured collectives) on every mesh dim the spec leaves
  // at the default link without network refinements: a "cpu" mesh's ranks talk over Gloo's
  // loopback, not NVLink.
  const spec::ClusterProfile* builtin = spec::builtinClusterProfile(spec.device);
  if (!builtin || !spec.network.empty())
    return CostModel(std::move(device), spec.mesh, spec.network);
  mesh::DeviceMesh mesh = spec.mesh;
  const std::vector<mesh::LinkParams> defaults = mesh::defaultLinks(mesh.ndim());
  std::vector<spec::MeshDimNetwork> network(mesh.ndim());
  bool any = false;
  for (size_t m = 0; m < mesh.ndim(); ++m) {
    if (!(mesh.link(m) == defaults[m])) continue;
    mesh.setLink(m, builtin->links.front());
    if (!builtin->network.empty()) network[m] = builtin->network.front();
    any = true;
  }
  if (!any) return CostModel(std::move(device), spec.mesh, spec.network);
  return CostModel(std::move(device), mesh, std::move(network));
}

}  // namespace apc::cost
