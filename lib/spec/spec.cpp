//===- lib/spec/spec.cpp - The mesh and constraint spec (JSON) -------------===//
//
// Reading and writing the spec. (The CLI's sharding files: shardings.cpp; the spec against a
// model: spec_check.cpp; the readers they share: spec_json.h, on apc's one JSON reader,
// apc/support/json_reader.h, and the placement tuple reader, apc/mesh/placement_json.h.) The
// readers walk the JSON by hand (no nlohmann get<T> that throws) and carry the JSON path of the
// value they read, so that every error is one line starting with that path. The layout is
// documented in apc/spec/spec.h and, for tools, in schemas/spec.schema.json; the two must stay in
// step (tests/spec/check_schemas.py runs the shared cases in tests/spec/spec_cases.json against the
// schema, spec_test against this parser).
//
//===----------------------------------------------------------------------===//
#include "apc/spec/spec.h"

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
#include "spec_json.h"

namespace apc::spec {

// Memberwise equality, defaulted here rather than in the header so that the header stays
// C++17 (installed headers, apcConfig.cmake).
bool DeviceOverrides::operator==(const DeviceOverrides&) const = default;
bool MemoryBudget::operator==(const MemoryBudget&) const = default;
bool MixedPrecision::operator==(const MixedPrecision&) const = default;
bool DynamicDim::operator==(const DynamicDim&) const = default;
bool Pin::operator==(const Pin&) const = default;
bool Spec::operator==(const Spec&) const = default;
bool MeshDimNetwork::operator==(const MeshDimNetwork&) const = default;
bool CollectiveTable::operator==(const CollectiveTable&) const = default;
bool KernelTable::operator==(const KernelTable&) const = default;

std::optional<MemoryBudget::Violation> MemoryBudget::violation() const {
  auto num = [](double v) { return formatNumber(v, 12); };
  if (!(low >= 0 && low <= 1))
    return Violation{"low", "a budget fraction must be in [0, 1], got " + num(low)};
  if (high && !(*high > 0 && *high <= 1))
    return Violation{"high", "a budget fraction must be in (0, 1], got " + num(*high)};
  if (high && low > *high)
    return Violation{"", "low " + num(low) + " is greater than high " + num(*high)};
  return std::nullopt;
}

bool MeshDimNetwork::empty() const {
  for (const auto& l : by_kind)
    if (l) return false;
  for (const auto& t : tables)
    if (t) return false;
  return ranks_per_node == 0 && !inter_node;
}
bool InputShardings::operator==(const InputShardings&) const = default;
// Spelled out: clang 14 crashes instantiating a defaulted == of this recursive type (the fuzz
// build compiles with clang).
bool OutputPlacementTree::operator==(const OutputPlacementTree& o) const {
  if (kind != o.kind || placements != o.placements || keys != o.keys ||
      children.size() != o.children.size())
    return false;
  for (size_t i = 0; i < children.size(); ++i)
    if (!(children[i] == o.children[i])) return false;
  return true;
}

using nlohmann::json;
using namespace detail;  // NOLINT: the JSON readers of spec_json.h

namespace {

/// The device's rates in GB/s, each in [0, 1e9] (0: nothing), read and written alike: key, field,
/// what an error calls it.
struct RateField {
  const char* key;
  std::optional<double> DeviceOverrides::*field;
  const char* what;
};
constexpr RateField kRateFields[] = {
    {"matmul_output_gbps", &DeviceOverrides::matmul_output_gbps, "matmul output rate (GB/s)"},
    {"matvec_gbps", &DeviceOverrides::matvec_gbps, "matrix-vector product rate (GB/s)"},
    {"outer_product_gbps", &DeviceOverrides::outer_product_gbps, "outer product rate (GB/s)"},
    {"conv_weight_gbps", &DeviceOverrides::conv_weight_gbps, "convolution weight rate (GB/s)"},
    {"conv_weight_grad_gbps", &DeviceOverrides::conv_weight_grad_gbps,
     "convolution weight gradient rate (GB/s)"},
};

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

Expected<LinkParams> readLink(const json& j, const std::string& path) {
  APC_RETURN_IF_ERROR(
      expectObject(j, path, "a link {\"bandwidth_gbps\": ..., \"latency_us\": ...}"));
  APC_RETURN_IF_ERROR(checkKeys(j, path, {"bandwidth_gbps", "latency_us"}));
  const json* bw = find(j, "bandwidth_gbps");
  const json* lat = find(j, "latency_us");
  if (!bw || !lat) return at(path, "a link needs both 'bandwidth_gbps' and 'latency_us'");
  LinkParams link;
  APC_ASSIGN_OR_RETURN(link.bandwidth_gbps,
                       readInRange(*bw, path + ".bandwidth_gbps", "bandwidth (GB/s)",
                                   kMinBandwidthGbps, kMaxBandwidthGbps));
  APC_ASSIGN_OR_RETURN(link.latency_us,
                       readInRange(*lat, path + ".latency_us", "latency (us)", 0, kMaxLatencyUs));
  return link;
}

json linkToJson(const LinkParams& l) {
  return {{"bandwidth_gbps", l.bandwidth_gbps}, {"latency_us", l.latency_us}};
}

/// {"group_size": p, "bytes": [...], "us": [...]}: at least two sizes, ascending, times > 0.
Expected<CollectiveTable> readTable(const json& j, const std::string& path) {
  APC_RETURN_IF_ERROR(
      expectObject(j, path, "measured times {\"group_size\": 2, \"bytes\": [...], \"us\": [...]}"));
  APC_RETURN_IF_ERROR(checkKeys(j, path, {"group_size", "bytes", "us"}));
  CollectiveTable t;
  const json* p = find(j, "group_size");
  const json* bytes = find(j, "bytes");
  const json* us = find(j, "us");
  if (!p || !bytes || !us) return at(path, "needs 'group_size', 'bytes' and 'us'");
  APC_ASSIGN_OR_RETURN(double g, readInRange(*p, path + ".group_size", "group size", 2,
                                             static_cast<double>(kMaxWorldSize)));
  if (g != std::floor(g)) return at(path + ".group_size", "expected an integer");
  t.group_size = static_cast<int64_t>(g);
  if (!bytes->is_array() || !us->is_array() || bytes->size() != us->size() || bytes->size() < 2 ||
      bytes->size() > 64)
    return at(path, "'bytes' and 'us' must be lists of the same length, 2 to 64 entries");
  for (size_t i = 0; i < bytes->size(); ++i) {
    APC_ASSIGN_OR_RETURN(double b,
                         readInRange((*bytes)[i], indexPath(path + ".bytes", i), "bytes", 1, 1e15));
    APC_ASSIGN_OR_RETURN(
        double u, readInRange((*us)[i], indexPath(path + ".us", i), "time (us)", 1e-6, 1e12));
    if (i > 0 && !(b > t.bytes.back()))
      return at(indexPath(path + ".bytes", i), "sizes must ascend");
    t.bytes.push_back(b);
    t.us.push_back(u);
  }
  return t;
}

/// A list of MeshDimNetwork objects, `ndim` of them.
Expected<std::vector<MeshDimNetwork>> readNetwork(const json& j, const std::string& path,
                                                  size_t ndim) {
  if (!j.is_array() || j.size() != ndim)
    return at(path, "expected a list of " + std::to_string(ndim) +
                        " objects (one per mesh dim) of links per collective kind, got " +
                        describe(j));
  std::vector<MeshDimNetwork> out(ndim);
  for (size_t m = 0; m < ndim; ++m) {
    const std::string p = indexPath(path, m);
    const json& d = j[m];
    APC_RETURN_IF_ERROR(expectObject(d, p, "an object like {\"all-gather\": {...}}"));
    APC_RETURN_IF_ERROR(checkKeys(d, p,
                                  {kNetworkKindKeys[0], kNetworkKindKeys[1], kNetworkKindKeys[2],
                                   kNetworkKindKeys[3], "ranks_per_node", "inter_node"}));
    for (size_t k = 0; k < 4; ++k)
      if (const json* l = find(d, kNetworkKindKeys[k])) {
        const std::string kp = keyPath(p, kNetworkKindKeys[k]);
        json link = *l;
        if (l->is_object() && l->contains("measured")) {
          APC_ASSIGN_OR_RETURN(out[m].tables[k], readTable((*l)["measured"], kp + ".measured"));
          link.erase("measured");
        }
        APC_ASSIGN_OR_RETURN(out[m].by_kind[k], readLink(link, kp));
      }
    if (const json* q = find(d, "ranks_per_node")) {
      APC_ASSIGN_OR_RETURN(double v, readInRange(*q, p + ".ranks_per_node", "ranks per node", 1,
                                                 static_cast<double>(kMaxWorldSize)));
      if (v != std::floor(v)) return at(p + ".ranks_per_node", "expected an integer");
      out[m].ranks_per_node = static_cast<int64_t>(v);
    }
    if (const json* l = find(d, "inter_node")) {
      APC_ASSIGN_OR_RETURN(out[m].inter_node, readLink(*l, p + ".inter_node"));
    }
    if (out[m].ranks_per_node > 0 && !out[m].inter_node)
      return at(p, "ranks_per_node needs an 'inter_node' link (the link between nodes)");
  }
  // A network that overrides nothing on any dim is no network: the spec then means (and writes
  // back as) the device's links, so parse, write and parse again agree.
  if (std::all_of(out.begin(), out.end(), [](const MeshDimNetwork& d) { return d.empty(); }))
    out.clear();
  return out;
}

json networkToJson(const std::vector<MeshDimNetwork>& network) {
  json arr = json::array();
  for (const MeshDimNetwork& d : network) {
    json o = json::object();
    for (size_t k = 0; k < 4; ++k)
      if (d.by_kind[k]) {
        json l = linkToJson(*d.by_kind[k]);
        if (const auto& t = d.tables[k])
          l["measured"] = {{"group_size", t->group_size}, {"bytes", t->bytes}, {"us", t->us}};
        o[kNetworkKindKeys[k]] = l;
      }
    if (d.ranks_per_node > 0) o["ranks_per_node"] = d.ranks_per_node;
    if (d.inter_node) o["inter_node"] = linkToJson(*d.inter_node);
    arr.push_back(o);
  }
  return arr;
}

/// {"<work>": [...], "us": [...]}: 2 to 64 points, work ascending and positive, times positive.
Expected<KernelTable> readKernelTable(const json& j, const std::string& path, const char* work) {
  APC_RETURN_IF_ERROR(
      expectObject(j, path, "a table {\"" + std::string(work) + "\": [...], \"us\": [...]}"));
  APC_RETURN_IF_ERROR(checkKeys(j, path, {work, "us"}));
  const json* w = find(j, work);
  const json* us = find(j, "us");
  if (!w || !us) return at(path, "needs '" + std::string(work) + "' and 'us'");
  if (!w->is_array() || !us->is_array() || w->size() != us->size() || w->size() < 2 ||
      w->size() > 64)
    return at(path, "'" + std::string(work) +
                        "' and 'us' must be lists of the same length, 2 to 64 entries");
  KernelTable t;
  for (size_t i = 0; i < w->size(); ++i) {
    const std::string wp = indexPath(path + "." + work, i);
    APC_ASSIGN_OR_RETURN(double x, readInRange((*w)[i], wp, work, 1, 1e21));
    APC_ASSIGN_OR_RETURN(
        double u, readInRange((*us)[i], indexPath(path + ".us", i), "time (us)", 1e-6, 1e12));
    if (i > 0 && !(x > t.work.back())) return at(wp, "values must ascend");
    t.work.push_back(x);
    t.us.push_back(u);
  }
  return t;
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
  APC_RETURN_IF_ERROR(checkKeys(
      j, path,
      {"kind", "peak_tflops", "hbm_bandwidth_gbps", "compute_efficiency", "memory_efficiency",
       "kernel_floor_us", "dispatch_us", "dispatch_overlaps", "view_dispatch_us",
       "overlap_efficiency", "wait_resume_us", "matmul_output_gbps", "matvec_gbps",
       "outer_product_gbps", "conv_weight_gbps", "conv_weight_grad_gbps", "measured"}));
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
  if (const json* e = find(j, "compute_efficiency")) {
    APC_ASSIGN_OR_RETURN(
        s.device_overrides.compute_efficiency,
        readInRange(*e, path + ".compute_efficiency", "compute efficiency", 1e-3, 1));
  }
  if (const json* e = find(j, "memory_efficiency")) {
    APC_ASSIGN_OR_RETURN(
        s.device_overrides.memory_efficiency,
        readInRange(*e, path + ".memory_efficiency", "memory efficiency", 1e-3, 1));
  }
  if (const json* e = find(j, "kernel_floor_us")) {
    APC_ASSIGN_OR_RETURN(s.device_overrides.kernel_floor_us,
                         readInRange(*e, path + ".kernel_floor_us", "kernel floor (us)", 0, 1e6));
  }
  if (const json* e = find(j, "dispatch_us")) {
    APC_ASSIGN_OR_RETURN(s.device_overrides.dispatch_us,
                         readInRange(*e, path + ".dispatch_us", "dispatch time (us)", 0, 1e6));
  }
  if (const json* e = find(j, "dispatch_overlaps")) {
    if (!e->is_boolean())
      return at(path + ".dispatch_overlaps", "expected true or false, got " + describe(*e));
    s.device_overrides.dispatch_overlaps = e->get<bool>();
  }
  if (const json* e = find(j, "view_dispatch_us")) {
    APC_ASSIGN_OR_RETURN(
        s.device_overrides.view_dispatch_us,
        readInRange(*e, path + ".view_dispatch_us", "view dispatch time (us)", 0, 1e6));
  }
  if (const json* e = find(j, "overlap_efficiency")) {
    APC_ASSIGN_OR_RETURN(s.device_overrides.overlap_efficiency,
                         readInRange(*e, path + ".overlap_efficiency", "overlap efficiency", 0, 1));
  }
  if (const json* e = find(j, "wait_resume_us")) {
    APC_ASSIGN_OR_RETURN(
        s.device_overrides.wait_resume_us,
        readInRange(*e, path + ".wait_resume_us", "wait resume time (us)", 0, 1e6));
  }
  for (const RateField& f : kRateFields)
    if (const json* e = find(j, f.key)) {
      APC_ASSIGN_OR_RETURN(s.device_overrides.*f.field,
                           readInRange(*e, path + "." + f.key, f.what, 0, 1e9));
    }
  if (const json* m = find(j, "measured")) {
    const std::string mp = path + ".measured";
    APC_RETURN_IF_ERROR(expectObject(*m, mp, "an object {\"matmul\": ..., \"elementwise\": ...}"));
    APC_RETURN_IF_ERROR(
        checkKeys(*m, mp, {"matmul", "conv", "attention", "elementwise", "ops", "nodes"}));
    auto byDType = [&](const char* key, std::map<ir::DType, KernelTable>& out) -> Status {
      const json* mm = find(*m, key);
      if (!mm) return Status::success();
      const std::string tp = mp + "." + key;
      APC_RETURN_IF_ERROR(expectObject(*mm, tp, "an object of tables by dtype"));
      for (const auto& [name, value] : mm->items()) {
        const std::string kp = keyPath(tp, name);
        APC_ASSIGN_OR_RETURN(ir::DType d, readDType(json(name), kp, /*floating_only=*/true));
        APC_ASSIGN_OR_RETURN(KernelTable t, readKernelTable(value, kp, "flops"));
        if (!out.emplace(d, std::move(t)).second)
          return at(kp, "dtype " + std::string(ir::dtypeName(d)) + " is given twice");
      }
      return Status::success();
    };
    APC_RETURN_IF_ERROR(byDType("matmul", s.device_overrides.matmul_us));
    APC_RETURN_IF_ERROR(byDType("conv", s.device_overrides.conv_us));
    APC_RETURN_IF_ERROR(byDType("attention", s.device_overrides.attention_us));
    if (const json* ops = find(*m, "ops")) {
      const std::string tp = mp + ".ops";
      APC_RETURN_IF_ERROR(expectObject(*ops, tp, "an object of tables by op name"));
      for (const auto& [name, value] : ops->items()) {
        const std::string kp = keyPath(tp, name);
        if (name.find("::") == std::string::npos)
          return at(kp, "expected a qualified op name like \"aten::tanh\"");
        APC_ASSIGN_OR_RETURN(KernelTable t, readKernelTable(value, kp, "bytes"));
        s.device_overrides.op_us.emplace(name, std::move(t));
      }
    }
    if (const json* ew = find(*m, "elementwise")) {
      APC_ASSIGN_OR_RETURN(s.device_overrides.elementwise_us,
                           readKernelTable(*ew, mp + ".elementwise", "bytes"));
    }
    if (const json* nodes = find(*m, "nodes")) {
      const std::string tp = mp + ".nodes";
      APC_RETURN_IF_ERROR(expectObject(*nodes, tp, "an object of node times by node key"));
      for (const auto& [key, value] : nodes->items()) {
        const std::string kp = keyPath(tp, key);
        if (key.find("::") == std::string::npos || key.back() != ')')
          return at(kp, "expected a node key like \"aten::relu(f32[8,16]g)\"");
        APC_RETURN_IF_ERROR(
            expectObject(value, kp, "an object {\"forward_us\": ..., \"backward_us\": ...}"));
        APC_RETURN_IF_ERROR(checkKeys(value, kp, {"forward_us", "backward_us"}));
        const json* f = find(value, "forward_us");
        const json* b = find(value, "backward_us");
        if (!f || !b) return at(kp, "needs 'forward_us' and 'backward_us'");
        APC_ASSIGN_OR_RETURN(double fu, readInRange(*f, kp + ".forward_us", "time (us)", 0, 1e12));
        APC_ASSIGN_OR_RETURN(double bu, readInRange(*b, kp + ".backward_us", "time (us)", 0, 1e12));
        s.device_overrides.node_us[key] = {fu, bu};
      }
    }
  }
  return Status::success();
}

/// Bytes of memory per device (rank): an integer in [1, 2^62) or a size with a unit ("80GiB"). The
/// spec's device_memory and the cluster profile's.
Expected<int64_t> readDeviceMemory(const json& j, const std::string& path) {
  if (j.is_string()) {
    auto bytes = parseByteSize(j.get<std::string>());
    if (!bytes.ok()) return at(path, bytes.error().message());
    return *bytes;
  }
  APC_ASSIGN_OR_RETURN(int64_t b, readInt(j, path));
  if (b < 1 || b >= (int64_t{1} << 62))
    return at(path, "bytes per rank must be in [1, 2^62), got " + std::to_string(b));
  return b;
}

Expected<MemoryBudget> readMemoryBudget(const json& j, const std::string& path) {
  APC_RETURN_IF_ERROR(expectObject(j, path, "an object {\"low\": ..., \"high\": ...}"));
  APC_RETURN_IF_ERROR(checkKeys(j, path, {"low", "high"}));
  MemoryBudget b;
  if (const json* low = find(j, "low")) {
    APC_ASSIGN_OR_RETURN(b.low, readNumber(*low, path + ".low"));
  }
  if (const json* high = find(j, "high")) {
    APC_ASSIGN_OR_RETURN(double h, readNumber(*high, path + ".high"));
    b.high = h;
  }
  if (std::optional<MemoryBudget::Violation> v = b.violation())
    return at(v->field.empty() ? path : keyPath(path, v->field), v->message);
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

}  // namespace

Expected<MixedPrecision> parseMixedPrecisionText(std::string_view text) {
  json j = json::object();
  for (const std::string& item : split(std::string(text), ',')) {
    std::string_view entry = trim(item);
    const size_t eq = entry.find('=');
    if (eq == std::string_view::npos)
      return invalidArgument("mixed precision '" + std::string(text) + "': entry '" +
                             std::string(entry) +
                             "' is not KEY=DTYPE (keys param, reduce, output; e.g. "
                             "param=bf16,reduce=f32)");
    const std::string key(trim(entry.substr(0, eq)));
    if (key != "param" && key != "reduce" && key != "output")
      return invalidArgument("mixed precision '" + std::string(text) + "': unknown key '" + key +
                             "' (keys: param, reduce, output)");
    if (j.contains(key + "_dtype"))
      return invalidArgument("mixed precision '" + std::string(text) + "': '" + key +
                             "' given twice");
    j[key + "_dtype"] = std::string(trim(entry.substr(eq + 1)));
  }
  auto mp = readMixedPrecision(j, "--mixed-precision");
  if (!mp.ok()) return mp.error();
  if (mp->empty()) return invalidArgument("mixed precision '" + std::string(text) + "' is empty");
  return mp;
}

namespace {

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
                            : " to " + toCompactString(first.placements) + ", here to " +
                                  toCompactString(pin.placements) + ")"));
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

// --- specs ---------------------------------------------------------------------------------------

Expected<Spec> parseSpec(const json& j) {
  APC_RETURN_IF_ERROR(expectObject(j, "$", "a spec object like {\"mesh\": {\"shape\": [2, 4]}}"));
  APC_RETURN_IF_ERROR(
      checkKeys(j, "$",
                {"mesh", "device", "world_size", "inputs", "outputs", "memory_budget",
                 "mixed_precision", "dynamic_batch", "dynamic", "pins", "prefetch_discount",
                 "shared_reads", "network", "device_memory", "optimizer"}));
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
  if (const json* sr = find(j, "shared_reads")) {
    APC_ASSIGN_OR_RETURN(s.shared_reads, readBool(*sr, "$.shared_reads"));
  }
  if (const json* dyn = find(j, "dynamic")) {
    APC_ASSIGN_OR_RETURN(s.dynamic, readDynamic(*dyn, "$.dynamic"));
  }
  if (const json* pins = find(j, "pins")) {
    APC_ASSIGN_OR_RETURN(s.pins, readPins(*pins, "$.pins", ndim));
  }
  if (const json* pd = find(j, "prefetch_discount")) {
    if (pd->is_string()) {
      if (pd->get<std::string>() != "schedule")
        return invalidArgument(
            "$.prefetch_discount: expected a number in [0, 1] or \"schedule\", got \"" +
            pd->get<std::string>() + "\"");
      s.schedule_discount = true;
    } else {
      APC_ASSIGN_OR_RETURN(s.prefetch_discount,
                           readInRange(*pd, "$.prefetch_discount", "the prefetch discount", 0, 1));
    }
  }
  if (const json* net = find(j, "network")) {
    APC_ASSIGN_OR_RETURN(s.network, readNetwork(*net, "$.network", ndim));
  }
  if (const json* dm = find(j, "device_memory")) {
    APC_ASSIGN_OR_RETURN(s.device_memory, readDeviceMemory(*dm, "$.device_memory"));
    if (find(j, "memory_budget"))
      return at("$.device_memory",
                "give either device_memory (bytes per device) or memory_budget (fractions of the "
                "parameter bytes), not both");
  }
  if (const json* opt = find(j, "optimizer")) {
    if (!opt->is_string() || (*opt != "sgd" && *opt != "momentum" && *opt != "adamw"))
      return at("$.optimizer", "expected \"sgd\", \"momentum\" or \"adamw\", got " + opt->dump());
    s.optimizer = opt->get<std::string>();
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

Expected<ClusterProfile> parseClusterProfile(const json& j) {
  APC_RETURN_IF_ERROR(expectObject(
      j, "$", "a cluster profile object {\"apc_cluster_profile\": 1, \"device\": ..., ...}"));
  const json* version = find(j, "apc_cluster_profile");
  if (!version)
    return at("$", "missing required key 'apc_cluster_profile' (not a file of apc calibrate?)");
  APC_RETURN_IF_ERROR(checkKeys(
      j, "$",
      {"apc_cluster_profile", "device", "links", "network", "device_memory", "calibration"}));
  APC_ASSIGN_OR_RETURN(
      double v, readInRange(*version, "$.apc_cluster_profile", "cluster profile version", 1, 1e6));
  if (v != kClusterProfileVersion)
    return at("$.apc_cluster_profile", "version " + std::to_string(static_cast<int64_t>(v)) +
                                           " is not supported (this apc reads version " +
                                           std::to_string(kClusterProfileVersion) + ")");
  ClusterProfile p;
  const json* device = find(j, "device");
  if (!device) return at("$", "missing required key 'device'");
  Spec holder;
  APC_RETURN_IF_ERROR(readDevice(*device, "$.device", holder));
  p.device = holder.device;
  p.device_overrides = holder.device_overrides;
  const json* links = find(j, "links");
  if (!links) return at("$", "missing required key 'links'");
  if (!links->is_array() || links->empty() || links->size() > kMaxMeshDims)
    return at("$.links", "expected a list of 1 to " + std::to_string(kMaxMeshDims) +
                             " links {\"bandwidth_gbps\": ..., \"latency_us\": ...}, got " +
                             describe(*links));
  for (size_t i = 0; i < links->size(); ++i) {
    APC_ASSIGN_OR_RETURN(LinkParams link, readLink((*links)[i], indexPath("$.links", i)));
    p.links.push_back(link);
  }
  if (const json* net = find(j, "network")) {
    APC_ASSIGN_OR_RETURN(p.network, readNetwork(*net, "$.network", p.links.size()));
  }
  if (const json* dm = find(j, "device_memory")) {
    APC_ASSIGN_OR_RETURN(p.device_memory, readDeviceMemory(*dm, "$.device_memory"));
  }
  if (const json* c = find(j, "calibration")) {
    if (!c->is_object()) return at("$.calibration", "expected an object, got " + describe(*c));
    p.calibration = c->dump();
  }
  return p;
}

namespace detail {
extern const char* const kCpuClusterJson;  // builtin_cluster.cpp (generated)
}  // namespace detail

const ClusterProfile* builtinClusterProfile(std::string_view device) {
  if (device != "cpu") return nullptr;
  // Parsed once. The embedded file is checked by cost_test
  // (CostModel.TheBuiltInCpuIsTheEmbeddedCalibratedProfile fails on null), so a failure here is a
  // build whose tests did not pass.
  static const std::optional<ClusterProfile> cpu = []() -> std::optional<ClusterProfile> {
    json j = json::parse(detail::kCpuClusterJson, nullptr, false);
    if (j.is_discarded()) return std::nullopt;
    auto p = parseClusterProfile(j);
    if (!p.ok()) return std::nullopt;
    return std::move(p).value();
  }();
  return cpu ? &*cpu : nullptr;
}

Expected<ClusterProfile> readClusterProfile(const std::string& path) {
  APC_ASSIGN_OR_RETURN(json j, readJsonFile(path));
  auto p = parseClusterProfile(j);
  if (!p.ok()) return p.error().withContext(path);
  return p;
}

json toJson(const ClusterProfile& p) {
  Spec holder;
  holder.device = p.device;
  holder.device_overrides = p.device_overrides;
  json j;
  j["apc_cluster_profile"] = kClusterProfileVersion;
  json device = toJson(holder)["device"];
  j["device"] = device;
  json links = json::array();
  for (const LinkParams& l : p.links) links.push_back(linkToJson(l));
  j["links"] = links;
  if (!p.network.empty()) j["network"] = networkToJson(p.network);
  if (p.device_memory) j["device_memory"] = *p.device_memory;
  if (!p.calibration.empty()) j["calibration"] = json::parse(p.calibration);
  return j;
}

Status applyClusterProfile(const ClusterProfile& p, Spec& spec) {
  const size_t ndim = spec.mesh.ndim();
  if (p.links.size() != 1 && p.links.size() != ndim)
    return invalidArgument("the cluster profile has " + std::to_string(p.links.size()) +
                           " links but the mesh " + spec.mesh.toString() + " has " +
                           std::to_string(ndim) +
                           " dims: calibrate on the same mesh (apc calibrate --mesh), or on a "
                           "1-d mesh for one link on every dim");
  spec.device = p.device;
  spec.device_overrides = p.device_overrides;
  spec.network.clear();
  for (size_t m = 0; m < ndim; ++m) {
    const size_t from = p.links.size() == 1 ? 0 : m;
    spec.mesh.setLink(m, p.links[from]);
    if (!p.network.empty()) spec.network.push_back(p.network[from]);
  }
  return Status::success();
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
    if (s.device_overrides.compute_efficiency)
      dev["compute_efficiency"] = *s.device_overrides.compute_efficiency;
    if (s.device_overrides.memory_efficiency)
      dev["memory_efficiency"] = *s.device_overrides.memory_efficiency;
    if (s.device_overrides.kernel_floor_us)
      dev["kernel_floor_us"] = *s.device_overrides.kernel_floor_us;
    if (s.device_overrides.dispatch_us) dev["dispatch_us"] = *s.device_overrides.dispatch_us;
    if (s.device_overrides.dispatch_overlaps)
      dev["dispatch_overlaps"] = *s.device_overrides.dispatch_overlaps;
    if (s.device_overrides.view_dispatch_us)
      dev["view_dispatch_us"] = *s.device_overrides.view_dispatch_us;
    if (s.device_overrides.overlap_efficiency)
      dev["overlap_efficiency"] = *s.device_overrides.overlap_efficiency;
    if (s.device_overrides.wait_resume_us)
      dev["wait_resume_us"] = *s.device_overrides.wait_resume_us;
    for (const RateField& f : kRateFields)
      if (const std::optional<double>& v = s.device_overrides.*f.field) dev[f.key] = *v;
    if (!s.device_overrides.matmul_us.empty() || !s.device_overrides.conv_us.empty() ||
        !s.device_overrides.attention_us.empty() || s.device_overrides.elementwise_us ||
        !s.device_overrides.op_us.empty() || !s.device_overrides.node_us.empty()) {
      json measured = json::object();
      auto byDType = [&](const char* key, const std::map<ir::DType, KernelTable>& tables) {
        if (tables.empty()) return;
        json mm = json::object();
        for (const auto& [d, t] : tables) mm[ir::dtypeName(d)] = {{"flops", t.work}, {"us", t.us}};
        measured[key] = mm;
      };
      byDType("matmul", s.device_overrides.matmul_us);
      byDType("conv", s.device_overrides.conv_us);
      byDType("attention", s.device_overrides.attention_us);
      if (const auto& t = s.device_overrides.elementwise_us)
        measured["elementwise"] = {{"bytes", t->work}, {"us", t->us}};
      if (!s.device_overrides.op_us.empty()) {
        json ops = json::object();
        for (const auto& [name, t] : s.device_overrides.op_us)
          ops[name] = {{"bytes", t.work}, {"us", t.us}};
        measured["ops"] = ops;
      }
      if (!s.device_overrides.node_us.empty()) {
        json nodes = json::object();
        for (const auto& [key, t] : s.device_overrides.node_us)
          nodes[key] = {{"forward_us", t[0]}, {"backward_us", t[1]}};
        measured["nodes"] = nodes;
      }
      dev["measured"] = measured;
    }
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
  if (s.schedule_discount)
    j["prefetch_discount"] = "schedule";
  else if (s.prefetch_discount != 1.0)
    j["prefetch_discount"] = s.prefetch_discount;
  if (s.shared_reads) j["shared_reads"] = true;
  bool has_network = false;
  for (const MeshDimNetwork& d : s.network) has_network |= !d.empty();
  if (has_network) j["network"] = networkToJson(s.network);
  if (s.device_memory) j["device_memory"] = *s.device_memory;
  if (s.optimizer != kDefaultOptimizer) j["optimizer"] = s.optimizer;
  return j;
}

}  // namespace apc::spec
