//===- lib/spec/spec_json.h - The spec's JSON readers ---------------------===//
//
// Private to lib/spec (spec.cpp, shardings.cpp, spec_check.cpp): the readers of the values a spec
// and the sharding files share (dtypes, input placements, output placement trees) on top of apc's
// one JSON reader (apc/support/json_reader.h), whose functions this namespace brings in, and of
// the placement tuple reader (apc/mesh/placement_json.h). Like them they walk the JSON by hand and
// carry the JSON path of the value they read ("$.mesh.shape"), so that every error is one line
// starting with that path.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <string>

#include "apc/ir/types.h"
#include "apc/mesh/device_mesh.h"
#include "apc/mesh/placement.h"
#include "apc/mesh/placement_json.h"
#include "apc/spec/spec.h"
#include "apc/support/error.h"
#include "apc/support/json_reader.h"

namespace apc::spec::detail {

using namespace apc::json_reader;  // NOLINT: the shared readers (keyPath, at, readInt, ...)
using mesh::defaultLinks;
using mesh::kMaxBandwidthGbps;
using mesh::kMaxLatencyUs;
using mesh::kMaxMeshDims;
using mesh::kMaxWorldSize;
using mesh::kMinBandwidthGbps;
using mesh::Placement;
using mesh::readPlacementTuple;

/// No entry of `t` is Partial: a model's input holds whole values, never partial sums.
Status checkNotPartial(const PlacementTuple& t, const std::string& path, const std::string& what);
Expected<ir::DType> readDType(const json& j, const std::string& path, bool floating_only);
bool allStrings(const json& arr);
bool anyStrings(const json& arr);
/// An output placement tree: null (free), a placement list, or an array / object of trees.
Expected<OutputPlacementTree> readOutputTree(const json& j, const std::string& path,
                                             size_t mesh_ndim);

}  // namespace apc::spec::detail
