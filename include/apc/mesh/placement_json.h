//===- apc/mesh/placement_json.h - Placement tuples as JSON ---------------===//
//
// The JSON form of a placement tuple: an array of placement strings, one per mesh dim
// (`["S(0)", "R"]`), as the spec, the sharding files and the plan JSON write it. The reader is on
// apc's one JSON reader (apc/support/json_reader.h): it walks the JSON by hand and carries the
// JSON path of the value it reads ("$.inputs.x"), so that every error is one line starting with
// that path.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "apc/mesh/placement.h"
#include "apc/support/error.h"

namespace apc::mesh {

/// `["S(0)", "R"]`: one placement string per entry.
nlohmann::json toJson(const PlacementTuple& t);

/// A placement tuple: a non-empty array of placement strings with one entry per mesh dim. Errors
/// start with `path`.
Expected<PlacementTuple> readPlacementTuple(const nlohmann::json& j, const std::string& path,
                                            size_t mesh_ndim);

}  // namespace apc::mesh
