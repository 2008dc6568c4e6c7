//===- lib/spec/shardings.cpp - The CLI's --in/--out-shardings files ------===//
//
// apc plan's sharding files (apc/spec/spec.h): one placement list per input (a list by position
// or an object by name), and an output placement tree. Errors carry the JSON path ("$[1]").
//
//===----------------------------------------------------------------------===//
#include "apc/spec/spec.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "apc/support/file_io.h"
#include "apc/support/strings.h"
#include "spec_json.h"

namespace apc::spec {

using nlohmann::json;
using namespace detail;  // NOLINT: the JSON readers of spec_json.h

Expected<InputShardings> parseInShardings(const json& j, size_t mesh_ndim) {
  InputShardings s;
  if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) {
      if (j[i].is_null()) {
        s.by_position.emplace_back(std::nullopt);
        continue;
      }
      APC_ASSIGN_OR_RETURN(PlacementTuple t,
                           readPlacementTuple(j[i], indexPath("$", i), mesh_ndim));
      APC_RETURN_IF_ERROR(checkNotPartial(t, indexPath("$", i), "an input"));
      s.by_position.emplace_back(std::move(t));
    }
    return s;
  }
  if (j.is_object()) {
    for (const auto& [name, value] : j.items()) {
      if (value.is_null()) continue;
      APC_ASSIGN_OR_RETURN(PlacementTuple t,
                           readPlacementTuple(value, keyPath("$", name), mesh_ndim));
      APC_RETURN_IF_ERROR(checkNotPartial(t, keyPath("$", name), "an input"));
      s.by_name.emplace(name, std::move(t));
    }
    return s;
  }
  return at("$",
            "expected a list with one placement list per input or an object by input name, got " +
                describe(j));
}

Expected<InputShardings> parseInShardingsFile(const std::string& path, size_t mesh_ndim) {
  APC_ASSIGN_OR_RETURN(json j, readJsonFile(path));
  auto s = parseInShardings(j, mesh_ndim);
  if (!s.ok()) return s.error().withContext(path);
  return s;
}

Expected<OutputPlacementTree> parseOutShardings(const json& j, size_t mesh_ndim) {
  return readOutputTree(j, "$", mesh_ndim);
}

Expected<OutputPlacementTree> parseOutShardingsFile(const std::string& path, size_t mesh_ndim) {
  APC_ASSIGN_OR_RETURN(json j, readJsonFile(path));
  auto t = parseOutShardings(j, mesh_ndim);
  if (!t.ok()) return t.error().withContext(path);
  return t;
}

}  // namespace apc::spec
