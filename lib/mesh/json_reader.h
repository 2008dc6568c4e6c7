//===- lib/mesh/json_reader.h - Reading JSON values with their paths ------===//
//
// Private to lib/mesh (spec.cpp, shardings.cpp, spec_check.cpp). The readers walk the JSON by hand
// (no nlohmann get<T> that throws) and carry the JSON path of the value they read ("$.mesh.shape"),
// so that every error is one line starting with that path.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "apc/ir/types.h"
#include "apc/mesh/placement.h"
#include "apc/mesh/spec.h"
#include "apc/support/error.h"

namespace apc::mesh::detail {

using json = nlohmann::json;

/// `base.key`, or `base["a.b"]` when the key is not an identifier.
std::string keyPath(const std::string& base, const std::string& key);
std::string indexPath(const std::string& base, size_t i);
/// An invalid-argument error "PATH: MESSAGE".
Error at(const std::string& path, const std::string& message);
/// "string \"abc\"", "array", "number 1.5": the type and, for scalars, the value (shortened).
std::string describe(const json& j);
/// The names joined by ", ".
std::string quoteList(const std::vector<std::string>& names);
/// " (did you mean 'shape'?)" when a candidate is close to `name`, else "".
std::string suggestion(std::string_view name, const std::vector<std::string>& candidates);

Status expectObject(const json& j, const std::string& path, const std::string& what);
/// Every key of object `j` is in `allowed` (an unknown key is an error with a suggestion).
Status checkKeys(const json& j, const std::string& path, const std::vector<std::string>& allowed);
/// The member `key` of object `j`, or null.
const json* find(const json& j, const char* key);
Expected<int64_t> readInt(const json& j, const std::string& path);
Expected<double> readNumber(const json& j, const std::string& path);
/// A finite number in [lo, hi]; `what` names it in the message ("bandwidth").
Expected<double> readInRange(const json& j, const std::string& path, const std::string& what,
                             double lo, double hi);
Expected<std::string> readString(const json& j, const std::string& path);
Expected<bool> readBool(const json& j, const std::string& path);
/// "1 entry", "2 entries"; "1 dim", "2 dims".
std::string entries(size_t n);
std::string dims(size_t n);

/// A placement tuple: a non-empty array of placement strings with one entry per mesh dim.
Expected<PlacementTuple> readPlacementTuple(const json& j, const std::string& path,
                                            size_t mesh_ndim);
/// No entry of `t` is Partial: a model's input holds whole values, never partial sums.
Status checkNotPartial(const PlacementTuple& t, const std::string& path, const std::string& what);
Expected<ir::DType> readDType(const json& j, const std::string& path, bool floating_only);
bool allStrings(const json& arr);
bool anyStrings(const json& arr);
/// An output placement tree: null (free), a placement list, or an array / object of trees.
Expected<OutputPlacementTree> readOutputTree(const json& j, const std::string& path,
                                             size_t mesh_ndim);

}  // namespace apc::mesh::detail
