//===- lib/mesh/json_reader.cpp - Reading JSON values with their paths ----===//
//
// The helpers of lib/mesh/json_reader.h.
//
//===----------------------------------------------------------------------===//
#include "json_reader.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>

#include "apc/support/strings.h"

namespace apc::mesh::detail {

/// `base.key`, or `base["a.b"]` when the key is not an identifier.
std::string keyPath(const std::string& base, const std::string& key) {
  bool ident = !key.empty() && !std::isdigit(static_cast<unsigned char>(key[0]));
  for (char c : key)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') ident = false;
  if (ident) return base + "." + key;
  return base + "[" + json(key).dump(-1, ' ', false, json::error_handler_t::replace) + "]";
}

std::string indexPath(const std::string& base, size_t i) {
  return base + "[" + std::to_string(i) + "]";
}

Error at(const std::string& path, const std::string& message) {
  return invalidArgument(path + ": " + message);
}

/// "string \"abc\"", "array", "number 1.5": the type and, for scalars, the value (shortened).
std::string describe(const json& j) {
  std::string type = j.type_name();
  if (j.is_structured() || j.is_null()) return type;
  std::string text = j.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return type + " " + text;
}

std::string quoteList(const std::vector<std::string>& names) {
  return join(names, ", ");
}

namespace {

/// Edit distance with adjacent transpositions (optimal string alignment): "mseh" is 1 from "mesh".
size_t editDistance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min(
          {d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

}  // namespace

/// " (did you mean 'shape'?)" when a candidate is close to `name` (a third of its length, at least
/// one edit, and fewer edits than its length), else "".
std::string suggestion(std::string_view name, const std::vector<std::string>& candidates) {
  if (name.size() > 256) return "";  // no name is that long; spare the quadratic distance
  const std::string* best = nullptr;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const std::string& c : candidates) {
    if (c.size() > 256) continue;
    size_t d = editDistance(name, c);
    if (d < best_d) {
      best_d = d;
      best = &c;
    }
  }
  if (best && best_d <= std::max<size_t>(1, name.size() / 3) && best_d < name.size())
    return " (did you mean '" + *best + "'?)";
  return "";
}

Status expectObject(const json& j, const std::string& path, const std::string& what) {
  if (!j.is_object()) return at(path, "expected " + what + ", got " + describe(j));
  return Status::success();
}

/// Rejects keys outside `allowed` (they are usually typos).
Status checkKeys(const json& j, const std::string& path, const std::vector<std::string>& allowed) {
  for (const auto& [key, value] : j.items()) {
    if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
    return at(keyPath(path, key),
              "unknown key" + suggestion(key, allowed) + "; allowed keys: " + quoteList(allowed));
  }
  return Status::success();
}

const json* find(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

Expected<int64_t> readInt(const json& j, const std::string& path) {
  if (j.is_number_unsigned()) {
    if (j.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return at(path, "integer " + j.dump() + " is too large");
    return static_cast<int64_t>(j.get<uint64_t>());
  }
  if (j.is_number_integer()) return j.get<int64_t>();
  if (j.is_number_float()) {
    // JSON Schema (draft 6 and later) counts 2.0 as an integer; so do we.
    double d = j.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15)
      return static_cast<int64_t>(d);
  }
  return at(path, "expected an integer, got " + describe(j));
}

Expected<double> readNumber(const json& j, const std::string& path) {
  if (!j.is_number()) return at(path, "expected a number, got " + describe(j));
  double d = j.get<double>();
  if (!std::isfinite(d)) return at(path, "expected a finite number, got " + describe(j));
  return d;
}

/// A finite number in [lo, hi]; `what` names it in the message ("bandwidth").
Expected<double> readInRange(const json& j, const std::string& path, const std::string& what,
                             double lo, double hi) {
  APC_ASSIGN_OR_RETURN(double d, readNumber(j, path));
  if (d < lo || d > hi) {
    std::ostringstream os;
    os << what << " must be in [" << lo << ", " << hi << "], got " << j.dump();
    return at(path, os.str());
  }
  return d;
}

Expected<std::string> readString(const json& j, const std::string& path) {
  if (!j.is_string()) return at(path, "expected a string, got " + describe(j));
  return j.get<std::string>();
}

Expected<bool> readBool(const json& j, const std::string& path) {
  if (!j.is_boolean()) return at(path, "expected true or false, got " + describe(j));
  return j.get<bool>();
}

std::string entries(size_t n) {
  return std::to_string(n) + (n == 1 ? " entry" : " entries");
}
std::string dims(size_t n) {
  return std::to_string(n) + (n == 1 ? " dim" : " dims");
}

/// A placement tuple: a non-empty array of placement strings with one entry per mesh dim.
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

}  // namespace apc::mesh::detail
