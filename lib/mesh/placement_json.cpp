//===- lib/mesh/placement_json.cpp - Placement tuples as JSON -------------===//
//
// The writer and reader of apc/mesh/placement_json.h.
//
//===----------------------------------------------------------------------===//
#include "apc/mesh/placement_json.h"

#include <nlohmann/json.hpp>

#include "apc/support/json_reader.h"

namespace apc::mesh {

using json_reader::at;
using json_reader::describe;
using json_reader::dims;
using json_reader::entries;
using json_reader::indexPath;
using nlohmann::json;

json toJson(const PlacementTuple& t) {
  json arr = json::array();
  for (const Placement& p : t) arr.push_back(p.toString());
  return arr;
}

Expected<PlacementTuple> readPlacementTuple(const json& j, const std::string& path,
                                            size_t mesh_ndim) {
  if (!j.is_array())
    return at(path, "expected a placement list like [\"S(0)\", \"R\"], got " + describe(j));
  if (j.empty())
    return at(path, "a placement list needs one entry per mesh dim (" + std::to_string(mesh_ndim) +
                        "), got an empty list");
  PlacementTuple t;
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_string())
      return at(indexPath(path, i),
                "expected a placement string like \"S(0)\", \"R\" or \"P\", got " + describe(j[i]));
    auto p = Placement::parse(j[i].get<std::string>());
    if (!p.ok()) return at(indexPath(path, i), p.error().message());
    t.push_back(*p);
  }
  if (t.size() != mesh_ndim)
    return at(path, "placement list " + toCompactString(t) + " has " + entries(t.size()) +
                        " but the mesh has " + dims(mesh_ndim));
  return t;
}

}  // namespace apc::mesh
