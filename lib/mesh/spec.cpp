//===- lib/mesh/spec.cpp - The mesh and constraint spec (JSON) -------------===//
//
// Reading, writing and checking the spec and the CLI's sharding files. The readers walk the JSON by
// hand (no nlohmann get<T> that throws) and carry the JSON path of the value they read, so that
// every error is one line starting with that path. The layout is documented in apc/mesh/spec.h and,
// for tools, in schemas/spec.schema.json; the two must stay in step (tests/mesh/check_schemas.py
// runs the shared cases in tests/mesh/spec_cases.json against the schema, mesh_test against this
// parser).
//
//===----------------------------------------------------------------------===//
#include "apc/mesh/spec.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "apc/support/file_io.h"
#include "apc/support/strings.h"

namespace apc::mesh {

// Memberwise equality, defaulted here rather than in the header so that the header stays
// C++17 (installed headers, apcConfig.cmake).
bool DeviceOverrides::operator==(const DeviceOverrides&) const = default;
bool OutputPlacementTree::operator==(const OutputPlacementTree&) const = default;
bool MemoryBudget::operator==(const MemoryBudget&) const = default;
bool MixedPrecision::operator==(const MixedPrecision&) const = default;
bool DynamicDim::operator==(const DynamicDim&) const = default;
bool Pin::operator==(const Pin&) const = default;
bool Spec::operator==(const Spec&) const = default;
bool InputShardings::operator==(const InputShardings&) const = default;

using nlohmann::json;

// --- small helpers -------------------------------------------------------------------------------

namespace {

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
    return at(path, "placement list " + toString(t) + " has " + entries(t.size()) +
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

// --- spec sections -------------------------------------------------------------------------------

Expected<DeviceMesh> readMesh(const json& j, const std::string& path) {
  APC_RETURN_IF_ERROR(expectObject(j, path, "a mesh object like {\"shape\": [2, 4]}"));
  APC_RETURN_IF_ERROR(checkKeys(j, path, {"shape", "names", "bandwidth_gbps", "latency_us"}));
  const json* shape_j = find(j, "shape");
  if (!shape_j) return at(path, "missing required key 'shape'");
  std::string shape_path = path + ".shape";
  if (!shape_j->is_array() || shape_j->empty())
    return at(shape_path,
              "expected a non-empty list of mesh dim sizes like [2, 4], got " + describe(*shape_j));
  std::vector<int64_t> shape;
  for (size_t i = 0; i < shape_j->size(); ++i) {
    APC_ASSIGN_OR_RETURN(int64_t s, readInt((*shape_j)[i], indexPath(shape_path, i)));
    if (s <= 0)
      return at(indexPath(shape_path, i),
                "mesh dim size must be positive, got " + std::to_string(s));
    shape.push_back(s);
  }
  const size_t ndim = shape.size();
  auto checkLength = [&](const json& arr, const std::string& p, const std::string& what) -> Status {
    if (!arr.is_array()) return at(p, "expected a list of " + what + ", got " + describe(arr));
    if (arr.size() != ndim)
      return at(p, "expected " + entries(ndim) + " (one per mesh dim), got " +
                       std::to_string(arr.size()));
    return Status::success();
  };

  std::vector<std::string> names;
  if (const json* names_j = find(j, "names")) {
    std::string p = path + ".names";
    APC_RETURN_IF_ERROR(checkLength(*names_j, p, "mesh dim names"));
    for (size_t i = 0; i < names_j->size(); ++i) {
      APC_ASSIGN_OR_RETURN(std::string n, readString((*names_j)[i], indexPath(p, i)));
      if (n.empty()) return at(indexPath(p, i), "a mesh dim name must not be empty");
      if (std::find(names.begin(), names.end(), n) != names.end())
        return at(indexPath(p, i), "duplicate mesh dim name '" + n + "'");
      names.push_back(n);
    }
  }
  auto mesh = DeviceMesh::create(shape, names);
  if (!mesh.ok()) return mesh.error().withContext(path);

  std::vector<LinkParams> links = defaultLinks(ndim);
  if (const json* bw = find(j, "bandwidth_gbps")) {
    std::string p = path + ".bandwidth_gbps";
    APC_RETURN_IF_ERROR(checkLength(*bw, p, "bandwidths in GB/s"));
    for (size_t i = 0; i < ndim; ++i) {
      APC_ASSIGN_OR_RETURN(links[i].bandwidth_gbps,
                           readInRange((*bw)[i], indexPath(p, i), "bandwidth (GB/s)",
                                       kMinBandwidthGbps, kMaxBandwidthGbps));
    }
  }
  if (const json* lat = find(j, "latency_us")) {
    std::string p = path + ".latency_us";
    APC_RETURN_IF_ERROR(checkLength(*lat, p, "latencies in microseconds"));
    for (size_t i = 0; i < ndim; ++i) {
      APC_ASSIGN_OR_RETURN(links[i].latency_us, readInRange((*lat)[i], indexPath(p, i),
                                                            "latency (us)", 0, kMaxLatencyUs));
    }
  }
  for (size_t i = 0; i < ndim; ++i) mesh->setLink(i, links[i]);
  return std::move(mesh).value();
}

Status readDevice(const json& j, const std::string& path, Spec& s) {
  auto readKind = [&](const json& k, const std::string& p) -> Status {
    APC_ASSIGN_OR_RETURN(std::string kind, readString(k, p));
    if (!isKnownDeviceKind(kind))
      return at(p, "unknown device kind '" + kind + "'" + suggestion(kind, knownDeviceKinds()) +
                       "; known kinds: " + quoteList(knownDeviceKinds()));
    s.device = kind;
    return Status::success();
  };
  if (j.is_string()) return readKind(j, path);
  if (!j.is_object())
    return at(path, "expected a device kind like \"h100\" or an object {\"kind\": ...}, got " +
                        describe(j));
  APC_RETURN_IF_ERROR(checkKeys(j, path, {"kind", "peak_tflops", "hbm_bandwidth_gbps"}));
  const json* kind = find(j, "kind");
  if (!kind) return at(path, "missing required key 'kind'");
  APC_RETURN_IF_ERROR(readKind(*kind, path + ".kind"));
  if (const json* peak = find(j, "peak_tflops")) {
    std::string p = path + ".peak_tflops";
    APC_RETURN_IF_ERROR(
        expectObject(*peak, p, "an object of TFLOP/s by dtype like {\"bf16\": 989}"));
    for (const auto& [key, value] : peak->items()) {
      std::string kp = keyPath(p, key);
      APC_ASSIGN_OR_RETURN(ir::DType d, readDType(json(key), kp, /*floating_only=*/false));
      APC_ASSIGN_OR_RETURN(double tflops,
                           readInRange(value, kp, "peak TFLOP/s", kMinDeviceRate, kMaxDeviceRate));
      if (!s.device_overrides.peak_tflops.emplace(d, tflops).second)
        return at(kp, "dtype " + std::string(ir::dtypeName(d)) + " is given twice");
    }
  }
  if (const json* hbm = find(j, "hbm_bandwidth_gbps")) {
    APC_ASSIGN_OR_RETURN(s.device_overrides.hbm_bandwidth_gbps,
                         readInRange(*hbm, path + ".hbm_bandwidth_gbps", "HBM bandwidth (GB/s)",
                                     kMinDeviceRate, kMaxDeviceRate));
  }
  return Status::success();
}

Expected<MemoryBudget> readMemoryBudget(const json& j, const std::string& path) {
  APC_RETURN_IF_ERROR(expectObject(j, path, "an object {\"low\": ..., \"high\": ...}"));
  APC_RETURN_IF_ERROR(checkKeys(j, path, {"low", "high"}));
  MemoryBudget b;
  if (const json* low = find(j, "low")) {
    APC_ASSIGN_OR_RETURN(b.low, readNumber(*low, path + ".low"));
    if (b.low < 0 || b.low > 1)
      return at(path + ".low", "a budget fraction must be in [0, 1], got " + low->dump());
  }
  if (const json* high = find(j, "high")) {
    APC_ASSIGN_OR_RETURN(double h, readNumber(*high, path + ".high"));
    if (h <= 0 || h > 1)
      return at(path + ".high", "a budget fraction must be in (0, 1], got " + high->dump());
    if (b.low > h)
      return at(path, "low " + find(j, "low")->dump() + " is greater than high " + high->dump());
    b.high = h;
  }
  return b;
}

Expected<MixedPrecision> readMixedPrecision(const json& j, const std::string& path) {
  APC_RETURN_IF_ERROR(expectObject(j, path, "an object of dtypes"));
  APC_RETURN_IF_ERROR(checkKeys(j, path, {"param_dtype", "reduce_dtype", "output_dtype"}));
  MixedPrecision mp;
  auto read = [&](const char* key, std::optional<ir::DType>& out) -> Status {
    if (const json* v = find(j, key)) {
      APC_ASSIGN_OR_RETURN(out, readDType(*v, path + "." + key, /*floating_only=*/true));
    }
    return Status::success();
  };
  APC_RETURN_IF_ERROR(read("param_dtype", mp.param_dtype));
  APC_RETURN_IF_ERROR(read("reduce_dtype", mp.reduce_dtype));
  APC_RETURN_IF_ERROR(read("output_dtype", mp.output_dtype));
  return mp;
}

Expected<std::vector<DynamicDim>> readDynamic(const json& j, const std::string& path) {
  if (!j.is_array())
    return at(path, "expected a list of dynamic dims like [{\"input\": \"x\", \"dim\": 0}], got " +
                        describe(j));
  if (j.size() > kMaxDynamicDims)
    return at(path, "a list of " + std::to_string(j.size()) + " dynamic dims; at most " +
                        std::to_string(kMaxDynamicDims));
  std::vector<DynamicDim> out;
  std::set<std::pair<std::string, int64_t>> seen;
  for (size_t i = 0; i < j.size(); ++i) {
    std::string p = indexPath(path, i);
    const json& e = j[i];
    APC_RETURN_IF_ERROR(expectObject(e, p, "an object {\"input\": ..., \"dim\": ...}"));
    APC_RETURN_IF_ERROR(checkKeys(e, p, {"input", "dim", "min", "max"}));
    DynamicDim d;
    const json* input = find(e, "input");
    if (!input) return at(p, "missing required key 'input'");
    APC_ASSIGN_OR_RETURN(d.input, readString(*input, p + ".input"));
    const json* dim = find(e, "dim");
    if (!dim) return at(p, "missing required key 'dim'");
    APC_ASSIGN_OR_RETURN(d.dim, readInt(*dim, p + ".dim"));
    if (d.dim < 0 || d.dim >= kMaxTensorRank)
      return at(p + ".dim", "dim must be in [0, " + std::to_string(kMaxTensorRank - 1) + "], got " +
                                std::to_string(d.dim));
    if (const json* mn = find(e, "min")) {
      APC_ASSIGN_OR_RETURN(d.min, readInt(*mn, p + ".min"));
      if (d.min < 1 || d.min > kMaxDimSize)
        return at(p + ".min", "min must be in [1, " + std::to_string(kMaxDimSize) + "], got " +
                                  std::to_string(d.min));
    }
    if (const json* mx = find(e, "max")) {
      APC_ASSIGN_OR_RETURN(int64_t m, readInt(*mx, p + ".max"));
      if (m > kMaxDimSize)
        return at(p + ".max", "max must be at most " + std::to_string(kMaxDimSize) + ", got " +
                                  std::to_string(m));
      if (m < d.min)
        return at(p + ".max",
                  "max " + std::to_string(m) + " is less than min " + std::to_string(d.min));
      d.max = m;
    }
    if (!seen.emplace(d.input, d.dim).second)
      return at(p, "dim " + std::to_string(d.dim) + " of input '" + printable(d.input) +
                       "' is listed twice");
    out.push_back(std::move(d));
  }
  return out;
}

Expected<std::vector<Pin>> readPins(const json& j, const std::string& path, size_t mesh_ndim) {
  if (!j.is_array())
    return at(path, "expected a list of pins like [{\"node\": ..., \"placements\": [...]}], got " +
                        describe(j));
  std::vector<Pin> out;
  std::map<std::pair<Pin::Target, std::string>, size_t> seen;  // -> index of the first pin
  for (size_t i = 0; i < j.size(); ++i) {
    std::string p = indexPath(path, i);
    const json& e = j[i];
    APC_RETURN_IF_ERROR(expectObject(e, p, "an object {\"node\": ..., \"placements\": [...]}"));
    APC_RETURN_IF_ERROR(checkKeys(e, p, {"node", "module", "placements"}));
    const json* node = find(e, "node");
    const json* module = find(e, "module");
    if ((node != nullptr) == (module != nullptr))
      return at(p, "a pin names exactly one of 'node' or 'module'");
    Pin pin;
    pin.target = node ? Pin::Target::kNode : Pin::Target::kModule;
    std::string np = p + (node ? ".node" : ".module");
    APC_ASSIGN_OR_RETURN(pin.name, readString(node ? *node : *module, np));
    if (pin.name.empty()) return at(np, "must not be empty");
    const json* placements = find(e, "placements");
    if (!placements) return at(p, "missing required key 'placements'");
    APC_ASSIGN_OR_RETURN(pin.placements,
                         readPlacementTuple(*placements, p + ".placements", mesh_ndim));
    auto [it, fresh] = seen.emplace(std::make_pair(pin.target, pin.name), i);
    if (!fresh) {
      const Pin& first = out[it->second];
      std::string what = std::string(node ? "node" : "module") + " '" + printable(pin.name) + "'";
      return at(p, what + " is pinned twice (first at " + indexPath(path, it->second) +
                       (first.placements == pin.placements
                            ? ")"
                            : " to " + toString(first.placements) + ", here to " +
                                  toString(pin.placements) + ")"));
    }
    out.push_back(std::move(pin));
  }
  return out;
}

}  // namespace

// --- device kinds and trees ----------------------------------------------------------------------

const std::vector<std::string>& knownDeviceKinds() {
  static const std::vector<std::string> kinds = {"h100", "h200", "a100", "b200", "cpu"};
  return kinds;
}

bool isKnownDeviceKind(std::string_view kind) {
  const auto& kinds = knownDeviceKinds();
  return std::find(kinds.begin(), kinds.end(), kind) != kinds.end();
}

OutputPlacementTree OutputPlacementTree::makeLeaf(PlacementTuple t) {
  OutputPlacementTree n;
  n.kind = Kind::kLeaf;
  n.placements = std::move(t);
  return n;
}

OutputPlacementTree OutputPlacementTree::makeSequence(std::vector<OutputPlacementTree> children) {
  OutputPlacementTree n;
  n.kind = Kind::kSequence;
  n.children = std::move(children);
  return n;
}

OutputPlacementTree OutputPlacementTree::makeDict(
    std::map<std::string, OutputPlacementTree> entries) {
  OutputPlacementTree n;
  n.kind = Kind::kDict;
  for (auto& [key, child] : entries) {
    n.keys.push_back(key);
    n.children.push_back(std::move(child));
  }
  return n;
}

std::string toString(const OutputPlacementTree& t) {
  switch (t.kind) {
    case OutputPlacementTree::Kind::kFree:
      return "*";
    case OutputPlacementTree::Kind::kLeaf:
      return toCompactString(t.placements);
    case OutputPlacementTree::Kind::kSequence:
      return "(" + joinMap(t.children, ", ", [](const auto& c) { return toString(c); }) + ")";
    case OutputPlacementTree::Kind::kDict: {
      std::string s = "{";
      for (size_t i = 0; i < t.children.size(); ++i)
        s += (i ? ", " : "") + t.keys[i] + ": " + toString(t.children[i]);
      return s + "}";
    }
  }
  return "?";
}

// --- JSON text -----------------------------------------------------------------------------------

namespace {

/// A SAX pass that finds the first key given twice in one object and names its path. (nlohmann's
/// parser callback would do it in one pass, but its object_end handling scans the whole parent
/// container each time: quadratic in the length of a list of objects.)
class DuplicateKeyFinder : public nlohmann::json_sax<json> {
 public:
  std::optional<std::string> duplicate;

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override {
    stack_.push_back(Frame{true, {}, {}, 0});
    return true;
  }
  bool key(string_t& k) override {
    Frame& f = stack_.back();
    f.key = k;
    if (!f.keys.insert(k).second) {
      duplicate = keyPath(containerPath(), k);
      return false;  // stop at the first
    }
    return true;
  }
  bool end_object() override { return end(); }
  bool start_array(std::size_t) override {
    stack_.push_back(Frame{false, {}, {}, 0});
    return true;
  }
  bool end_array() override { return end(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }

 private:
  struct Frame {
    bool is_object = false;
    std::set<std::string> keys;
    std::string key;   // objects: the current key
    size_t index = 0;  // arrays: the current element
  };
  bool value() {
    if (!stack_.empty() && !stack_.back().is_object) ++stack_.back().index;
    return true;
  }
  bool end() {
    stack_.pop_back();
    return value();
  }
  /// The path of the innermost container.
  std::string containerPath() const {
    std::string p = "$";
    for (size_t i = 0; i + 1 < stack_.size(); ++i)
      p = stack_[i].is_object ? keyPath(p, stack_[i].key) : indexPath(p, stack_[i].index);
    return p;
  }
  std::vector<Frame> stack_;
};

}  // namespace

Expected<json> parseJsonText(std::string_view text) {
  APC_RETURN_IF_ERROR(checkJsonText(text));
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    std::string what = e.what();
    if (size_t pos = what.find("] ");
        what.rfind("[json.exception", 0) == 0 && pos != std::string::npos)
      what = what.substr(pos + 2);
    return parseError("malformed JSON: " + what);
  }
  // A second, linear pass names a key given twice (the parser keeps the last silently).
  DuplicateKeyFinder finder;
  json::sax_parse(text.begin(), text.end(), &finder);
  if (finder.duplicate) return parseError(*finder.duplicate + ": key given twice in one object");
  return j;
}

Expected<json> readJsonFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ioError("cannot read '" + path + "': " + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return ioError("cannot read '" + path + "'");
  auto j = parseJsonText(ss.str());
  if (!j.ok()) return j.error().withContext(path);
  return j;
}

// --- specs ---------------------------------------------------------------------------------------

Expected<Spec> parseSpec(const json& j) {
  APC_RETURN_IF_ERROR(expectObject(j, "$", "a spec object like {\"mesh\": {\"shape\": [2, 4]}}"));
  APC_RETURN_IF_ERROR(
      checkKeys(j, "$",
                {"mesh", "device", "world_size", "inputs", "outputs", "memory_budget",
                 "mixed_precision", "dynamic_batch", "dynamic", "pins"}));
  Spec s;
  const json* mesh = find(j, "mesh");
  if (!mesh) return at("$", "missing required key 'mesh'");
  APC_ASSIGN_OR_RETURN(s.mesh, readMesh(*mesh, "$.mesh"));
  const size_t ndim = s.mesh.ndim();

  if (const json* device = find(j, "device"))
    APC_RETURN_IF_ERROR(readDevice(*device, "$.device", s));
  if (const json* ws = find(j, "world_size")) {
    APC_ASSIGN_OR_RETURN(int64_t w, readInt(*ws, "$.world_size"));
    if (w != s.mesh.worldSize())
      return at("$.world_size", "world_size " + std::to_string(w) + " does not match the mesh " +
                                    s.mesh.toString() + " of " +
                                    std::to_string(s.mesh.worldSize()) + " devices");
    s.world_size = w;
  }
  if (const json* inputs = find(j, "inputs")) {
    APC_RETURN_IF_ERROR(
        expectObject(*inputs, "$.inputs", "an object of placement lists by input name"));
    for (const auto& [name, value] : inputs->items()) {
      if (value.is_null()) continue;  // free
      APC_ASSIGN_OR_RETURN(PlacementTuple t,
                           readPlacementTuple(value, keyPath("$.inputs", name), ndim));
      APC_RETURN_IF_ERROR(checkNotPartial(t, keyPath("$.inputs", name), "an input"));
      s.inputs.emplace(name, std::move(t));
    }
  }
  if (const json* outputs = find(j, "outputs")) {
    APC_ASSIGN_OR_RETURN(s.outputs, readOutputTree(*outputs, "$.outputs", ndim));
  }
  if (const json* budget = find(j, "memory_budget")) {
    APC_ASSIGN_OR_RETURN(s.memory_budget, readMemoryBudget(*budget, "$.memory_budget"));
  }
  if (const json* mp = find(j, "mixed_precision")) {
    APC_ASSIGN_OR_RETURN(s.mixed_precision, readMixedPrecision(*mp, "$.mixed_precision"));
  }
  if (const json* db = find(j, "dynamic_batch")) {
    APC_ASSIGN_OR_RETURN(s.dynamic_batch, readBool(*db, "$.dynamic_batch"));
  }
  if (const json* dyn = find(j, "dynamic")) {
    APC_ASSIGN_OR_RETURN(s.dynamic, readDynamic(*dyn, "$.dynamic"));
  }
  if (const json* pins = find(j, "pins")) {
    APC_ASSIGN_OR_RETURN(s.pins, readPins(*pins, "$.pins", ndim));
  }
  return s;
}

Expected<Spec> parseSpecText(std::string_view text) {
  APC_ASSIGN_OR_RETURN(json j, parseJsonText(text));
  return parseSpec(j);
}

Expected<Spec> parseSpecFile(const std::string& path) {
  APC_ASSIGN_OR_RETURN(json j, readJsonFile(path));
  auto s = parseSpec(j);
  if (!s.ok()) return s.error().withContext(path);
  return s;
}

json toJson(const PlacementTuple& t) {
  json arr = json::array();
  for (const Placement& p : t) arr.push_back(p.toString());
  return arr;
}

json toJson(const OutputPlacementTree& t) {
  switch (t.kind) {
    case OutputPlacementTree::Kind::kFree:
      return nullptr;
    case OutputPlacementTree::Kind::kLeaf:
      return toJson(t.placements);
    case OutputPlacementTree::Kind::kSequence: {
      json arr = json::array();
      for (const auto& c : t.children) arr.push_back(toJson(c));
      return arr;
    }
    case OutputPlacementTree::Kind::kDict: {
      json obj = json::object();
      for (size_t i = 0; i < t.children.size(); ++i) obj[t.keys[i]] = toJson(t.children[i]);
      return obj;
    }
  }
  return nullptr;
}

json toJson(const InputShardings& s) {
  if (!s.by_position.empty()) {
    json arr = json::array();
    for (const auto& t : s.by_position) arr.push_back(t ? toJson(*t) : json(nullptr));
    return arr;
  }
  json obj = json::object();
  for (const auto& [name, t] : s.by_name) obj[name] = toJson(t);
  return obj;
}

json toJson(const Spec& s) {
  json j;
  json mesh;
  mesh["shape"] = s.mesh.shape();
  mesh["names"] = s.mesh.names();
  json bw = json::array(), lat = json::array();
  for (size_t i = 0; i < s.mesh.ndim(); ++i) {
    bw.push_back(s.mesh.link(i).bandwidth_gbps);
    lat.push_back(s.mesh.link(i).latency_us);
  }
  mesh["bandwidth_gbps"] = bw;
  mesh["latency_us"] = lat;
  j["mesh"] = mesh;
  if (s.device_overrides.empty()) {
    j["device"] = s.device;
  } else {
    json dev;
    dev["kind"] = s.device;
    if (!s.device_overrides.peak_tflops.empty()) {
      json peak = json::object();
      for (const auto& [d, v] : s.device_overrides.peak_tflops) peak[ir::dtypeName(d)] = v;
      dev["peak_tflops"] = peak;
    }
    if (s.device_overrides.hbm_bandwidth_gbps)
      dev["hbm_bandwidth_gbps"] = *s.device_overrides.hbm_bandwidth_gbps;
    j["device"] = dev;
  }
  if (s.world_size) j["world_size"] = *s.world_size;
  if (!s.inputs.empty()) {
    json inputs = json::object();
    for (const auto& [name, t] : s.inputs) inputs[name] = toJson(t);
    j["inputs"] = inputs;
  }
  if (!s.outputs.isFree()) j["outputs"] = toJson(s.outputs);
  if (s.memory_budget != MemoryBudget{}) {
    json b;
    b["low"] = s.memory_budget.low;
    if (s.memory_budget.high) b["high"] = *s.memory_budget.high;
    j["memory_budget"] = b;
  }
  if (!s.mixed_precision.empty()) {
    json mp = json::object();
    if (s.mixed_precision.param_dtype)
      mp["param_dtype"] = ir::dtypeName(*s.mixed_precision.param_dtype);
    if (s.mixed_precision.reduce_dtype)
      mp["reduce_dtype"] = ir::dtypeName(*s.mixed_precision.reduce_dtype);
    if (s.mixed_precision.output_dtype)
      mp["output_dtype"] = ir::dtypeName(*s.mixed_precision.output_dtype);
    j["mixed_precision"] = mp;
  }
  if (s.dynamic_batch) j["dynamic_batch"] = true;
  if (!s.dynamic.empty()) {
    json arr = json::array();
    for (const DynamicDim& d : s.dynamic) {
      json e = {{"input", d.input}, {"dim", d.dim}, {"min", d.min}};
      if (d.max) e["max"] = *d.max;
      arr.push_back(e);
    }
    j["dynamic"] = arr;
  }
  if (!s.pins.empty()) {
    json arr = json::array();
    for (const Pin& p : s.pins) {
      json e;
      e[p.target == Pin::Target::kNode ? "node" : "module"] = p.name;
      e["placements"] = toJson(p.placements);
      arr.push_back(e);
    }
    j["pins"] = arr;
  }
  return j;
}

// --- CLI sharding files --------------------------------------------------------------------------

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

// --- against a model -----------------------------------------------------------------------------

namespace {

std::vector<std::string> inputNames(const ir::Graph& g) {
  std::vector<std::string> names;
  for (ir::NodeId id : g.nodesOfKind(ir::NodeKind::kInput)) names.push_back(g.node(id).name);
  return names;
}

Error unknownInput(const std::string& path, const std::string& name, const ir::Graph& g) {
  std::vector<std::string> names = inputNames(g);
  std::string have =
      names.empty() ? "the model has no inputs" : "the model's inputs are: " + quoteList(names);
  return notFound(path + ": spec names input '" + printable(name) + "' but " + have +
                  suggestion(name, names));
}

/// The tensor meta of input `name`, or an error naming `path`.
Expected<ir::TensorMeta> inputMeta(const std::string& path, const std::string& name,
                                   const ir::Graph& g) {
  std::optional<ir::NodeId> id = g.findInput(name);
  if (!id) return unknownInput(path, name, g);
  const ir::Node& n = g.node(*id);
  if (n.outputs.empty() || !g.value(n.outputs[0]).isTensor()) {
    std::string type =
        n.outputs.empty() ? "no value" : ir::valueTypeName(g.value(n.outputs[0]).type);
    return at(path, "input '" + name + "' is not a tensor (" + type + ")");
  }
  return *g.value(n.outputs[0]).tensor;
}

/// Every shard dim of `t` is below the rank of `meta`; `what` names the tensor ("input 'x'").
Status checkRank(const PlacementTuple& t, const ir::TensorMeta& meta, const std::string& path,
                 const std::string& what) {
  for (size_t i = 0; i < t.size(); ++i)
    if (t[i].isShard() && t[i].dim() >= meta.rank())
      return at(indexPath(path, i), t[i].toString() + " is out of range for " + what + " of rank " +
                                        std::to_string(meta.rank()) + " (" + ir::toString(meta) +
                                        ")");
  return Status::success();
}

std::string describeOutput(const ir::OutputTree& o, const ir::Graph& g) {
  switch (o.kind) {
    case ir::OutputTree::Kind::kLeaf: {
      if (!o.leaf.valid() || o.leaf.v >= g.numValues()) return "an unknown value";
      const ir::Value& v = g.value(o.leaf);
      if (v.isTensor()) return "a tensor " + ir::toString(*v.tensor);
      return std::string("a non-tensor value (") + ir::valueTypeName(v.type) + ")";
    }
    case ir::OutputTree::Kind::kTuple:
      return "a tuple of " + std::to_string(o.children.size());
    case ir::OutputTree::Kind::kList:
      return "a list of " + std::to_string(o.children.size());
    case ir::OutputTree::Kind::kDict:
      return "a dict with keys: " + quoteList(o.keys);
  }
  return "?";
}

Status matchOutputs(const OutputPlacementTree& t, const ir::OutputTree& o, const ir::Graph& g,
                    const std::string& path) {
  using K = OutputPlacementTree::Kind;
  using OK = ir::OutputTree::Kind;
  switch (t.kind) {
    case K::kFree:
      return Status::success();
    case K::kLeaf: {
      bool tensor = o.kind == OK::kLeaf && o.leaf.valid() && o.leaf.v < g.numValues() &&
                    g.value(o.leaf).isTensor();
      if (!tensor)
        return at(path, "spec gives a placement list but the model's output here is " +
                            describeOutput(o, g));
      return checkRank(t.placements, *g.value(o.leaf).tensor, path, "this output");
    }
    case K::kSequence: {
      if ((o.kind != OK::kTuple && o.kind != OK::kList) || o.children.size() != t.children.size())
        return at(path, "spec gives a sequence of " + std::to_string(t.children.size()) +
                            " but the model's output here is " + describeOutput(o, g));
      for (size_t i = 0; i < t.children.size(); ++i)
        APC_RETURN_IF_ERROR(matchOutputs(t.children[i], o.children[i], g, indexPath(path, i)));
      return Status::success();
    }
    case K::kDict: {
      if (o.kind != OK::kDict)
        return at(path, "spec gives a dict but the model's output here is " + describeOutput(o, g));
      for (size_t i = 0; i < t.keys.size(); ++i) {
        auto it = std::find(o.keys.begin(), o.keys.end(), t.keys[i]);
        std::string p = keyPath(path, t.keys[i]);
        if (it == o.keys.end() || static_cast<size_t>(it - o.keys.begin()) >= o.children.size())
          return at(p, "spec names output key '" + printable(t.keys[i]) +
                           "' but the model's dict has keys: " + quoteList(o.keys));
        APC_RETURN_IF_ERROR(matchOutputs(t.children[i], o.children[it - o.keys.begin()], g, p));
      }
      return Status::success();
    }
  }
  return Status::success();
}

/// Node names as pins use them: input/parameter/buffer names and op output value names, each with
/// the value it names.
std::map<std::string, ir::ValueId> nodeNames(const ir::Graph& g) {
  std::map<std::string, ir::ValueId> names;
  for (const ir::Node& n : g.nodes()) {
    if (n.kind != ir::NodeKind::kOp) {
      if (!n.outputs.empty()) names.emplace(n.name, n.outputs[0]);
      continue;
    }
    for (ir::ValueId v : n.outputs)
      if (!g.value(v).debug_name.empty()) names.emplace(g.value(v).debug_name, v);
  }
  return names;
}

/// Every module path of the graph and its prefixes ("layers", "layers.0", "layers.0.attn", ...).
std::set<std::string> modulePaths(const ir::Graph& g) {
  std::set<std::string> paths;
  auto addPrefixes = [&](const std::string& path) {
    for (size_t pos = path.find('.'); pos != std::string::npos; pos = path.find('.', pos + 1))
      paths.insert(path.substr(0, pos));
    if (!path.empty()) paths.insert(path);
  };
  for (const ir::Node& n : g.nodes()) {
    addPrefixes(n.module_path);
    // A parameter "layers.0.wq.weight" lives in module "layers.0.wq".
    if ((n.kind == ir::NodeKind::kParameter || n.kind == ir::NodeKind::kBuffer) &&
        n.name.find('.') != std::string::npos)
      addPrefixes(n.name.substr(0, n.name.rfind('.')));
  }
  return paths;
}

std::vector<std::string> keysOf(const std::map<std::string, ir::ValueId>& m) {
  std::vector<std::string> out;
  for (const auto& [k, v] : m) out.push_back(k);
  return out;
}

}  // namespace

Expected<std::map<std::string, PlacementTuple>> resolveInShardings(const InputShardings& s,
                                                                   const ir::Graph& g) {
  std::map<std::string, PlacementTuple> out;
  std::vector<std::string> names = inputNames(g);
  if (!s.by_position.empty()) {
    if (s.by_position.size() != names.size())
      return invalidArgument("$: in-shardings list has " + entries(s.by_position.size()) +
                             " but the model has " + std::to_string(names.size()) + " input" +
                             (names.size() == 1 ? "" : "s") + " (" + quoteList(names) + ")");
    for (size_t i = 0; i < names.size(); ++i)
      if (s.by_position[i]) out.emplace(names[i], *s.by_position[i]);
  }
  for (const auto& [name, t] : s.by_name) {
    std::string p = keyPath("$", name);
    if (!g.findInput(name)) return unknownInput(p, name, g);
    if (!out.emplace(name, t).second)
      return at(p, "input '" + printable(name) + "' is given twice");
  }
  return out;
}

Status validateSpecAgainstGraph(const Spec& s, const ir::Graph& g) {
  for (const auto& [name, t] : s.inputs) {
    std::string p = keyPath("$.inputs", name);
    APC_ASSIGN_OR_RETURN(ir::TensorMeta meta, inputMeta(p, name, g));
    APC_RETURN_IF_ERROR(checkNotPartial(t, p, "input '" + printable(name) + "'"));
    APC_RETURN_IF_ERROR(checkRank(t, meta, p, "input '" + printable(name) + "'"));
  }
  for (size_t i = 0; i < s.dynamic.size(); ++i) {
    const DynamicDim& d = s.dynamic[i];
    std::string p = indexPath("$.dynamic", i);
    APC_ASSIGN_OR_RETURN(ir::TensorMeta meta, inputMeta(p + ".input", d.input, g));
    if (d.dim >= meta.rank())
      return at(p + ".dim", "dim " + std::to_string(d.dim) + " is out of range for input '" +
                                printable(d.input) + "' of rank " + std::to_string(meta.rank()) +
                                " (" + ir::toString(meta) + ")");
    int64_t size = meta.shape[static_cast<size_t>(d.dim)].size;
    if (size < d.min || (d.max && size > *d.max))
      return at(p, "input '" + printable(d.input) + "' has size " + std::to_string(size) +
                       " in dim " + std::to_string(d.dim) + ", outside its range [" +
                       std::to_string(d.min) + ", " +
                       (d.max ? std::to_string(*d.max) : std::string("inf")) + "]");
  }
  APC_RETURN_IF_ERROR(matchOutputs(s.outputs, g.outputs(), g, "$.outputs"));

  std::map<std::string, ir::ValueId> nodes;
  std::set<std::string> modules;
  for (size_t i = 0; i < s.pins.size(); ++i) {
    const Pin& pin = s.pins[i];
    std::string p = indexPath("$.pins", i);
    if (pin.target == Pin::Target::kNode) {
      if (nodes.empty()) nodes = nodeNames(g);
      auto it = nodes.find(pin.name);
      if (it == nodes.end())
        return notFound(p + ".node: spec pins node '" + printable(pin.name) +
                        "' but the model has no node of that name" +
                        suggestion(pin.name, keysOf(nodes)));
      const ir::Value& v = g.value(it->second);
      if (!v.isTensor())
        return at(p + ".node", "node '" + printable(pin.name) + "' is not a tensor (" +
                                   ir::valueTypeName(v.type) + ")");
      APC_RETURN_IF_ERROR(checkRank(pin.placements, *v.tensor, p + ".placements",
                                    "node '" + printable(pin.name) + "'"));
    } else {
      if (modules.empty()) modules = modulePaths(g);
      if (!modules.count(pin.name))
        return notFound(p + ".module: spec pins module '" + printable(pin.name) +
                        "' but the model has no module of that path" +
                        suggestion(pin.name, {modules.begin(), modules.end()}));
    }
  }
  return Status::success();
}

}  // namespace apc::mesh
