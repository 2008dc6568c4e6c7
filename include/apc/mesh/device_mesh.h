//===- apc/mesh/device_mesh.h - Logical device meshes ----------------------===//
//
// A DeviceMesh is an n-d array of ranks in row-major order (rank = linear index of its coordinate),
// with a name per dim ("dp", "tp") and per-dim link parameters used by the cost model. The rank
// group of mesh dim d for a rank is the set of ranks that differ from it only in coordinate d;
// those groups become the process groups of the runtime.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "apc/support/error.h"

namespace apc::mesh {

/// Limits of a mesh: dims, devices, and the sane range of its link parameters (the spec's and the
/// CLI's readers check them; beyond them the cost model's numbers overflow or lose all meaning).
inline constexpr size_t kMaxMeshDims = 4;
inline constexpr int64_t kMaxWorldSize = 65536;
inline constexpr double kMinBandwidthGbps = 1e-3;  // 1 MB/s
inline constexpr double kMaxBandwidthGbps = 1e6;   // 1 PB/s
inline constexpr double kMaxLatencyUs = 1e6;       // 1 s

/// Link parameters of one mesh dimension (alpha-beta model).
struct LinkParams {
  double bandwidth_gbps = 0;  // bytes per second / 1e9 (GB/s), per rank, in each direction
  double latency_us = 0;      // alpha: per-step latency in microseconds
};

class DeviceMesh {
 public:
  DeviceMesh() = default;
  /// Names default to "d0", "d1", ...; links to the defaults of `defaultLinks`. At most
  /// kMaxMeshDims dims and kMaxWorldSize devices in all.
  static Expected<DeviceMesh> create(std::vector<int64_t> shape,
                                     std::vector<std::string> names = {});
  /// Parses "2x4" (or "8", "2x2x2"); names from a comma list ("dp,tp"), may be empty.
  static Expected<DeviceMesh> parse(std::string_view shape_text, std::string_view names_text = {});

  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<std::string>& names() const { return names_; }
  size_t ndim() const { return shape_.size(); }
  int64_t size(size_t dim) const { return shape_.at(dim); }
  int64_t worldSize() const;
  /// Index of a dim by name, or an error naming the unknown name.
  Expected<size_t> dimIndex(std::string_view name) const;

  std::vector<int64_t> coordinate(int64_t rank) const;
  int64_t rank(const std::vector<int64_t>& coordinate) const;
  /// The ranks that share every coordinate of `rank` except dim `dim`, in coordinate order.
  std::vector<int64_t> groupOf(int64_t rank, size_t dim) const;
  /// All distinct groups of mesh dim `dim`, each in coordinate order, ordered by their first rank.
  std::vector<std::vector<int64_t>> groups(size_t dim) const;

  const LinkParams& link(size_t dim) const { return links_.at(dim); }
  void setLink(size_t dim, LinkParams p) { links_.at(dim) = p; }

  /// "2x4(dp,tp)".
  std::string toString() const;
  bool operator==(const DeviceMesh&) const;  // defaulted in the .cpp (C++17 users)

 private:
  std::vector<int64_t> shape_;
  std::vector<std::string> names_;
  std::vector<LinkParams> links_;
};

/// Default links: the last mesh dim intra-node (NVLink class: 450 GB/s, 2 us), the others
/// network class (50 GB/s, 10 us); a 1-d mesh is intra-node.
std::vector<LinkParams> defaultLinks(size_t ndim);

bool operator==(const LinkParams& a, const LinkParams& b);

}  // namespace apc::mesh
