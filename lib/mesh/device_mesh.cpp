//===- lib/mesh/device_mesh.cpp - Logical device meshes --------------------===//
#include "apc/mesh/device_mesh.h"

#include <set>

#include "apc/support/file_io.h"
#include "apc/support/strings.h"

namespace apc::mesh {

// Memberwise equality, defaulted here rather than in the header so that the header stays
// C++17 (installed headers, apcConfig.cmake).
bool DeviceMesh::operator==(const DeviceMesh&) const = default;

bool operator==(const LinkParams& a, const LinkParams& b) {
  return a.bandwidth_gbps == b.bandwidth_gbps && a.latency_us == b.latency_us;
}

std::vector<LinkParams> defaultLinks(size_t ndim) {
  std::vector<LinkParams> links(ndim, LinkParams{50.0, 10.0});
  if (ndim > 0) links.back() = LinkParams{450.0, 2.0};
  return links;
}

Expected<DeviceMesh> DeviceMesh::create(std::vector<int64_t> shape,
                                        std::vector<std::string> names) {
  if (shape.empty()) return invalidArgument("a device mesh needs at least one dimension");
  if (shape.size() > kMaxMeshDims)
    return invalidArgument("a device mesh has at most " + std::to_string(kMaxMeshDims) +
                           " dims, got " + std::to_string(shape.size()));
  int64_t world = 1;
  for (int64_t s : shape) {
    if (s <= 0)
      return invalidArgument("mesh dimension sizes must be positive, got " + std::to_string(s));
    // world <= kMaxWorldSize and s <= kMaxWorldSize here, so the product cannot overflow.
    if (s > kMaxWorldSize || world * s > kMaxWorldSize)
      return invalidArgument(
          "a device mesh has at most " + std::to_string(kMaxWorldSize) + " devices; " +
          joinMap(shape, "x", [](int64_t v) { return std::to_string(v); }) + " is too large");
    world *= s;
  }
  if (names.empty())
    for (size_t i = 0; i < shape.size(); ++i) names.push_back("d" + std::to_string(i));
  if (names.size() != shape.size())
    return invalidArgument("mesh has " + std::to_string(shape.size()) + " dims but " +
                           std::to_string(names.size()) +
                           (names.size() == 1 ? " name was given" : " names were given"));
  std::set<std::string> seen;
  for (const auto& n : names) {
    if (n.empty()) return invalidArgument("mesh dim names must not be empty");
    if (!seen.insert(n).second) return invalidArgument("duplicate mesh dim name '" + n + "'");
  }
  DeviceMesh m;
  m.links_ = defaultLinks(shape.size());
  m.shape_ = std::move(shape);
  m.names_ = std::move(names);
  return m;
}

Expected<DeviceMesh> DeviceMesh::parse(std::string_view shape_text, std::string_view names_text) {
  std::vector<int64_t> shape;
  for (const std::string& piece : split(trim(shape_text), 'x')) {
    auto v = parseInt(piece);
    if (!v || *v <= 0)
      return parseError("bad mesh shape '" + printable(shape_text) +
                        "' (expected positive sizes joined by 'x', like 2x4)");
    shape.push_back(*v);
  }
  std::vector<std::string> names;
  if (!trim(names_text).empty())
    for (const std::string& n : split(trim(names_text), ',')) names.emplace_back(trim(n));
  return create(std::move(shape), std::move(names));
}

int64_t DeviceMesh::worldSize() const {
  int64_t w = 1;
  for (int64_t s : shape_) w *= s;
  return w;
}

Expected<size_t> DeviceMesh::dimIndex(std::string_view name) const {
  for (size_t i = 0; i < names_.size(); ++i)
    if (names_[i] == name) return i;
  return notFound("mesh has no dim named '" + std::string(name) + "' (dims: " + join(names_, ",") +
                  ")");
}

std::vector<int64_t> DeviceMesh::coordinate(int64_t rank) const {
  std::vector<int64_t> c(shape_.size());
  for (size_t i = shape_.size(); i-- > 0;) {
    c[i] = rank % shape_[i];
    rank /= shape_[i];
  }
  return c;
}

int64_t DeviceMesh::rank(const std::vector<int64_t>& coordinate) const {
  int64_t r = 0;
  for (size_t i = 0; i < shape_.size(); ++i) r = r * shape_[i] + coordinate.at(i);
  return r;
}

std::vector<int64_t> DeviceMesh::groupOf(int64_t r, size_t dim) const {
  std::vector<int64_t> c = coordinate(r);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < shape_.at(dim); ++i) {
    c[dim] = i;
    out.push_back(rank(c));
  }
  return out;
}

std::vector<std::vector<int64_t>> DeviceMesh::groups(size_t dim) const {
  std::vector<std::vector<int64_t>> out;
  for (int64_t r = 0; r < worldSize(); ++r)
    if (coordinate(r)[dim] == 0) out.push_back(groupOf(r, dim));
  return out;
}

std::string DeviceMesh::toString() const {
  std::string s = joinMap(shape_, "x", [](int64_t v) { return std::to_string(v); });
  return s + "(" + join(names_, ",") + ")";
}

}  // namespace apc::mesh
