//===- lib/spec/spec_json.cpp - The spec's JSON readers -------------------===//
//
// The readers of lib/spec/spec_json.h.
//
//===----------------------------------------------------------------------===//
#include "spec_json.h"

#include <algorithm>
#include <map>
#include <optional>

#include "apc/support/strings.h"

namespace apc::spec::detail {

/// No entry of `t` is Partial: a model's input holds whole values, never partial sums.
Status checkNotPartial(const PlacementTuple& t, const std::string& path, const std::string& what) {
  for (size_t i = 0; i < t.size(); ++i)
    if (t[i].isPartial())
      return at(indexPath(path, i), t[i].toString() + " is not a placement for " + what +
                                        ": an input is Shard or Replicate, never Partial");
  return Status::success();
}

Expected<ir::DType> readDType(const json& j, const std::string& path, bool floating_only) {
  APC_ASSIGN_OR_RETURN(std::string name, readString(j, path));
  std::optional<ir::DType> d = ir::parseDType(name);
  if (!d || *d == ir::DType::kUnknown)
    return at(path,
              "unknown dtype '" + name + "' (expected a short name like f32, bf16, f16, i64)");
  if (floating_only && !ir::isFloating(*d))
    return at(path,
              "dtype '" + name + "' is not a floating dtype (expected f32, f64, f16 or bf16)");
  return *d;
}

bool allStrings(const json& arr) {
  return std::all_of(arr.begin(), arr.end(), [](const json& e) { return e.is_string(); });
}

bool anyStrings(const json& arr) {
  return std::any_of(arr.begin(), arr.end(), [](const json& e) { return e.is_string(); });
}

Expected<OutputPlacementTree> readOutputTree(const json& j, const std::string& path,
                                             size_t mesh_ndim) {
  if (j.is_null()) return OutputPlacementTree::makeFree();
  if (j.is_object()) {
    std::map<std::string, OutputPlacementTree> entries;
    for (const auto& [key, value] : j.items()) {
      APC_ASSIGN_OR_RETURN(OutputPlacementTree child,
                           readOutputTree(value, keyPath(path, key), mesh_ndim));
      entries.emplace(key, std::move(child));
    }
    return OutputPlacementTree::makeDict(std::move(entries));
  }
  if (j.is_array()) {
    if (!j.empty() && allStrings(j)) {
      APC_ASSIGN_OR_RETURN(PlacementTuple t, readPlacementTuple(j, path, mesh_ndim));
      return OutputPlacementTree::makeLeaf(std::move(t));
    }
    if (anyStrings(j))
      return at(path,
                "an array mixes placement strings with other values: a placement list holds only "
                "strings, a tuple of outputs only lists, objects and nulls");
    std::vector<OutputPlacementTree> children;
    for (size_t i = 0; i < j.size(); ++i) {
      APC_ASSIGN_OR_RETURN(OutputPlacementTree child,
                           readOutputTree(j[i], indexPath(path, i), mesh_ndim));
      children.push_back(std::move(child));
    }
    return OutputPlacementTree::makeSequence(std::move(children));
  }
  return at(path,
            "expected a placement list, an array or object of them, or null, got " + describe(j));
}

}  // namespace apc::spec::detail
