//===- lib/plan/plan_json.cpp - The plan's JSON form -----------------------===//
//
// Writes a Plan as canonical JSON (the layout of schemas/plan.schema.json) and reads it back with
// errors that name the JSON path of the offending value. The reader is as strict as the schema:
// unknown keys, wrong types and dangling node references are errors.
//
//===----------------------------------------------------------------------===//
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "apc/plan/plan.h"

#include "apc/mesh/placement_json.h"
#include "apc/plan/memory.h"
#include "apc/support/base64.h"
#include "apc/support/file_io.h"
#include "apc/support/json_reader.h"

namespace apc::plan {

using nlohmann::json;

namespace {

json number(double x) {
  return std::isfinite(x) ? json(canonicalNumber(x)) : json(nullptr);
}

json placementJson(const std::optional<PlacementTuple>& t) {
  return t ? mesh::toJson(*t) : json(nullptr);
}

json placementList(const std::vector<std::optional<PlacementTuple>>& ts) {
  json a = json::array();
  for (const auto& t : ts) a.push_back(placementJson(t));
  return a;
}

json sizesJson(const ProblemSizes& s) {
  json out = {
      {"before",
       {{"nodes", s.nodes_before}, {"edges", s.edges_before}, {"strategies", s.strategies_before}}},
      {"after",
       {{"nodes", s.nodes_after}, {"edges", s.edges_after}, {"strategies", s.strategies_after}}},
      {"clusters", s.clusters}};
  // Only where step 0 ran, so that other plans' bytes do not change.
  if (s.memory_subproblems > 0)
    out["memory_search"] = {{"subproblems", s.memory_subproblems}, {"branches", s.memory_branches}};
  return out;
}

std::string dumpScalar(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

/// True when `s` dumps as itself in quotes: printable ASCII without a quote or a backslash (every
/// key and nearly every value of a plan). Such strings skip nlohmann's serializer, which builds
/// a json value and a string per call; the bytes are the same.
bool isPlainString(const std::string& s) {
  for (unsigned char c : s)
    if (c < 0x20 || c > 0x7e || c == '"' || c == '\\') return false;
  return true;
}

void appendString(const std::string& s, std::string& out) {
  if (!isPlainString(s)) {
    out += dumpScalar(json(s));
    return;
  }
  out += '"';
  out += s;
  out += '"';
}

/// The length of dumpScalar(j), or a number above `limit` once it is known to exceed it (a long
/// string or a long list is not dumped just to learn that it does not fit).
size_t boundedDumpSize(const json& j, size_t limit) {
  if (j.is_string()) {
    const auto& s = j.get_ref<const std::string&>();
    if (s.size() + 2 > limit || isPlainString(s)) return s.size() + 2;
    return dumpScalar(j).size();
  }
  if (!j.is_structured()) return dumpScalar(j).size();
  size_t n = 2;  // the brackets
  bool first = true;
  for (auto it = j.begin(); it != j.end() && n <= limit; ++it) {
    n += first ? 0 : 1;  // the comma
    first = false;
    if (j.is_object())  // "key":
      n += (isPlainString(it.key()) ? it.key().size() + 2 : dumpScalar(json(it.key())).size()) + 1;
    n += boundedDumpSize(it.value(), limit - std::min(n, limit));
  }
  return n;
}

/// Arrays and objects of scalars (or arrays of such arrays) that fit on one line stay on one line.
bool fitsOnOneLine(const json& j) {
  if (!j.is_structured()) return true;
  if (j.empty()) return true;
  for (const auto& e : j) {
    if (!e.is_structured()) continue;
    if (j.is_object() || !e.is_array()) return false;
    for (const auto& x : e)
      if (x.is_structured()) return false;
  }
  return boundedDumpSize(j, 72) <= 72;
}

void writeCanonical(const json& j, int indent, std::string& out) {
  if (j.is_string()) {
    appendString(j.get_ref<const std::string&>(), out);
    return;
  }
  if (fitsOnOneLine(j)) {
    out += dumpScalar(j);
    return;
  }
  const size_t pad = static_cast<size_t>(indent + 2);
  bool first = true;
  if (j.is_object()) {
    out += "{\n";
    for (auto it = j.begin(); it != j.end(); ++it) {  // nlohmann::json keeps keys sorted
      if (!first) out += ",\n";
      first = false;
      out.append(pad, ' ');
      appendString(it.key(), out);
      out += ": ";
      writeCanonical(it.value(), indent + 2, out);
    }
  } else {
    out += "[\n";
    for (const auto& e : j) {
      if (!first) out += ",\n";
      first = false;
      out.append(pad, ' ');
      writeCanonical(e, indent + 2, out);
    }
  }
  out += '\n';
  out.append(static_cast<size_t>(indent), ' ');
  out += j.is_object() ? '}' : ']';
}

// --- reading -------------------------------------------------------------------------------------
// Through apc's one JSON reader (apc/support/json_reader.h): errors name the JSON path; integers
// are strict (a plan holds no 2.0 where it means 2) and, unless said otherwise, at least 0.

}  // namespace

namespace reading {

using namespace apc::json_reader;  // NOLINT: a named namespace, so it does not leak (unity builds)

Expected<int64_t> getInt(const json& j, const std::string& path, int64_t min = 0) {
  return readIntAtLeast(j, path, min, /*strict=*/true);
}

Expected<PlacementTuple> getPlacement(const json& j, const std::string& path, size_t ndim) {
  APC_RETURN_IF_ERROR(expectArray(j, path, "a list of placements"));
  if (j.size() != ndim)
    return at(path, "expected one placement per mesh dim (" + std::to_string(ndim) + "), got " +
                        std::to_string(j.size()));
  PlacementTuple out;
  for (size_t i = 0; i < j.size(); ++i) {
    std::string p = indexPath(path, i);
    APC_ASSIGN_OR_RETURN(std::string s, readString(j[i], p));
    auto parsed = mesh::Placement::parse(s);
    if (!parsed.ok()) return at(p, parsed.error().message());
    out.push_back(*parsed);
  }
  return out;
}

Expected<std::vector<std::optional<PlacementTuple>>> getPlacementList(const json& j,
                                                                      const std::string& path,
                                                                      size_t ndim) {
  APC_RETURN_IF_ERROR(expectArray(j, path));
  std::vector<std::optional<PlacementTuple>> out;
  for (size_t i = 0; i < j.size(); ++i) {
    if (j[i].is_null()) {
      out.emplace_back();
      continue;
    }
    APC_ASSIGN_OR_RETURN(PlacementTuple t, getPlacement(j[i], indexPath(path, i), ndim));
    out.emplace_back(std::move(t));
  }
  return out;
}

Expected<PlanSource> readSource(const json& j, const std::string& path) {
  APC_RETURN_IF_ERROR(checkObject(j, path, {"inputs", "name", "path", "sha256"}));
  PlanSource s;
  APC_ASSIGN_OR_RETURN(s.model_name, readString(j["name"], path + ".name"));
  APC_ASSIGN_OR_RETURN(s.model_path, readString(j["path"], path + ".path"));
  APC_ASSIGN_OR_RETURN(s.model_sha256, readString(j["sha256"], path + ".sha256"));
  const json& in = j["inputs"];
  APC_RETURN_IF_ERROR(expectArray(in, path + ".inputs"));
  for (size_t i = 0; i < in.size(); ++i) {
    APC_ASSIGN_OR_RETURN(std::string x, readString(in[i], indexPath(path + ".inputs", i)));
    s.inputs.push_back(std::move(x));
  }
  return s;
}

Expected<PlanNode> readNode(const json& j, const std::string& path, size_t index, size_t ndim) {
  APC_RETURN_IF_ERROR(
      checkObject(j, path,
                  {"comm_us", "compute_us", "cost_us", "in_edges", "index", "input_placements",
                   "kind", "module_path", "name", "num_strategies", "op", "output_placements",
                   "strategy", "strategy_index"},
                  {"graph_node", "outputs", "pin_group"}));
  PlanNode n;
  APC_ASSIGN_OR_RETURN(int64_t i, getInt(j["index"], path + ".index"));
  if (static_cast<size_t>(i) != index)
    return at(path + ".index", "expected " + std::to_string(index) + " (the node's position)");
  APC_ASSIGN_OR_RETURN(n.name, readString(j["name"], path + ".name"));
  APC_ASSIGN_OR_RETURN(n.kind, readString(j["kind"], path + ".kind"));
  if (n.kind != "input" && n.kind != "parameter" && n.kind != "buffer" && n.kind != "op" &&
      n.kind != "output" && n.kind != "pin")
    return at(path + ".kind",
              "expected input, parameter, buffer, op, output or pin, got '" + n.kind + "'");
  APC_ASSIGN_OR_RETURN(n.op, readString(j["op"], path + ".op"));
  APC_ASSIGN_OR_RETURN(n.module_path, readString(j["module_path"], path + ".module_path"));
  if (j.contains("graph_node")) {
    APC_ASSIGN_OR_RETURN(int64_t g, getInt(j["graph_node"], path + ".graph_node"));
    n.graph_node = static_cast<uint32_t>(g);
  }
  APC_ASSIGN_OR_RETURN(int64_t num, getInt(j["num_strategies"], path + ".num_strategies", 1));
  APC_ASSIGN_OR_RETURN(int64_t si, getInt(j["strategy_index"], path + ".strategy_index"));
  if (si >= num)
    return at(path + ".strategy_index",
              "must be below num_strategies (" + std::to_string(num) + ")");
  n.num_strategies = static_cast<uint32_t>(num);
  n.strategy_index = static_cast<uint32_t>(si);
  APC_ASSIGN_OR_RETURN(n.strategy, readString(j["strategy"], path + ".strategy"));
  APC_ASSIGN_OR_RETURN(n.input_placements,
                       getPlacementList(j["input_placements"], path + ".input_placements", ndim));
  // Empty for a node without a tensor output (a free output's sink): then "outputs" says so.
  PlacementTuple out;
  bool no_output =
      j["output_placements"].is_array() && j["output_placements"].empty() && j.contains("outputs");
  if (!no_output) {
    APC_ASSIGN_OR_RETURN(out,
                         getPlacement(j["output_placements"], path + ".output_placements", ndim));
  }
  if (j.contains("outputs")) {
    APC_ASSIGN_OR_RETURN(n.outputs, getPlacementList(j["outputs"], path + ".outputs", ndim));
    if (n.outputPlacements() != out)
      return at(path + ".output_placements", "differs from the first tensor entry of outputs");
  } else {
    n.outputs = {out};
  }
  const json& edges = j["in_edges"];
  APC_RETURN_IF_ERROR(expectArray(edges, path + ".in_edges"));
  for (size_t k = 0; k < edges.size(); ++k) {
    std::string ep = indexPath(path + ".in_edges", k);
    APC_RETURN_IF_ERROR(checkObject(edges[k], ep, {"cost_us", "from", "input"}));
    PlanEdge e;
    APC_ASSIGN_OR_RETURN(int64_t from, getInt(edges[k]["from"], ep + ".from"));
    APC_ASSIGN_OR_RETURN(int64_t input, getInt(edges[k]["input"], ep + ".input"));
    APC_ASSIGN_OR_RETURN(e.cost_us, readNumber(edges[k]["cost_us"], ep + ".cost_us"));
    e.from = static_cast<uint32_t>(from);
    e.input = static_cast<uint32_t>(input);
    n.in_edges.push_back(e);
  }
  APC_ASSIGN_OR_RETURN(n.compute_us, readNumber(j["compute_us"], path + ".compute_us"));
  APC_ASSIGN_OR_RETURN(n.comm_us, readNumber(j["comm_us"], path + ".comm_us"));
  APC_ASSIGN_OR_RETURN(n.cost_us, readNumber(j["cost_us"], path + ".cost_us"));
  if (j.contains("pin_group")) {
    APC_ASSIGN_OR_RETURN(n.pin_group, readString(j["pin_group"], path + ".pin_group"));
  }
  return n;
}

Expected<PlanParameter> readParameter(const json& j, const std::string& path, size_t ndim) {
  APC_RETURN_IF_ERROR(checkObject(
      j, path,
      {"bytes", "bytes_per_rank", "dtype", "module", "name", "node", "placement", "shape"}));
  PlanParameter p;
  APC_ASSIGN_OR_RETURN(p.name, readString(j["name"], path + ".name"));
  APC_ASSIGN_OR_RETURN(p.module, readString(j["module"], path + ".module"));
  const json& shape = j["shape"];
  APC_RETURN_IF_ERROR(expectArray(shape, path + ".shape"));
  for (size_t i = 0; i < shape.size(); ++i) {
    APC_ASSIGN_OR_RETURN(int64_t d, getInt(shape[i], indexPath(path + ".shape", i)));
    p.shape.push_back(d);
  }
  APC_ASSIGN_OR_RETURN(p.dtype, readString(j["dtype"], path + ".dtype"));
  APC_ASSIGN_OR_RETURN(p.placement, getPlacement(j["placement"], path + ".placement", ndim));
  APC_ASSIGN_OR_RETURN(p.bytes, getInt(j["bytes"], path + ".bytes"));
  APC_ASSIGN_OR_RETURN(p.bytes_per_rank, getInt(j["bytes_per_rank"], path + ".bytes_per_rank"));
  APC_ASSIGN_OR_RETURN(int64_t node, getInt(j["node"], path + ".node"));
  p.node = static_cast<uint32_t>(node);
  return p;
}

Expected<PlanTotals> readTotals(const json& j, const std::string& path) {
  APC_RETURN_IF_ERROR(
      checkObject(j, path,
                  {"comm_us", "compute_us", "memory_high", "memory_low", "param_bytes_per_rank",
                   "param_bytes_total", "param_memory_fraction", "total_us"},
                  {"recompute_us"}));
  PlanTotals t;
  APC_ASSIGN_OR_RETURN(t.compute_us, readNumber(j["compute_us"], path + ".compute_us"));
  APC_ASSIGN_OR_RETURN(t.comm_us, readNumber(j["comm_us"], path + ".comm_us"));
  APC_ASSIGN_OR_RETURN(t.total_us, readNumber(j["total_us"], path + ".total_us"));
  if (j.contains("recompute_us")) {
    APC_ASSIGN_OR_RETURN(t.recompute_us, readNumber(j["recompute_us"], path + ".recompute_us"));
    if (!(t.recompute_us > 0)) return at(path + ".recompute_us", "must be positive when present");
  }
  APC_ASSIGN_OR_RETURN(t.param_bytes_per_rank,
                       getInt(j["param_bytes_per_rank"], path + ".param_bytes_per_rank"));
  APC_ASSIGN_OR_RETURN(t.param_bytes_total,
                       getInt(j["param_bytes_total"], path + ".param_bytes_total"));
  APC_ASSIGN_OR_RETURN(t.param_memory_fraction,
                       readNumber(j["param_memory_fraction"], path + ".param_memory_fraction"));
  APC_ASSIGN_OR_RETURN(t.memory_low, readNumber(j["memory_low"], path + ".memory_low"));
  APC_ASSIGN_OR_RETURN(t.memory_high, readNumber(j["memory_high"], path + ".memory_high"));
  return t;
}

Expected<std::vector<MemoryEstimate>> readMemory(const json& j, const std::string& path) {
  if (!j.is_object()) return at(path, "expected an object by optimizer, got " + describe(j));
  std::vector<MemoryEstimate> out;
  for (const std::string& name : memoryOptimizers()) {
    if (!j.contains(name)) continue;
    const json& e = j[name];
    const std::string ep = path + "." + name;
    APC_RETURN_IF_ERROR(checkObject(e, ep,
                                    {"at", "at_peak", "by_phase", "peak_bytes", "persistent_bytes",
                                     "phase", "saved_activations", "saved_by_op"}));
    MemoryEstimate m;
    m.optimizer = name;
    APC_ASSIGN_OR_RETURN(m.peak_bytes, getInt(e["peak_bytes"], ep + ".peak_bytes"));
    APC_ASSIGN_OR_RETURN(m.phase, readString(e["phase"], ep + ".phase"));
    APC_ASSIGN_OR_RETURN(m.at, readString(e["at"], ep + ".at"));
    APC_ASSIGN_OR_RETURN(m.saved_activations,
                         getInt(e["saved_activations"], ep + ".saved_activations"));
    APC_ASSIGN_OR_RETURN(m.persistent_bytes,
                         getInt(e["persistent_bytes"], ep + ".persistent_bytes"));
    const json& ph = e["by_phase"];
    const std::string pp = ep + ".by_phase";
    APC_RETURN_IF_ERROR(checkObject(ph, pp, {"backward", "forward", "loss", "optimizer"}));
    APC_ASSIGN_OR_RETURN(m.forward_peak, getInt(ph["forward"], pp + ".forward"));
    APC_ASSIGN_OR_RETURN(m.loss_peak, getInt(ph["loss"], pp + ".loss"));
    APC_ASSIGN_OR_RETURN(m.backward_peak, getInt(ph["backward"], pp + ".backward"));
    APC_ASSIGN_OR_RETURN(m.optimizer_peak, getInt(ph["optimizer"], pp + ".optimizer"));
    const json& ops = e["saved_by_op"];
    APC_RETURN_IF_ERROR(expectArray(ops, ep + ".saved_by_op"));
    for (size_t k = 0; k < ops.size(); ++k) {
      const std::string op_path = indexPath(ep + ".saved_by_op", k);
      if (!ops[k].is_array() || ops[k].size() != 2) return at(op_path, "expected [op, bytes]");
      APC_ASSIGN_OR_RETURN(std::string op, readString(ops[k][0], op_path + "[0]"));
      APC_ASSIGN_OR_RETURN(int64_t bytes, getInt(ops[k][1], op_path + "[1]"));
      m.saved_by_op.emplace_back(std::move(op), bytes);
    }
    const json& a = e["at_peak"];
    const std::string ap = ep + ".at_peak";
    APC_RETURN_IF_ERROR(checkObject(a, ap,
                                    {"activations", "buffers", "gradients", "inputs",
                                     "optimizer_state", "parameters", "transient"}));
    MemoryParts& q = m.at_peak;
    APC_ASSIGN_OR_RETURN(q.parameters, getInt(a["parameters"], ap + ".parameters"));
    APC_ASSIGN_OR_RETURN(q.buffers, getInt(a["buffers"], ap + ".buffers"));
    APC_ASSIGN_OR_RETURN(q.inputs, getInt(a["inputs"], ap + ".inputs"));
    APC_ASSIGN_OR_RETURN(q.optimizer_state, getInt(a["optimizer_state"], ap + ".optimizer_state"));
    APC_ASSIGN_OR_RETURN(q.activations, getInt(a["activations"], ap + ".activations"));
    APC_ASSIGN_OR_RETURN(q.gradients, getInt(a["gradients"], ap + ".gradients"));
    APC_ASSIGN_OR_RETURN(q.transient, getInt(a["transient"], ap + ".transient"));
    out.push_back(std::move(m));
  }
  for (auto it = j.begin(); it != j.end(); ++it)
    if (std::find(memoryOptimizers().begin(), memoryOptimizers().end(), it.key()) ==
        memoryOptimizers().end())
      return at(keyPath(path, it.key()), "unknown optimizer (sgd, momentum or adamw)");
  return out;
}

Expected<size_t> readCount(const json& j, const std::string& path) {
  APC_ASSIGN_OR_RETURN(int64_t v, getInt(j, path));
  return static_cast<size_t>(v);
}

Expected<SolverStats> readSolver(const json& j, const std::string& path) {
  APC_RETURN_IF_ERROR(checkObject(
      j, path,
      {"bound", "constraints", "objective", "options", "problem", "seconds", "status", "variables"},
      {"baseline", "gap"}));
  SolverStats s;
  APC_ASSIGN_OR_RETURN(const std::string status, readString(j["status"], path + ".status"));
  auto parsed_status = parsePlanStatus(status);
  if (!parsed_status.ok()) return at(path + ".status", parsed_status.error().message());
  s.status = parsed_status->first;
  APC_ASSIGN_OR_RETURN(s.objective, readNumber(j["objective"], path + ".objective"));
  if (!j["bound"].is_null()) {
    APC_ASSIGN_OR_RETURN(double b, readNumber(j["bound"], path + ".bound"));
    s.bound = b;
  }
  if (!j["seconds"].is_null())
    return at(path + ".seconds", "must be null (wall times are not stored in plans)");
  APC_ASSIGN_OR_RETURN(s.variables, getInt(j["variables"], path + ".variables"));
  APC_ASSIGN_OR_RETURN(s.constraints, getInt(j["constraints"], path + ".constraints"));
  const json& pr = j["problem"];
  std::string pp = path + ".problem";
  APC_RETURN_IF_ERROR(checkObject(pr, pp, {"after", "before", "clusters"}, {"memory_search"}));
  APC_RETURN_IF_ERROR(checkObject(pr["before"], pp + ".before", {"edges", "nodes", "strategies"}));
  APC_RETURN_IF_ERROR(checkObject(pr["after"], pp + ".after", {"edges", "nodes", "strategies"}));
  ProblemSizes& r = s.sizes;
  APC_ASSIGN_OR_RETURN(r.nodes_before, readCount(pr["before"]["nodes"], pp + ".before.nodes"));
  APC_ASSIGN_OR_RETURN(r.edges_before, readCount(pr["before"]["edges"], pp + ".before.edges"));
  APC_ASSIGN_OR_RETURN(r.strategies_before,
                       readCount(pr["before"]["strategies"], pp + ".before.strategies"));
  APC_ASSIGN_OR_RETURN(r.nodes_after, readCount(pr["after"]["nodes"], pp + ".after.nodes"));
  APC_ASSIGN_OR_RETURN(r.edges_after, readCount(pr["after"]["edges"], pp + ".after.edges"));
  APC_ASSIGN_OR_RETURN(r.strategies_after,
                       readCount(pr["after"]["strategies"], pp + ".after.strategies"));
  APC_ASSIGN_OR_RETURN(r.clusters, readCount(pr["clusters"], pp + ".clusters"));
  if (pr.contains("memory_search")) {
    const json& ms = pr["memory_search"];
    std::string mp = pp + ".memory_search";
    APC_RETURN_IF_ERROR(checkObject(ms, mp, {"branches", "subproblems"}));
    APC_ASSIGN_OR_RETURN(r.memory_subproblems, readCount(ms["subproblems"], mp + ".subproblems"));
    APC_ASSIGN_OR_RETURN(r.memory_branches, readCount(ms["branches"], mp + ".branches"));
    if (r.memory_subproblems == 0) return at(mp + ".subproblems", "must be at least 1");
  }
  const json& o = j["options"];
  std::string op = path + ".options";
  APC_RETURN_IF_ERROR(checkObject(o, op, {"reduce", "threads", "time_limit_s"}));
  APC_ASSIGN_OR_RETURN(s.reduce, readBool(o["reduce"], op + ".reduce"));
  APC_ASSIGN_OR_RETURN(int64_t threads, getInt(o["threads"], op + ".threads", 1));
  s.threads = static_cast<int>(threads);
  APC_ASSIGN_OR_RETURN(s.time_limit_s, readNumber(o["time_limit_s"], op + ".time_limit_s"));
  if (j.contains("baseline")) {
    APC_ASSIGN_OR_RETURN(s.baseline, readString(j["baseline"], path + ".baseline"));
    // solver::baselineName's names (plan_test checks that they agree): the plan library links
    // no solver.
    static const char* const kBaselineNames[] = {"ddp", "fsdp", "tp", "fsdp+tp"};
    if (std::find(std::begin(kBaselineNames), std::end(kBaselineNames), s.baseline) ==
        std::end(kBaselineNames))
      return at(path + ".baseline", "expected ddp, fsdp, tp or fsdp+tp, got '" + s.baseline + "'");
  }
  // "baseline <name>" and the baseline key say the same.
  if (parsed_status->second != s.baseline)
    return at(path + ".status", "'" + status + "' does not match baseline '" + s.baseline + "'");
  return s;
}

}  // namespace reading

namespace {

/// Everything of the plan's document but the nodes (an empty array) and the graph, which
/// toJsonText streams.
json documentJson(const Plan& p) {
  json params = json::array();
  for (const PlanParameter& q : p.parameters)
    params.push_back({{"name", q.name},
                      {"module", q.module},
                      {"shape", q.shape},
                      {"dtype", q.dtype},
                      {"placement", mesh::toJson(q.placement)},
                      {"bytes", q.bytes},
                      {"bytes_per_rank", q.bytes_per_rank},
                      {"node", q.node}});
  const PlanTotals& t = p.totals;
  const SolverStats& s = p.solver;
  json out = {{"format_version", p.format_version},
              {"apc_version", p.apc_version},
              {"content_hash", p.content_hash},
              {"model",
               {{"name", p.model.model_name},
                {"path", p.model.model_path},
                {"sha256", p.model.model_sha256},
                {"inputs", p.model.inputs}}},
              {"spec", spec::toJson(p.spec)},
              {"nodes", json::array()},
              {"parameters", std::move(params)},
              {"totals",
               {{"compute_us", number(t.compute_us)},
                {"comm_us", number(t.comm_us)},
                {"total_us", number(t.total_us)},
                {"param_bytes_per_rank", t.param_bytes_per_rank},
                {"param_bytes_total", t.param_bytes_total},
                {"param_memory_fraction", number(t.param_memory_fraction)},
                {"memory_low", number(t.memory_low)},
                {"memory_high", number(t.memory_high)}}},
              {"solver",
               {{"status", s.statusText()},
                {"objective", number(s.objective)},
                {"bound", s.bound ? number(*s.bound) : json(nullptr)},
                {"seconds", nullptr},
                {"variables", s.variables},
                {"constraints", s.constraints},
                {"problem", sizesJson(s.sizes)},
                {"options",
                 {{"time_limit_s", number(s.time_limit_s)},
                  {"threads", s.threads},
                  {"reduce", s.reduce}}}}}};
  if (!p.memory.empty()) out["memory"] = memoryJson(p);
  if (t.recompute_us > 0) out["totals"]["recompute_us"] = number(t.recompute_us);
  if (!p.checkpoint.empty()) out["checkpoint"] = p.checkpoint;
  if (!s.baseline.empty()) out["solver"]["baseline"] = s.baseline;
  // Unproven plans (a time limit, a check too large to run) state their proven gap: (objective -
  // bound) / objective. Derived, so optimal plans' bytes do not change.
  if (s.unproven() && s.bound && s.objective > 0)
    out["solver"]["gap"] = number((s.objective - *s.bound) / s.objective);
  return out;
}

// --- the streamed text ---------------------------------------------------------------------------
// toJsonText writes the nodes straight from the Plan, in the bytes writeCanonical gives their
// JSON objects (tests/plan: PlanJson.StreamedTextEqualsTheTreeText), so that a plan of 11k nodes
// (126 layers) never holds a JSON tree of them: building, laying out and freeing that tree was
// 0.17 s of the 0.2 s write.

/// The text of numbers, made once per bit pattern: a deep model's nodes repeat their costs once
/// per layer, and each text is a JSON scalar formatted by nlohmann.
class NumberTexts {
 public:
  const std::string& operator()(double x) {
    uint64_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    auto [it, fresh] = texts_.try_emplace(bits);
    if (fresh) it->second = dumpScalar(number(x));
    return it->second;
  }

 private:
  std::unordered_map<uint64_t, std::string> texts_;
};

void appendNumber(double x, std::string& out, NumberTexts& numbers) {
  out += numbers(x);
}

/// A key of an object at `indent`, after its predecessor: `,\n` (unless first), the pad, `"key": `.
void appendKey(const char* key, int indent, bool& first, std::string& out) {
  if (!first) out += ",\n";
  first = false;
  out.append(static_cast<size_t>(indent + 2), ' ');
  out += '"';
  out += key;
  out += "\": ";
}

/// An edge object, always on one line: canonical numbers have 12 significant digits and the two
/// indices at most 10, so its compact form is at most 68 characters, within fitsOnOneLine's 72
/// (the test feeds it the longest values).
void writeEdge(const PlanEdge& e, std::string& out, NumberTexts& numbers) {
  out += "{\"cost_us\":";
  out += numbers(e.cost_us);
  out += ",\"from\":";
  out += std::to_string(e.from);
  out += ",\"input\":";
  out += std::to_string(e.input);
  out += '}';
}

/// A placement tuple's compact text, `["S(0)","R"]`, or "" when a placement's text needs escaping
/// (never with today's placements; the caller then takes the generic writer).
std::string compactTuple(const PlacementTuple& t) {
  std::string out = "[";
  for (size_t d = 0; d < t.size(); ++d) {
    const std::string p = t[d].toString();
    if (!isPlainString(p)) return "";
    if (d) out += ',';
    out += '"';
    out += p;
    out += '"';
  }
  return out + "]";
}

/// writeCanonical of a placement tuple (an array of strings) at `indent`.
void writeTuple(const PlacementTuple& t, int indent, std::string& out) {
  std::string compact = compactTuple(t);
  if (compact.empty() || compact.size() > 72) {
    writeCanonical(mesh::toJson(t), indent, out);
    return;
  }
  out += compact;
}

/// writeCanonical of placementList(ts) at `indent`: one line when the compact form fits in 72
/// characters, else one element (null or a tuple) per line.
void writePlacementList(const std::vector<std::optional<PlacementTuple>>& ts, int indent,
                        std::string& out) {
  std::vector<std::string> parts;
  parts.reserve(ts.size());
  size_t compact = 2 + (ts.empty() ? 0 : ts.size() - 1);
  for (const auto& t : ts) {
    parts.push_back(t ? compactTuple(*t) : "null");
    if (parts.back().empty()) {  // a placement that needs escaping: the generic writer
      writeCanonical(placementList(ts), indent, out);
      return;
    }
    compact += parts.back().size();
  }
  if (compact <= 72) {
    out += '[';
    for (size_t k = 0; k < parts.size(); ++k) {
      if (k) out += ',';
      out += parts[k];
    }
    out += ']';
    return;
  }
  out += "[\n";
  for (size_t k = 0; k < ts.size(); ++k) {
    if (k) out += ",\n";
    out.append(static_cast<size_t>(indent + 2), ' ');
    if (ts[k])
      writeTuple(*ts[k], indent + 2, out);
    else
      out += "null";
  }
  out += '\n';
  out.append(static_cast<size_t>(indent), ' ');
  out += ']';
}

/// Node `i` as writeCanonical(nodeJson(n, i), indent) writes it: keys in nlohmann's (byte)
/// order, the layout rules of writeCanonical and fitsOnOneLine applied to each value.
void writeNode(const PlanNode& n, size_t i, int indent, std::string& out, NumberTexts& numbers) {
  const int inner = indent + 2;
  bool first = true;
  out += "{\n";
  appendKey("comm_us", indent, first, out);
  appendNumber(n.comm_us, out, numbers);
  appendKey("compute_us", indent, first, out);
  appendNumber(n.compute_us, out, numbers);
  appendKey("cost_us", indent, first, out);
  appendNumber(n.cost_us, out, numbers);
  if (n.graph_node) {
    appendKey("graph_node", indent, first, out);
    out += std::to_string(*n.graph_node);
  }
  appendKey("in_edges", indent, first, out);
  if (n.in_edges.empty()) {
    out += "[]";
  } else {
    out += "[\n";
    for (size_t k = 0; k < n.in_edges.size(); ++k) {
      if (k) out += ",\n";
      out.append(static_cast<size_t>(inner + 2), ' ');
      writeEdge(n.in_edges[k], out, numbers);
    }
    out += '\n';
    out.append(static_cast<size_t>(inner), ' ');
    out += ']';
  }
  appendKey("index", indent, first, out);
  out += std::to_string(i);
  appendKey("input_placements", indent, first, out);
  writePlacementList(n.input_placements, inner, out);
  appendKey("kind", indent, first, out);
  appendString(n.kind, out);
  appendKey("module_path", indent, first, out);
  appendString(n.module_path, out);
  appendKey("name", indent, first, out);
  appendString(n.name, out);
  appendKey("num_strategies", indent, first, out);
  out += std::to_string(n.num_strategies);
  appendKey("op", indent, first, out);
  appendString(n.op, out);
  const PlacementTuple output = n.outputPlacements();
  appendKey("output_placements", indent, first, out);
  writeTuple(output, inner, out);
  if (n.outputs.size() > 1 || output.empty()) {
    appendKey("outputs", indent, first, out);
    writePlacementList(n.outputs, inner, out);
  }
  if (!n.pin_group.empty()) {
    appendKey("pin_group", indent, first, out);
    appendString(n.pin_group, out);
  }
  appendKey("strategy", indent, first, out);
  appendString(n.strategy, out);
  appendKey("strategy_index", indent, first, out);
  out += std::to_string(n.strategy_index);
  out += '\n';
  out.append(static_cast<size_t>(indent), ' ');
  out += '}';
}

}  // namespace

json toJson(const Plan& p) {
  // One writer (toJsonText): the tree is its text read back.
  return json::parse(toJsonText(p));
}

namespace {

/// saved_by_op as a list of [op, bytes], largest first (the order the estimate keeps).
json savedByOp(const MemoryEstimate& e) {
  json out = json::array();
  for (const auto& [op, bytes] : e.saved_by_op) out.push_back(json::array({op, bytes}));
  return out;
}

}  // namespace

json memoryJson(const Plan& p) {
  json mem = json::object();
  for (const MemoryEstimate& e : p.memory) {
    const MemoryParts& m = e.at_peak;
    mem[e.optimizer] = {{"peak_bytes", e.peak_bytes},
                        {"phase", e.phase},
                        {"at", e.at},
                        {"saved_activations", e.saved_activations},
                        {"persistent_bytes", e.persistent_bytes},
                        {"by_phase",
                         {{"forward", e.forward_peak},
                          {"loss", e.loss_peak},
                          {"backward", e.backward_peak},
                          {"optimizer", e.optimizer_peak}}},
                        {"saved_by_op", savedByOp(e)},
                        {"at_peak",
                         {{"parameters", m.parameters},
                          {"buffers", m.buffers},
                          {"inputs", m.inputs},
                          {"optimizer_state", m.optimizer_state},
                          {"activations", m.activations},
                          {"gradients", m.gradients},
                          {"transient", m.transient}}}};
  }
  return mem;
}

std::string canonicalText(const json& j) {
  std::string out;
  writeCanonical(j, 0, out);
  out += "\n";
  return out;
}

std::string toJsonText(const Plan& p) {
  // The plan's one writer: the document's small fields as a tree laid out canonically
  // (writeCanonical), the nodes streamed (writeNode: a plan of 3,000 nodes is most of its bytes),
  // in the canonical layout too, so canonicalText(toJson(p)) gives these bytes again. The
  // top-level object is never on one line, and "nodes" (an array of objects) is one line only
  // when empty.
  // The graph's base64 (most of the file's bytes) is written directly, in its place among the
  // sorted keys, instead of copied into the tree and scanned for escapes: base64 needs none.
  const json doc = documentJson(p);
  std::string out;
  out.reserve(p.nodes.size() * 900 + p.graph_bytes.size() * 4 / 3 + 65536);
  out += "{\n";
  bool first = true;
  auto key = [&](const std::string& k) {
    if (!first) out += ",\n";
    first = false;
    out += "  ";
    appendString(k, out);
    out += ": ";
  };
  bool graph_done = p.graph_bytes.empty();
  auto graph = [&] {
    key("graph");
    out += '"';
    out += base64Encode(p.graph_bytes);
    out += '"';
    graph_done = true;
  };
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    if (!graph_done && it.key() > "graph") graph();
    key(it.key());
    if (it.key() != "nodes") {
      writeCanonical(it.value(), 2, out);
    } else if (p.nodes.empty()) {
      out += "[]";
    } else {
      out += "[\n";
      NumberTexts numbers;
      for (size_t i = 0; i < p.nodes.size(); ++i) {
        if (i) out += ",\n";
        out += "    ";
        writeNode(p.nodes[i], i, 4, out, numbers);
      }
      out += "\n  ]";
    }
  }
  if (!graph_done) graph();
  out += "\n}\n";
  return out;
}

Expected<Plan> planFromJson(const json& j) {
  using namespace reading;  // NOLINT
  APC_RETURN_IF_ERROR(checkObject(j, "$",
                                  {"apc_version", "content_hash", "format_version", "model",
                                   "nodes", "parameters", "solver", "spec", "totals"},
                                  {"checkpoint", "graph", "memory"}));
  Plan p;
  APC_ASSIGN_OR_RETURN(int64_t version, getInt(j["format_version"], "$.format_version"));
  if (version != kPlanFormatVersion)
    return at("$.format_version", "this apc reads plan format " +
                                      std::to_string(kPlanFormatVersion) + ", the file has " +
                                      std::to_string(version));
  p.format_version = static_cast<int>(version);
  APC_ASSIGN_OR_RETURN(p.apc_version, readString(j["apc_version"], "$.apc_version"));
  APC_ASSIGN_OR_RETURN(p.content_hash, readString(j["content_hash"], "$.content_hash"));
  APC_ASSIGN_OR_RETURN(p.model, readSource(j["model"], "$.model"));
  auto spec = spec::parseSpec(j["spec"]);
  if (!spec.ok()) {
    const std::string& m = spec.error().message();
    return Error(spec.error().code(),
                 m.rfind("$", 0) == 0 ? "$.spec" + m.substr(1) : "$.spec: " + m);
  }
  p.spec = std::move(spec).value();
  size_t ndim = p.spec.mesh.ndim();
  const json& nodes = j["nodes"];
  APC_RETURN_IF_ERROR(expectArray(nodes, "$.nodes"));
  for (size_t i = 0; i < nodes.size(); ++i) {
    APC_ASSIGN_OR_RETURN(PlanNode n, readNode(nodes[i], indexPath("$.nodes", i), i, ndim));
    p.nodes.push_back(std::move(n));
  }
  for (size_t i = 0; i < p.nodes.size(); ++i)
    for (size_t k = 0; k < p.nodes[i].in_edges.size(); ++k)
      if (p.nodes[i].in_edges[k].from >= p.nodes.size())
        return at(indexPath(indexPath("$.nodes", i) + ".in_edges", k) + ".from",
                  "no node " + std::to_string(p.nodes[i].in_edges[k].from) + " (the plan has " +
                      std::to_string(p.nodes.size()) + ")");
  const json& params = j["parameters"];
  APC_RETURN_IF_ERROR(expectArray(params, "$.parameters"));
  for (size_t i = 0; i < params.size(); ++i) {
    std::string path = indexPath("$.parameters", i);
    APC_ASSIGN_OR_RETURN(PlanParameter q, readParameter(params[i], path, ndim));
    if (q.node >= p.nodes.size() || p.nodes[q.node].kind != "parameter")
      return at(path + ".node", "node " + std::to_string(q.node) + " is not a parameter node");
    // A parameter is placed as its node's strategy places it (what lowering shards it by).
    const PlanNode& pn = p.nodes[q.node];
    if (q.name != pn.name)
      return at(path + ".name", "'" + q.name + "' is not the name of its node " +
                                    std::to_string(q.node) + " ('" + pn.name + "')");
    if (q.placement != pn.outputPlacements())
      return at(path + ".placement", "parameter '" + q.name + "' is placed " +
                                         mesh::toCompactString(q.placement) + " but its node " +
                                         std::to_string(q.node) + " places it " +
                                         mesh::toCompactString(pn.outputPlacements()));
    p.parameters.push_back(std::move(q));
  }
  APC_ASSIGN_OR_RETURN(p.totals, readTotals(j["totals"], "$.totals"));
  APC_ASSIGN_OR_RETURN(p.solver, readSolver(j["solver"], "$.solver"));
  if (j.contains("memory")) {
    APC_ASSIGN_OR_RETURN(p.memory, readMemory(j["memory"], "$.memory"));
  }
  if (j.contains("checkpoint")) {
    const json& c = j["checkpoint"];
    if (!c.is_array() || c.empty())
      return at("$.checkpoint", "expected a non-empty list of module paths, got " + describe(c));
    for (size_t i = 0; i < c.size(); ++i) {
      APC_ASSIGN_OR_RETURN(std::string m, readString(c[i], indexPath("$.checkpoint", i)));
      if (m.empty() || std::find(p.checkpoint.begin(), p.checkpoint.end(), m) != p.checkpoint.end())
        return at(indexPath("$.checkpoint", i), "expected a module path named once");
      p.checkpoint.push_back(std::move(m));
    }
  }
  if (j.contains("graph")) {
    APC_ASSIGN_OR_RETURN(std::string text, readString(j["graph"], "$.graph"));
    auto bytes = base64Decode(text);
    if (!bytes.ok()) return at("$.graph", bytes.error().message());
    p.graph_bytes = std::move(bytes).value();
    auto g = plannedGraph(p);
    if (!g.ok()) return at("$.graph", g.error().message());
  }
  // Last, once the content is known to be well formed: it must hash to content_hash, the same
  // computation makePlan made (planContentHash), so that an edited plan is not taken as written.
  if (std::string h = planContentHash(p); h != p.content_hash) {
    std::string why = "the plan was changed after apc plan wrote it";
    if (p.apc_version != apcVersion())
      why += ", or apc " + p.apc_version + " hashed plans otherwise (plan again with apc " +
             apcVersion() + ")";
    return at("$.content_hash", "the plan's content hashes to " + h + ", not to its content_hash " +
                                    p.content_hash + ": " + why);
  }
  return p;
}

Expected<Plan> readPlanFile(const std::string& path) {
  auto j = readJsonFile(path);
  if (!j.ok()) return j.error();
  auto p = planFromJson(*j);
  if (!p.ok()) return p.error().withContext(path);
  return p;
}

Status writePlanFile(const Plan& p, const std::string& path) {
  return writeFileAtomic(path, toJsonText(p));
}

}  // namespace apc::plan
