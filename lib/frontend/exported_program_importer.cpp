//===- lib/frontend/exported_program_importer.cpp - torch.export -> apc IR -===//
//
// See apc/frontend/exported_program.h for what is imported and how. The JSON is the serde form of
// torch._export.serde.schema.ExportedProgram: unions are objects with one member
// ({"as_tensor": {"name": "x"}}), sizes are SymInts ({"as_int": 8} or {"as_expr": {"expr_str",
// "hint"}}), and every value of the graph has a name that later arguments refer to. Nothing here
// runs an operator: LibTorch is used for the operator registry (to resolve schemas and fill in
// defaulted arguments) and for its enums.
//
//===----------------------------------------------------------------------===//
#include "apc/frontend/exported_program.h"
#include "apc/frontend/functionalize.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>

#include <torch/csrc/jit/runtime/operator.h>
#include <nlohmann/json.hpp>

#include "apc/support/activity.h"
#include "apc/support/clock.h"
#include "apc/support/file_io.h"
#include "apc/support/json_reader.h"
#include "apc/support/strings.h"
#include "pt2_archive.h"
#include "sym_expr.h"
#include "torch_types.h"

namespace apc::frontend {

namespace {

// The recorded tensor sizes come from the file: within kMaxTensorDim and kMaxTensorNumel.
constexpr int64_t kMaxRecordedDim = kMaxTensorDim;
constexpr int64_t kMaxRecordedNumel = kMaxTensorNumel;

using nlohmann::json;

/// The one member of a serde union object: ("as_tensor", value).
Expected<std::pair<std::string, const json*>> unionOf(const json& j, const std::string& what) {
  if (!j.is_object() || j.size() != 1) return parseError(what + " is not a serialized union");
  return std::make_pair(j.begin().key(), &j.begin().value());
}

std::string str(const json& j) {
  return j.is_string() ? j.get<std::string>() : std::string();
}

/// A float argument: JSON numbers, or the strings torch writes for non-finite values.
std::optional<double> floatOf(const json& j) {
  if (j.is_number()) return j.get<double>();
  std::string s = str(j);
  if (s == "Infinity" || s == "inf") return std::numeric_limits<double>::infinity();
  if (s == "-Infinity" || s == "-inf") return -std::numeric_limits<double>::infinity();
  if (s == "NaN" || s == "nan") return std::numeric_limits<double>::quiet_NaN();
  return std::nullopt;
}

// --- metadata ------------------------------------------------------------------------------------

/// Splits "key,path,type" at top-level commas (brackets may hold commas), like torch's
/// metadata_split.
std::vector<std::string> splitTopLevel(const std::string& s) {
  std::vector<std::string> out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '[' || c == '(') ++depth;
    if (c == ']' || c == ')') --depth;
    if (c == ',' && depth == 0) {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  out.push_back(s.substr(start));
  return out;
}

/// "L['self'].layers[0].attn" (strict export) -> "layers.0.attn"; plain paths are unchanged.
std::string normalizeModulePath(std::string p) {
  for (const char* prefix : {"L['self']", "L__self__"}) {
    if (p.rfind(prefix, 0) == 0) p = p.substr(std::string(prefix).size());
  }
  std::string out;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '[') {
      size_t close = p.find(']', i);
      if (close == std::string::npos) break;
      std::string inner = p.substr(i + 1, close - i - 1);
      if (inner.size() >= 2 && (inner.front() == '\'' || inner.front() == '"'))
        inner = inner.substr(1, inner.size() - 2);
      out += "." + inner;
      i = close;
    } else {
      out += c;
    }
  }
  for (const char* noise : {"._modules.", "._parameters."}) {
    for (size_t at = out.find(noise); at != std::string::npos; at = out.find(noise))
      out.replace(at, std::string(noise).size(), ".");
  }
  while (!out.empty() && out.front() == '.') out.erase(out.begin());
  return out;
}

/// The path of the innermost module of a node's nn_module_stack ("layers.0.attention.wq").
std::string modulePathOf(const json& metadata) {
  std::string stack = str(member(metadata, "nn_module_stack"));
  if (stack.empty()) return "";
  std::vector<std::string> entries = split(stack, ';');
  if (entries.empty()) return "";
  std::vector<std::string> parts = splitTopLevel(entries.back());
  if (parts.size() != 3) return "";
  const std::string& path = parts[1];
  if (path.rfind("_empty_nn_module_stack", 0) == 0) return "";
  return normalizeModulePath(path);
}

/// "model.py:42": the innermost frame of the stack trace outside torch's own package, else the
/// innermost frame.
std::string sourceOf(const json& metadata) {
  std::string trace = str(member(metadata, "stack_trace"));
  std::string innermost, user;
  for (size_t at = trace.find("File \""); at != std::string::npos;
       at = trace.find("File \"", at + 1)) {
    size_t name_end = trace.find('"', at + 6);
    if (name_end == std::string::npos) break;
    std::string file = trace.substr(at + 6, name_end - at - 6);
    size_t line_at = trace.find(", line ", name_end);
    if (line_at != name_end + 1) continue;
    size_t digits = line_at + 7, end = digits;
    while (end < trace.size() && std::isdigit(static_cast<unsigned char>(trace[end]))) ++end;
    if (end == digits) continue;
    std::string loc =
        std::filesystem::path(file).filename().string() + ":" + trace.substr(digits, end - digits);
    innermost = loc;
    bool in_torch = file.find("/site-packages/torch/") != std::string::npos ||
                    file.find("/dist-packages/torch/") != std::string::npos ||
                    file.rfind("torch/", 0) == 0;
    if (!in_torch) user = loc;
  }
  return user.empty() ? innermost : user;
}

// --- symbols -------------------------------------------------------------------------------------

/// Parsed size expressions (cached by text) and the values of their symbols.
class Symbols {
 public:
  Expected<const SymExpr*> parse(const std::string& text) {
    auto it = cache_.find(text);
    if (it != cache_.end()) return it->second.get();
    APC_ASSIGN_OR_RETURN(SymExpr e, parseSymExpr(text));
    auto owned = std::make_unique<SymExpr>(std::move(e));
    const SymExpr* p = owned.get();
    cache_.emplace(text, std::move(owned));
    return p;
  }

  /// Records the hint of a serialized SymInt that is a bare symbol.
  Status learn(const json& symint) {
    const json& e = member(symint, "as_expr");
    if (e.is_null()) return Status::success();
    APC_ASSIGN_OR_RETURN(const SymExpr* x, parse(str(member(e, "expr_str"))));
    const json& hint = member(member(e, "hint"), "as_int");
    if (x->kind == SymExpr::Kind::kSymbol && hint.is_number_integer())
      values.emplace(x->symbol, hint.get<int64_t>());
    return Status::success();
  }

  /// The value of a serialized SymInt at the current symbol values.
  Expected<int64_t> value(const json& symint) {
    const json& i = member(symint, "as_int");
    if (i.is_number_integer()) return i.get<int64_t>();
    const json& e = member(symint, "as_expr");
    if (e.is_null()) return parseError("a size is neither as_int nor as_expr");
    std::string text = str(member(e, "expr_str"));
    APC_ASSIGN_OR_RETURN(const SymExpr* x, parse(text));
    auto v = evaluateSymExpr(*x, values);
    if (!v.ok()) {
      for (const std::string& s : freeSymbols(*x))
        if (!values.count(s))
          return unsupported("size " + toString(*x) + " is data-dependent (" + s +
                             " has no value at export time); apc needs sizes that follow from "
                             "the input shapes");
      return v.error();
    }
    return *v;
  }

  /// An IR dim: static, or the first free symbol (as renamed) with the value as hint.
  Expected<ir::Dim> dim(const json& symint) {
    APC_ASSIGN_OR_RETURN(int64_t v, value(symint));
    const json& e = member(symint, "as_expr");
    if (e.is_null()) return ir::Dim::fixed(v);
    APC_ASSIGN_OR_RETURN(const SymExpr* x, parse(str(member(e, "expr_str"))));
    std::vector<std::string> free = freeSymbols(*x);
    if (free.empty()) return ir::Dim::fixed(v);
    auto rank = [&](const std::string& s) {
      auto it = order.find(s);
      return it == order.end() ? order.size() : it->second;
    };
    std::stable_sort(free.begin(), free.end(),
                     [&](const std::string& a, const std::string& b) { return rank(a) < rank(b); });
    return ir::Dim::symbolic(nameOf(free.front()), v, perSymbol(*x));
  }

  /// ir::Dim::per_symbol of an expression: 1 for a bare symbol, k for Mul(Integer(k), Symbol) in
  /// either order, else 0 (B+1, B//2, B*T: lowering then cannot recompute the size at run time).
  static int64_t perSymbol(const SymExpr& x) {
    using K = SymExpr::Kind;
    if (x.kind == K::kSymbol) return 1;
    if (x.kind != K::kMul || x.args.size() != 2) return 0;
    for (size_t i = 0; i < 2; ++i) {
      const SymExpr& k = x.args[i];
      const SymExpr& s = x.args[1 - i];
      if (k.kind == K::kInteger && k.num > 0 && s.kind == K::kSymbol) return k.num;
    }
    return 0;
  }

  std::string nameOf(const std::string& s) const {
    auto it = names.find(s);
    return it == names.end() ? s : it->second;
  }

  std::map<std::string, int64_t> values;     // export symbol -> value (hint or override)
  std::map<std::string, std::string> names;  // export symbol -> apc symbol (overrides)
  std::map<std::string, size_t> order;       // symbol -> first appearance in the inputs
  std::map<std::string, std::pair<std::optional<int64_t>, std::optional<int64_t>>> ranges;

 private:
  std::unordered_map<std::string, std::unique_ptr<SymExpr>> cache_;
};

// --- operators -----------------------------------------------------------------------------------

struct OpRef {
  std::string op;           // "aten::linear"
  std::string overload;     // "" for default
  bool positional = false;  // arguments by position (Python operators), not by schema name
  std::string alias_of;     // the custom op imported as `op` ("" for none)
  std::map<std::string, std::string> renamed;  // the custom op's argument names -> `op`'s
};

/// Python-level SymInt operators export records, and the JIT operators that compute them.
const std::map<std::string, OpRef>& pythonOps() {
  static const std::map<std::string, OpRef> m = {
      {"_operator.add", {"aten::add", "int", true, "", {}}},
      {"_operator.sub", {"aten::sub", "int", true, "", {}}},
      {"_operator.mul", {"aten::mul", "int", true, "", {}}},
      {"_operator.floordiv", {"aten::floordiv", "int", true, "", {}}},
      {"_operator.mod", {"aten::remainder", "int", true, "", {}}},
      {"_operator.neg", {"aten::neg", "int", true, "", {}}},
      {"torch.sym_max", {"prim::max", "int", true, "", {}}},
      {"torch.sym_min", {"prim::min", "int", true, "", {}}},
  };
  return m;
}

/// Custom ops of other libraries whose semantics are fixed, documented and those of an ATen op:
/// imported as that op (its arguments renamed), checked by checkAlias. Hugging Face transformers'
/// grouped_mm_fallback (transformers/integrations/moe.py, what its default "grouped_mm" experts
/// export where torch._grouped_mm cannot be traced, e.g. f32 weights) is documented as
/// _grouped_mm(input [S, K], weight [E, K, N], offs [E]): rows offs[e-1]..offs[e] of input times
/// weight[e]. The two differ only in rows past offs[-1] (zero there, unspecified in _grouped_mm),
/// which transformers' forward never has (without its own expert parallelism, offs[-1] = S).
const std::map<std::string, OpRef>& aliasedCustomOps() {
  static const std::map<std::string, OpRef> m = {
      {"transformers::grouped_mm_fallback",
       {"aten::_grouped_mm",
        "",
        false,
        "transformers::grouped_mm_fallback",
        {{"input", "self"}, {"weight", "mat2"}, {"offs", "offs"}}}},
  };
  return m;
}

/// Runtime assertions of exported programs: checks with no outputs, left out of the graph.
bool isAssertion(const std::string& op) {
  static const std::set<std::string> s = {"aten::_assert_tensor_metadata",
                                          "aten::_assert_scalar",
                                          "aten::_assert_async",
                                          "aten::sym_constrain_range",
                                          "aten::sym_constrain_range_for_size",
                                          "aten::_functional_assert_async",
                                          "aten::_functional_sym_constrain_range",
                                          "aten::_functional_sym_constrain_range_for_size"};
  return s.count(op) > 0;
}

/// Higher-order ops with their own subgraphs that decide control flow.
bool isControlFlow(const std::string& name) {
  static const std::set<std::string> s = {"cond", "while_loop", "map_impl",
                                          "map",  "scan",       "associative_scan"};
  return s.count(name) > 0;
}

/// Type and value of a schema default (or other IValue) as an apc constant.
std::optional<std::pair<ir::ValueType, ir::Constant>> constantOf(const c10::IValue& iv) {
  using VT = ir::ValueType;
  if (iv.isNone()) return std::make_pair(VT::kNone, ir::Constant(ir::None{}));
  if (iv.isInt()) return std::make_pair(VT::kInt, ir::Constant(iv.toInt()));
  if (iv.isDouble()) return std::make_pair(VT::kFloat, ir::Constant(iv.toDouble()));
  if (iv.isBool()) return std::make_pair(VT::kBool, ir::Constant(iv.toBool()));
  if (iv.isString()) return std::make_pair(VT::kString, ir::Constant(iv.toStringRef()));
  if (iv.isDevice()) return std::make_pair(VT::kDevice, ir::Constant(iv.toDevice().str()));
  if (iv.isIntList()) return std::make_pair(VT::kIntList, ir::Constant(iv.toIntVector()));
  if (iv.isDoubleList()) return std::make_pair(VT::kFloatList, ir::Constant(iv.toDoubleVector()));
  if (iv.isBoolList()) {
    std::vector<bool> b;
    for (bool x : iv.toBoolList()) b.push_back(x);
    return std::make_pair(VT::kBoolList, ir::Constant(b));
  }
  if (iv.isList() && iv.toListRef().empty())
    return std::make_pair(VT::kIntList, ir::Constant(std::vector<int64_t>{}));
  return std::nullopt;
}

// --- the importer --------------------------------------------------------------------------------

struct UserInput {
  std::string name;         // forward argument name
  std::string placeholder;  // the graph's name for it
};

class ExportedImporter {
 public:
  ExportedImporter(const json& program, const json& weights, const json& constants,
                   std::string path)
      : program_(program), weights_(weights), constants_(constants), path_(std::move(path)) {}

  /// Checks the version and reads the symbols and user inputs.
  Status prepare() {
    const json& version = member(program_, "schema_version");
    const json& major = member(version, "major");
    if (!major.is_number_integer())
      return parseError("'" + path_ + "': models/model.json has no schema_version");
    if (major.get<int64_t>() != kExportSchemaMajor) {
      const json& minor = member(version, "minor");
      return unsupported("'" + path_ + "' uses torch.export schema version " +
                         std::to_string(major.get<int64_t>()) + "." +
                         (minor.is_number_integer() ? std::to_string(minor.get<int64_t>()) : "?") +
                         "; apc reads schema version " + std::to_string(kExportSchemaMajor) +
                         ".x (torch 2.13 writes 8.20)");
    }
    const json& gm = member(program_, "graph_module");
    graph_ = &member(gm, "graph");
    signature_ = &member(gm, "signature");
    if (!graph_->is_object() || !signature_->is_object())
      return parseError("'" + path_ + "': models/model.json has no graph_module.graph/signature");
    tensor_values_ = &member(*graph_, "tensor_values");
    sym_int_values_ = &member(*graph_, "sym_int_values");
    if (tensor_values_->is_object())
      for (const auto& [name, meta] : tensor_values_->items())
        for (const json& s : member(meta, "sizes")) APC_RETURN_IF_ERROR(symbols_.learn(s));
    if (sym_int_values_->is_object())
      for (const auto& [name, s] : sym_int_values_->items()) APC_RETURN_IF_ERROR(symbols_.learn(s));
    for (const auto& [sym, r] : member(program_, "range_constraints").items()) {
      auto bound = [](const json& b) -> std::optional<int64_t> {
        if (b.is_number_integer()) return b.get<int64_t>();
        return std::nullopt;
      };
      symbols_.ranges[sym] = {bound(member(r, "min_val")), bound(member(r, "max_val"))};
    }

    for (const json& spec : member(*signature_, "input_specs")) {
      const json& user = member(spec, "user_input");
      if (user.is_null()) continue;
      APC_ASSIGN_OR_RETURN(auto u, unionOf(member(user, "arg"), "a user input"));
      if (u.first != "as_tensor")
        return unsupported("'" + path_ + "': user input " + std::to_string(inputs_.size()) +
                           " is " + u.first.substr(3) + ", not a tensor; apc imports tensor " +
                           "inputs only");
      inputs_.push_back({"", str(member(*u.second, "name"))});
    }
    std::vector<std::string> names;
    for (const json& entry : member(gm, "module_call_graph"))
      if (str(member(entry, "fqn")).empty()) {
        const json& f = member(member(entry, "signature"), "forward_arg_names");
        if (f.is_array())
          for (const json& n : f) names.push_back(str(n));
        out_spec_ = str(member(member(entry, "signature"), "out_spec"));
      }
    for (size_t i = 0; i < inputs_.size(); ++i)
      inputs_[i].name =
          names.size() == inputs_.size() && !names[i].empty() ? names[i] : inputs_[i].placeholder;
    // A dim over several symbols is named by the one that comes first in the inputs' shapes, as
    // the TorchScript importer names it (its symbols are marked in input order).
    for (const UserInput& u : inputs_)
      for (const json& size : member(member(*tensor_values_, u.placeholder), "sizes")) {
        const json& e = member(size, "as_expr");
        if (e.is_null()) continue;
        APC_ASSIGN_OR_RETURN(const SymExpr* x, symbols_.parse(str(member(e, "expr_str"))));
        for (const std::string& sym : freeSymbols(*x))
          symbols_.order.emplace(sym, symbols_.order.size());
      }
    return checkSignature();
  }

  // --- torch.export's own invariants ----------------------------------------------------------
  // What torch's deserializer and verifier (torch/_export/serde/serialize.py,
  // torch/_export/verifier.py) refuse is refused here too, each with one line: a name defined
  // twice ("has already been deserialized"), a signature whose inputs or outputs are not the
  // graph's, a parameter, buffer or constant named twice or tied to a tensor of another shape or
  // dtype than the state dict's. A value read before its definition is lookup's error.

  /// Records that `what` defines `name`; an error when the name is already defined.
  Status define(const std::string& name, const std::string& what) {
    auto [it, fresh] = defined_by_.try_emplace(name, what);
    if (fresh) return Status::success();
    return parseError("'" + path_ + "': " + what + " defines %" + printable(name) + ", which " +
                      it->second +
                      " already defines (torch.export refuses such a program: it has already "
                      "been deserialized)");
  }

  /// The placeholder an input spec names ("" for kinds without one).
  static std::string placeholderOf(const std::string& kind, const json& body) {
    if (kind == "user_input") return str(member(member(member(body, "arg"), "as_tensor"), "name"));
    if (kind == "constant_input") return str(member(body, "name"));
    return str(member(member(body, "arg"), "name"));
  }

  /// The as_int sizes of a serialized tensor meta; nullopt when one is symbolic or malformed.
  static std::optional<std::vector<int64_t>> staticSizes(const json& sizes) {
    if (!sizes.is_array()) return std::nullopt;
    std::vector<int64_t> out;
    for (const json& s : sizes) {
      const json& i = member(s, "as_int");
      if (!i.is_number_integer()) return std::nullopt;
      out.push_back(i.get<int64_t>());
    }
    return out;
  }

  /// The state dict's tensor meta of a parameter, buffer or constant tied to `placeholder`
  /// (where the archive records it) has the placeholder's sizes and dtype.
  Status checkStateShape(const std::string& kind, const std::string& fqn,
                         const std::string& placeholder) {
    const json& config = kind == "tensor_constant" ? constants_ : weights_;
    const json& entry = member(member(config, "config"), fqn);
    if (!entry.is_object()) return Status::success();
    const json& state = member(entry, "tensor_meta");
    const json& graph = member(*tensor_values_, placeholder);
    if (!graph.is_object())
      return parseError("'" + path_ + "': the signature's " + kind + " '" + printable(fqn) +
                        "' is %" + printable(placeholder) + ", which has no tensor_values");
    auto have = staticSizes(member(graph, "sizes")), want = staticSizes(member(state, "sizes"));
    auto text = [](const std::vector<int64_t>& v) {
      return "[" + joinMap(v, ", ", [](int64_t x) { return std::to_string(x); }) + "]";
    };
    if (have && want && *have != *want)
      return parseError("'" + path_ + "': the signature ties " + kind + " '" + printable(fqn) +
                        "' to %" + printable(placeholder) + " of shape " + text(*have) +
                        ", but the state dict's '" + printable(fqn) + "' has shape " + text(*want));
    const json& a = member(graph, "dtype");
    const json& b = member(state, "dtype");
    if (a.is_number_integer() && b.is_number_integer() && a != b) {
      auto name = [](const json& d) {
        auto st = scalarTypeFromSerde(d.get<int64_t>());
        return st ? std::string(ir::dtypeName(dtypeOf(*st))) : "dtype " + d.dump();
      };
      return parseError("'" + path_ + "': the signature ties " + kind + " '" + printable(fqn) +
                        "' to %" + printable(placeholder) + " of dtype " + name(a) +
                        ", but the state dict's '" + printable(fqn) + "' is " + name(b));
    }
    return Status::success();
  }

  Status checkSignature() {
    const json& specs = member(*signature_, "input_specs");
    const json& graph_inputs = member(*graph_, "inputs");
    if (specs.is_array() && graph_inputs.is_array() && specs.size() != graph_inputs.size())
      return parseError("'" + path_ + "': the graph has " + std::to_string(graph_inputs.size()) +
                        " inputs but its signature " + std::to_string(specs.size()) +
                        " input specs");
    std::map<std::string, size_t> state_names;  // fqn -> the input spec naming it
    size_t i = 0;
    for (const json& spec : specs) {
      const std::string what = "the signature's input " + std::to_string(i);
      APC_ASSIGN_OR_RETURN(auto u, unionOf(spec, "an input spec"));
      const auto& [kind, body] = u;
      std::string placeholder = placeholderOf(kind, *body);
      if (!placeholder.empty()) {
        APC_RETURN_IF_ERROR(define(placeholder, what));
        const json& g = graph_inputs.is_array() ? graph_inputs[i] : json();
        std::string graph_name = str(member(member(g, "as_tensor"), "name"));
        if (!graph_name.empty() && kind != "constant_input" && graph_name != placeholder)
          return parseError("'" + path_ + "': " + what + " is %" + printable(placeholder) +
                            " but the graph's input " + std::to_string(i) + " is %" +
                            printable(graph_name));
      }
      std::string fqn;
      if (kind == "parameter") fqn = str(member(*body, "parameter_name"));
      if (kind == "buffer") fqn = str(member(*body, "buffer_name"));
      if (kind == "tensor_constant") fqn = str(member(*body, "tensor_constant_name"));
      if (!fqn.empty()) {
        auto [prev, fresh] = state_names.try_emplace(kind + " " + fqn, i);
        if (!fresh)
          return parseError("'" + path_ + "': the signature names " + kind + " '" + printable(fqn) +
                            "' twice (inputs " + std::to_string(prev->second) + " and " +
                            std::to_string(i) + ")");
        APC_RETURN_IF_ERROR(checkStateShape(kind, fqn, placeholder));
      }
      ++i;
    }
    const json& outs = member(*signature_, "output_specs");
    const json& graph_outputs = member(*graph_, "outputs");
    if (outs.is_array() && graph_outputs.is_array()) {
      if (outs.size() != graph_outputs.size())
        return parseError("'" + path_ + "': the graph has " + std::to_string(graph_outputs.size()) +
                          " outputs but its signature " + std::to_string(outs.size()) +
                          " output specs");
      for (size_t k = 0; k < outs.size(); ++k) {
        if (!outs[k].is_object() || outs[k].size() != 1) continue;  // addOutputs' error
        const json& arg = member(outs[k].begin().value(), "arg");
        std::string spec_name = str(member(arg, "name"));
        if (spec_name.empty()) spec_name = str(member(member(arg, "as_tensor"), "name"));
        std::string graph_name = str(member(member(graph_outputs[k], "as_tensor"), "name"));
        if (!spec_name.empty() && !graph_name.empty() && spec_name != graph_name)
          return parseError("'" + path_ + "': the signature's output " + std::to_string(k) +
                            " is %" + printable(spec_name) + " but the graph's output " +
                            std::to_string(k) + " is %" + printable(graph_name));
      }
    }
    return Status::success();
  }

  Expected<std::vector<InputSpec>> recordedInputs() {
    std::vector<InputSpec> out;
    for (const UserInput& u : inputs_) {
      APC_ASSIGN_OR_RETURN(ir::TensorMeta m, metaOf(u.placeholder));
      out.push_back(InputSpec{u.name, m.dtype, m.shape});
    }
    return out;
  }

  /// Applies --input overrides: symbol values (and names) may change, static dims may not.
  Status applyOverrides(const std::vector<InputSpec>& overrides) {
    std::string all = joinMap(inputs_, ", ", [](const UserInput& u) { return u.name; });
    std::map<std::string, std::string> valued_by;  // symbol -> the override that set it
    for (const InputSpec& o : overrides) {
      size_t i = 0;
      while (i < inputs_.size() && inputs_[i].name != o.name) ++i;
      if (i == inputs_.size())
        return invalidArgument("unknown input '" + o.name +
                               "'; the model's inputs are: " + (all.empty() ? "(none)" : all));
      const json& meta = member(*tensor_values_, inputs_[i].placeholder);
      const json& sizes = member(meta, "sizes");
      APC_ASSIGN_OR_RETURN(ir::TensorMeta recorded, metaOf(inputs_[i].placeholder));
      InputSpec shown{o.name, recorded.dtype, recorded.shape};
      if (o.shape.size() != sizes.size())
        return invalidArgument("input '" + o.name + "' has rank " + std::to_string(sizes.size()) +
                               " in the model (" + toString(shown) + ") but rank " +
                               std::to_string(o.shape.size()) + " was given");
      if (o.dtype != recorded.dtype)
        return invalidArgument("input '" + o.name + "' has dtype " + ir::dtypeName(recorded.dtype) +
                               " in the model but " + ir::dtypeName(o.dtype) + " was given");
      for (size_t d = 0; d < sizes.size(); ++d) {
        const ir::Dim& want = o.shape[d];
        std::string where = "input '" + o.name + "' dim " + std::to_string(d);
        const json& e = member(sizes[d], "as_expr");
        if (e.is_null()) {
          int64_t fixed = member(sizes[d], "as_int").get<int64_t>();
          if (want.size != fixed || want.isSymbolic())
            return invalidArgument(where + " is static (" + std::to_string(fixed) +
                                   ") in the exported program; it cannot be given as " +
                                   ir::toString(want) + " (export it with a dynamic dim)");
          continue;
        }
        APC_ASSIGN_OR_RETURN(const SymExpr* x, symbols_.parse(str(member(e, "expr_str"))));
        if (x->kind != SymExpr::Kind::kSymbol) {
          deferred_.push_back({where, sizes[d], want.size});
          continue;
        }
        const std::string& sym = x->symbol;
        auto prev = valued_by.find(sym);
        if (prev != valued_by.end() && symbols_.values[sym] != want.size)
          return invalidArgument(where + " is symbol " + symbols_.nameOf(sym) + ", which " +
                                 prev->second + " already sets to " +
                                 std::to_string(symbols_.values[sym]));
        symbols_.values[sym] = want.size;
        valued_by[sym] = where;
        if (want.isSymbolic()) {
          auto named = symbols_.names.find(sym);
          if (named != symbols_.names.end() && named->second != want.symbol)
            return invalidArgument(where + " names symbol " + sym + " '" + want.symbol +
                                   "', but it is already named '" + named->second + "'");
          symbols_.names[sym] = want.symbol;
        }
      }
    }
    std::set<std::string> seen;
    for (const auto& [sym, name] : symbols_.names) {
      bool taken = name != sym && symbols_.values.count(name) && !symbols_.names.count(name);
      if (!seen.insert(name).second || taken)
        return invalidArgument("symbol name '" + name + "' is given to two different exported " +
                               "dims; use one name per dynamic dim");
    }
    for (const auto& [sym, where] : valued_by) {
      auto r = symbols_.ranges.find(sym);
      if (r == symbols_.ranges.end()) continue;
      int64_t v = symbols_.values[sym];
      auto [lo, hi] = r->second;
      if ((lo && v < *lo) || (hi && v > *hi))
        return invalidArgument(where + ": " + std::to_string(v) + " is outside the range [" +
                               (lo ? std::to_string(*lo) : "-inf") + ", " +
                               (hi ? std::to_string(*hi) : "inf") +
                               "] the program was exported for");
    }
    for (const Deferred& d : deferred_) {
      APC_ASSIGN_OR_RETURN(int64_t v, symbols_.value(d.size));
      APC_ASSIGN_OR_RETURN(const SymExpr* x,
                           symbols_.parse(str(member(member(d.size, "as_expr"), "expr_str"))));
      if (v != d.want)
        return invalidArgument(d.where + " is " + toString(*x) + " in the exported program (" +
                               std::to_string(v) + " at these sizes), not " +
                               std::to_string(d.want));
    }
    return Status::success();
  }

  Expected<ir::Graph> build(ImportNotes* notes) {
    notes_ = notes;
    countUses();
    APC_RETURN_IF_ERROR(addPlaceholders());
    for (const json& n : member(*graph_, "nodes")) {
      APC_RETURN_IF_ERROR(addOpNode(n));
      ++node_index_;
    }
    APC_RETURN_IF_ERROR(addOutputs());
    APC_RETURN_IF_ERROR(out_.verify());
    return std::move(out_);
  }

 private:
  struct Deferred {
    std::string where;
    json size;
    int64_t want = 0;
  };

  // --- values --------------------------------------------------------------------------------

  Expected<ir::TensorMeta> metaOf(const std::string& name) {
    const json& meta = member(*tensor_values_, name);
    if (!meta.is_object()) return parseError("tensor %" + name + " has no recorded tensor_values");
    ir::TensorMeta m;
    const json& dt = member(meta, "dtype");
    auto st = dt.is_number_integer() ? scalarTypeFromSerde(dt.get<int64_t>()) : std::nullopt;
    m.dtype = st ? dtypeOf(*st) : ir::DType::kUnknown;
    int64_t numel = 1;
    for (const json& s : member(meta, "sizes")) {
      auto d = symbols_.dim(s);
      if (!d.ok()) return d.error().withContext("tensor %" + name);
      if (d->size < 0 || d->size > kMaxRecordedDim)
        return parseError("tensor %" + printable(name) + " has a size " + std::to_string(d->size) +
                          " outside [0, 2^40]");
      if (__builtin_mul_overflow(numel, d->size, &numel) || numel > kMaxRecordedNumel)
        return parseError("tensor %" + printable(name) + " has more than 2^56 elements");
      m.shape.push_back(*d);
    }
    return m;
  }

  /// Names of tensors some node or output reads (placeholders without readers are skipped).
  void countUses() {
    std::function<void(const json&)> visit = [&](const json& j) {
      if (j.is_array()) {
        for (const json& v : j) visit(v);
        return;
      }
      if (!j.is_object()) return;
      for (const auto& [k, v] : j.items()) {
        if (k == "as_tensor") {
          used_.insert(str(member(v, "name")));
        } else if (k == "as_tensors") {
          for (const json& t : v) used_.insert(str(member(t, "name")));
        } else {
          visit(v);
        }
      }
    };
    for (const json& n : member(*graph_, "nodes")) visit(member(n, "inputs"));
    visit(member(*graph_, "outputs"));
  }

  ir::ValueId addLeaf(ir::NodeKind kind, const std::string& name, ir::TensorMeta meta) {
    ir::Value v;
    v.type = ir::ValueType::kTensor;
    v.debug_name = name;
    v.tensor = std::move(meta);
    ir::ValueId id = out_.addValue(std::move(v));
    ir::Node n;
    n.kind = kind;
    n.op = ir::nodeKindName(kind);
    n.name = name;
    n.outputs = {id};
    if (kind != ir::NodeKind::kInput) {
      auto dot = name.rfind('.');
      n.module_path = dot == std::string::npos ? "" : name.substr(0, dot);
    }
    out_.addNode(std::move(n));
    return id;
  }

  Status addPlaceholders() {
    for (const UserInput& u : inputs_) {
      APC_ASSIGN_OR_RETURN(ir::TensorMeta m, metaOf(u.placeholder));
      m.requires_grad = false;
      values_[u.placeholder] = addLeaf(ir::NodeKind::kInput, u.name, m);
    }
    std::set<std::string> mutated;
    for (const json& spec : member(*signature_, "output_specs")) {
      const json& b = member(spec, "buffer_mutation");
      if (!b.is_null()) mutated.insert(str(member(b, "buffer_name")));
    }
    std::vector<std::pair<ir::NodeKind, const json*>> later;  // buffers after all parameters
    for (const json& spec : member(*signature_, "input_specs")) {
      APC_ASSIGN_OR_RETURN(auto u, unionOf(spec, "an input spec"));
      const auto& [kind, body] = u;
      if (kind == "user_input") continue;
      if (kind == "parameter") {
        std::string placeholder = str(member(member(*body, "arg"), "name"));
        std::string fqn = str(member(*body, "parameter_name"));
        // Tied parameters are lifted under each name and saved once: one node, the first name.
        std::string identity = payloadIdentity(member(member(weights_, "config"), fqn));
        auto tied = identity.empty() ? parameter_nodes_.end() : parameter_nodes_.find(identity);
        if (tied != parameter_nodes_.end()) {
          values_[placeholder] = tied->second;
          continue;
        }
        APC_ASSIGN_OR_RETURN(ir::TensorMeta m, metaOf(placeholder));
        m.requires_grad = member(member(*tensor_values_, placeholder), "requires_grad") == true;
        values_[placeholder] = addLeaf(ir::NodeKind::kParameter, fqn, m);
        if (!identity.empty()) parameter_nodes_[identity] = values_[placeholder];
      } else if (kind == "buffer" || kind == "tensor_constant") {
        later.emplace_back(ir::NodeKind::kBuffer, &spec);
      } else if (kind == "constant_input") {
        std::string name = str(member(*body, "name"));
        APC_ASSIGN_OR_RETURN(auto c, unionOf(member(*body, "value"), "a constant input"));
        APC_ASSIGN_OR_RETURN(ir::ValueId id, literal(c.first, *c.second, name));
        values_[name] = id;
      } else {
        return unsupported("'" + path_ + "': an input of kind " + kind +
                           " (custom objects, effect tokens) is not supported");
      }
    }
    for (const auto& [kind, spec] : later) {
      const json& b = member(*spec, "buffer");
      bool is_buffer = !b.is_null();
      const json& body = is_buffer ? b : member(*spec, "tensor_constant");
      std::string placeholder = str(member(member(body, "arg"), "name"));
      std::string fqn = str(member(body, is_buffer ? "buffer_name" : "tensor_constant_name"));
      if (!used_.count(placeholder) && !mutated.count(fqn)) continue;  // as TorchScript: read ones
      APC_ASSIGN_OR_RETURN(ir::TensorMeta m, metaOf(placeholder));
      m.requires_grad = false;
      values_[placeholder] = addLeaf(kind, fqn, m);
    }
    return Status::success();
  }

  Expected<ir::ValueId> lookup(const std::string& name) {
    auto it = values_.find(name);
    if (it == values_.end()) return parseError("value %" + name + " is used before it is defined");
    return it->second;
  }

  /// A constant argument ("as_int", 3) as a graph-level constant value.
  Expected<ir::ValueId> literal(const std::string& kind, const json& v, const std::string& name) {
    using VT = ir::ValueType;
    auto bad = [&]() { return parseError("malformed " + kind + " argument " + v.dump()); };
    if (kind == "as_none") return out_.addConstant(VT::kNone, ir::None{}, name);
    if (kind == "as_int") {
      if (!v.is_number_integer()) return bad();
      return out_.addConstant(VT::kInt, v.get<int64_t>(), name);
    }
    if (kind == "as_float") {
      auto f = floatOf(v);
      if (!f) return bad();
      return out_.addConstant(VT::kFloat, *f, name);
    }
    if (kind == "as_bool") {
      if (!v.is_boolean()) return bad();
      return out_.addConstant(VT::kBool, v.get<bool>(), name);
    }
    if (kind == "as_string") {
      if (!v.is_string()) return bad();
      return out_.addConstant(VT::kString, v.get<std::string>(), name);
    }
    if (kind == "as_ints") {
      std::vector<int64_t> l;
      for (const json& x : v) {
        if (!x.is_number_integer()) return bad();
        l.push_back(x.get<int64_t>());
      }
      return out_.addConstant(VT::kIntList, l, name);
    }
    if (kind == "as_floats") {
      std::vector<double> l;
      for (const json& x : v) {
        auto f = floatOf(x);
        if (!f) return bad();
        l.push_back(*f);
      }
      return out_.addConstant(VT::kFloatList, l, name);
    }
    if (kind == "as_bools") {
      std::vector<bool> l;
      for (const json& x : v) {
        if (!x.is_boolean()) return bad();
        l.push_back(x.get<bool>());
      }
      return out_.addConstant(VT::kBoolList, l, name);
    }
    if (kind == "as_scalar_type") {
      auto st = v.is_number_integer() ? scalarTypeFromSerde(v.get<int64_t>()) : std::nullopt;
      if (!st) return bad();
      return out_.addConstant(VT::kInt, static_cast<int64_t>(*st), name);
    }
    if (kind == "as_layout") {
      auto l = v.is_number_integer() ? layoutFromSerde(v.get<int64_t>()) : std::nullopt;
      if (!l) return bad();
      return out_.addConstant(VT::kInt, static_cast<int64_t>(*l), name);
    }
    if (kind == "as_memory_format") {
      auto f = v.is_number_integer() ? memoryFormatFromSerde(v.get<int64_t>()) : std::nullopt;
      if (!f) return bad();
      return out_.addConstant(VT::kInt, static_cast<int64_t>(*f), name);
    }
    if (kind == "as_device") {
      std::string d = str(member(v, "type"));
      if (d.empty()) return bad();
      const json& index = member(v, "index");
      if (index.is_number_integer()) d += ":" + std::to_string(index.get<int64_t>());
      return out_.addConstant(VT::kDevice, d, name);
    }
    return unsupported("an argument of kind " + kind + " is not supported");
  }

  /// A SymInt-like reference ({"as_name": n} or {"as_int": k}).
  Expected<ir::ValueId> symRef(const json& v, const char* literal_kind) {
    const json& name = member(v, "as_name");
    if (name.is_string()) return lookup(name.get<std::string>());
    APC_ASSIGN_OR_RETURN(auto u, unionOf(v, "a symbolic argument"));
    return literal(literal_kind, *u.second, "");
  }

  // --- nodes ---------------------------------------------------------------------------------

  struct NodeCtx {
    std::string name;    // the node's name in the program
    std::string target;  // torch.ops.aten.linear.default
    std::string module_path;
    std::string source;
    std::string where() const { return " at node " + name; }
  };

  /// "node 3 (torch.ops.aten.add.Tensor)": the node being read, by position and target.
  std::string nodeLabel(const NodeCtx& ctx) const {
    return "node " + std::to_string(node_index_) + " (" + printable(ctx.target) + ")";
  }

  ir::Node opNode(const NodeCtx& ctx, std::string op) {
    ir::Node n;
    n.op = std::move(op);
    n.module_path = ctx.module_path;
    n.source = ctx.source;
    return n;
  }

  bool requiresGrad(const std::vector<ir::ValueId>& ids) const {
    for (ir::ValueId id : ids) {
      const ir::Value& v = out_.value(id);
      if (v.tensor && v.tensor->requires_grad) return true;
      for (const ir::TensorMeta& e : v.elements)
        if (e.requires_grad) return true;
    }
    return false;
  }

  /// A list argument built from values: a prim::ListConstruct node, as TorchScript has.
  ir::ValueId listConstruct(const NodeCtx& ctx, std::vector<ir::ValueId> items,
                            ir::ValueType type) {
    ir::Value v;
    v.type = type;
    v.debug_name = ctx.name + "_list";
    if (type == ir::ValueType::kTensorList) {
      for (ir::ValueId id : items) v.elements.push_back(*out_.value(id).tensor);
    } else if (type == ir::ValueType::kIntList) {
      std::vector<int64_t> l;
      bool known = true;
      for (ir::ValueId id : items) {
        const auto& c = out_.value(id).constant;
        const int64_t* i = c ? std::get_if<int64_t>(&*c) : nullptr;
        known = known && i;
        if (i) l.push_back(*i);
      }
      if (known) v.constant = l;
    }
    ir::Node n = opNode(ctx, "prim::ListConstruct");
    n.inputs = std::move(items);
    n.outputs = {out_.addValue(std::move(v))};
    ir::ValueId out = n.outputs[0];
    out_.addNode(std::move(n));
    return out;
  }

  Expected<ir::ValueId> argument(const json& arg, const NodeCtx& ctx) {
    APC_ASSIGN_OR_RETURN(auto u, unionOf(arg, "an argument"));
    const auto& [kind, v] = u;
    if (kind == "as_tensor") return lookup(str(member(*v, "name")));
    if (kind == "as_optional_tensor") {
      APC_ASSIGN_OR_RETURN(auto inner, unionOf(*v, "an optional tensor"));
      if (inner.first == "as_none") return literal("as_none", *inner.second, "");
      return lookup(str(member(*inner.second, "name")));
    }
    if (kind == "as_tensors") {
      std::vector<ir::ValueId> items;
      for (const json& t : *v) {
        APC_ASSIGN_OR_RETURN(ir::ValueId id, lookup(str(member(t, "name"))));
        items.push_back(id);
      }
      return listConstruct(ctx, std::move(items), ir::ValueType::kTensorList);
    }
    if (kind == "as_optional_tensors") {
      // Tensors only: a Tensor[] to the planner (rules place its tensors; the runtime re-types
      // it at the call). With a None among them: an opaque list (Replicate-only).
      std::vector<ir::ValueId> items;
      bool tensors_only = true;
      for (const json& t : *v) {
        APC_ASSIGN_OR_RETURN(auto inner, unionOf(t, "an optional tensor"));
        if (inner.first == "as_none") {
          tensors_only = false;
          APC_ASSIGN_OR_RETURN(ir::ValueId id, literal("as_none", *inner.second, ""));
          items.push_back(id);
        } else {
          APC_ASSIGN_OR_RETURN(ir::ValueId id, lookup(str(member(*inner.second, "name"))));
          items.push_back(id);
        }
      }
      return listConstruct(
          ctx, std::move(items),
          tensors_only && !items.empty() ? ir::ValueType::kTensorList : ir::ValueType::kOther);
    }
    if (kind == "as_sym_int") return symRef(*v, "as_int");
    if (kind == "as_sym_float") return symRef(*v, "as_float");
    if (kind == "as_sym_bool") return symRef(*v, "as_bool");
    if (kind == "as_sym_ints") {
      bool all_static = true;
      std::vector<int64_t> fixed;
      for (const json& x : *v) {
        const json& i = member(x, "as_int");
        all_static = all_static && i.is_number_integer();
        if (i.is_number_integer()) fixed.push_back(i.get<int64_t>());
      }
      if (all_static) return out_.addConstant(ir::ValueType::kIntList, fixed, "");
      std::vector<ir::ValueId> items;
      for (const json& x : *v) {
        APC_ASSIGN_OR_RETURN(ir::ValueId id, symRef(x, "as_int"));
        items.push_back(id);
      }
      return listConstruct(ctx, std::move(items), ir::ValueType::kIntList);
    }
    return literal(kind, *v, "");
  }

  /// A Python number passed where the schema takes a Tensor (FX's aten.add.Tensor(x, 1e-05)): a
  /// 0-dim tensor literal, as TorchScript records traced scalar constants. Its dtype is what the
  /// number would be as a wrapped scalar next to the tensors before it: a float takes the first
  /// floating tensor's dtype (else f32), an int i64, a bool bool.
  Expected<ir::ValueId> tensorLiteral(ir::ValueId scalar, const std::vector<ir::ValueId>& before) {
    const ir::Value& v = out_.value(scalar);
    if (!v.constant) return unsupported("a non-constant scalar is passed as a tensor");
    ir::TensorMeta meta;
    if (std::holds_alternative<double>(*v.constant)) {
      meta.dtype = ir::DType::kF32;
      for (ir::ValueId id : before) {
        const ir::Value& t = out_.value(id);
        if (t.tensor && ir::isFloating(t.tensor->dtype)) {
          meta.dtype = t.tensor->dtype;
          break;
        }
      }
    } else if (std::holds_alternative<int64_t>(*v.constant)) {
      meta.dtype = ir::DType::kI64;
    } else if (std::holds_alternative<bool>(*v.constant)) {
      meta.dtype = ir::DType::kBool;
    } else {
      return unsupported("a " + std::string(ir::valueTypeName(v.type)) + " is passed as a tensor");
    }
    ir::Value t;
    t.type = ir::ValueType::kTensor;
    t.debug_name = v.debug_name;
    t.tensor = meta;
    t.constant = *v.constant;
    return out_.addValue(std::move(t));
  }

  Expected<OpRef> resolveTarget(const NodeCtx& ctx) {
    const std::string& t = ctx.target;
    auto py = pythonOps().find(t);
    if (py != pythonOps().end()) return py->second;
    const std::string ops = "torch.ops.";
    if (t.rfind(ops, 0) != 0)
      return unsupported("op " + t + ctx.where() + " is not an ATen operator (no rule for it)");
    std::string rest = t.substr(ops.size());
    const std::string hop = "higher_order.";
    if (rest.rfind(hop, 0) == 0) {
      if (isControlFlow(rest.substr(hop.size())))
        return unsupported("control-flow higher-order op " + t + ctx.where() + " is not supported");
      return unsupported("higher-order op " + t + ctx.where() + " is not supported");
    }
    size_t first = rest.find('.'), last = rest.rfind('.');
    if (first == std::string::npos || first == last)
      return unsupported("op " + t + ctx.where() + " is not an ATen operator (no rule for it)");
    std::string ns = rest.substr(0, first);
    std::string name = rest.substr(first + 1, last - first - 1);
    std::string overload = rest.substr(last + 1);
    auto alias = aliasedCustomOps().find(ns + "::" + name);
    if (alias != aliasedCustomOps().end() && overload == "default") return alias->second;
    return OpRef{ns + "::" + name, overload == "default" ? "" : overload, false, "", {}};
  }

  /// How to export a model without the custom op `op` ("ns::name"), in one clause.
  static std::string customOpAdvice(const std::string& op) {
    if (op.rfind("transformers::grouped_mm_fallback", 0) == 0)
      return "Hugging Face's grouped-mm experts run it when torch._grouped_mm cannot be traced "
             "(weights not bf16); export with experts_implementation=\"batched_mm\", e.g. "
             "model.set_experts_implementation(\"batched_mm\") or "
             "from_pretrained(..., experts_implementation=\"batched_mm\")";
    if (op.rfind("transformers::", 0) == 0)
      return "a Hugging Face transformers custom op; export with the model's eager "
             "implementation (attn_implementation=\"eager\", experts_implementation=\"eager\")";
    return "apc runs ATen ops only; export without it (call its Python implementation instead of "
           "the op, or decompose it into ATen ops)";
  }

  Expected<const c10::FunctionSchema*> schemaOf(const OpRef& ref, const NodeCtx& ctx) {
    std::string key = ref.op + "." + ref.overload;
    auto it = schemas_.find(key);
    if (it == schemas_.end()) {
      std::shared_ptr<torch::jit::Operator> op;
      try {
        op = torch::jit::findOperatorFor(c10::OperatorName(ref.op, ref.overload));
      } catch (const std::exception& e) {
        rethrowIfOutOfMemory(e);
        op = nullptr;
      }
      it = schemas_.emplace(key, op).first;
    }
    if (!it->second) {
      bool aten = ref.op.rfind("aten::", 0) == 0 || ref.op.rfind("prim::", 0) == 0;
      return unsupported("op " + ctx.target + ctx.where() +
                         (aten ? " has no registered operator in this LibTorch"
                               : " is not an ATen operator (no schema is registered for " + ref.op +
                                     "): " + customOpAdvice(ref.op)));
    }
    return &it->second->schema();
  }

  /// The inputs of an aliased custom op meet the ATen op's requirements, so that running the ATen
  /// op computes what the custom op documents.
  Status checkAlias(const OpRef& ref, const std::vector<ir::ValueId>& inputs, const NodeCtx& ctx) {
    auto meta = [&](size_t i) -> const ir::TensorMeta* {
      if (i >= inputs.size()) return nullptr;
      const ir::Value& v = out_.value(inputs[i]);
      return v.isTensor() && v.tensor ? &*v.tensor : nullptr;
    };
    if (ref.op == "aten::_grouped_mm") {
      const ir::TensorMeta *a = meta(0), *b = meta(1), *offs = meta(2);
      std::string why;
      if (!a || !b || !offs || a->shape.size() != 2 || b->shape.size() != 3 ||
          offs->shape.size() != 1)
        why = "takes a 2-d input, 3-d weights and 1-d offsets here";
      else if (offs->dtype != ir::DType::kI32)
        why = "has " + std::string(ir::dtypeName(offs->dtype)) +
              " offsets; torch._grouped_mm takes i32 ones";
      else if (a->dtype != b->dtype || !ir::isFloating(a->dtype))
        why = "mixes dtypes or is not floating point";
      if (!why.empty())
        return unsupported("node " + ctx.name + ": " + ref.alias_of + " " + why +
                           " (apc runs it as aten::_grouped_mm); " + customOpAdvice(ref.alias_of));
    }
    return Status::success();
  }

  Status addOpNode(const json& n) {
    NodeCtx ctx;
    ctx.target = str(member(n, "target"));
    ctx.name = str(member(n, "name"));
    if (ctx.name.empty()) {
      const json& outs = member(n, "outputs");
      ctx.name = outs.is_array() && !outs.empty() ? outs[0].dump() : ctx.target;
    }
    ctx.module_path = modulePathOf(member(n, "metadata"));
    ctx.source = sourceOf(member(n, "metadata"));
    APC_ASSIGN_OR_RETURN(OpRef ref, resolveTarget(ctx));
    const json& outputs = member(n, "outputs");
    std::string qualified = ref.overload.empty() ? ref.op : ref.op + "." + ref.overload;
    if (isAssertion(ref.op) && outputs.empty()) {
      if (notes_) ++notes_->dropped_ops[qualified];
      return Status::success();
    }
    APC_ASSIGN_OR_RETURN(const c10::FunctionSchema* schema, schemaOf(ref, ctx));

    // Arguments in schema order; those export left out take their defaults.
    const json& given = member(n, "inputs");
    std::map<std::string, const json*> by_name;
    for (const json& in : given) {
      std::string name = str(member(in, "name"));
      auto renamed = ref.renamed.find(name);
      if (!ref.alias_of.empty() && renamed == ref.renamed.end())
        return unsupported("node " + ctx.name + ": " + ref.alias_of + " has no argument '" + name +
                           "' apc knows (a newer version of its library?)");
      by_name[renamed == ref.renamed.end() ? name : renamed->second] = &member(in, "arg");
    }
    const auto& params = schema->arguments();
    if (ref.positional) {
      if (given.size() != params.size())
        return unsupported("op " + ctx.target + ctx.where() + " has " +
                           std::to_string(given.size()) + " arguments; " + qualified + " takes " +
                           std::to_string(params.size()));
      for (const json& in : given) {
        const json& arg = member(in, "arg");
        if (arg.is_object() && !arg.contains("as_sym_int") && !arg.contains("as_int"))
          return unsupported("op " + ctx.target + ctx.where() +
                             " computes on non-integer symbolic values (" +
                             (arg.empty() ? std::string("?") : arg.begin().key()) +
                             "); apc supports SymInt arithmetic only");
      }
    }
    if (!ref.positional)
      for (const auto& [name, arg] : by_name) {
        bool known = false;
        for (const c10::Argument& p : params) known = known || p.name() == name;
        if (!known)
          return unsupported("node " + ctx.name + ": " + qualified + " has no argument '" + name +
                             "' (a program from a newer torch?)");
      }
    std::vector<ir::ValueId> inputs;
    for (size_t i = 0; i < params.size(); ++i) {
      const c10::Argument& p = params[i];
      const json* arg = nullptr;
      if (ref.positional) {
        arg = &member(given[i], "arg");
      } else {
        auto it = by_name.find(p.name());
        if (it != by_name.end()) arg = it->second;
      }
      if (arg) {
        auto id = argument(*arg, ctx);
        if (!id.ok()) return id.error().withContext("node " + ctx.name + " argument " + p.name());
        if (p.real_type()->kind() == c10::TypeKind::TensorType && !out_.value(*id).isTensor()) {
          auto literal = tensorLiteral(*id, inputs);
          if (!literal.ok()) return literal.error().withContext("node " + ctx.name);
          id = *literal;
        }
        inputs.push_back(*id);
      } else if (p.default_value()) {
        auto c = constantOf(*p.default_value());
        if (!c)
          return unsupported("node " + ctx.name + ": the default of argument " + p.name() + " of " +
                             qualified + " cannot be represented");
        inputs.push_back(out_.addConstant(c->first, c->second, ""));
      } else if (p.real_type()->kind() == c10::TypeKind::OptionalType) {
        inputs.push_back(out_.addConstant(ir::ValueType::kNone, ir::None{}, ""));
      } else {
        return parseError("node " + ctx.name + ": argument " + p.name() + " of " + qualified +
                          " is missing");
      }
    }

    if (!ref.alias_of.empty()) APC_RETURN_IF_ERROR(checkAlias(ref, inputs, ctx));
    bool grad = requiresGrad(inputs) && ref.op != "aten::detach";
    ir::Node node = opNode(ctx, ref.op);
    node.overload = ref.overload;
    node.inputs = std::move(inputs);
    std::vector<std::pair<ir::ValueId, std::vector<std::string>>> unpack;  // Tensor[] results
    for (const json& o : outputs) {
      APC_ASSIGN_OR_RETURN(auto u, unionOf(o, "an output"));
      const auto& [kind, v] = u;
      ir::Value value;
      std::string name;
      if (kind == "as_tensor") {
        name = str(member(*v, "name"));
        APC_ASSIGN_OR_RETURN(ir::TensorMeta m, metaOf(name));
        m.requires_grad = grad && ir::isFloating(m.dtype);
        value.type = ir::ValueType::kTensor;
        value.tensor = m;
      } else if (kind == "as_tensors") {
        std::vector<std::string> names;
        value.type = ir::ValueType::kTensorList;
        for (const json& t : *v) {
          names.push_back(str(member(t, "name")));
          APC_RETURN_IF_ERROR(define(names.back(), nodeLabel(ctx)));
          APC_ASSIGN_OR_RETURN(ir::TensorMeta m, metaOf(names.back()));
          m.requires_grad = grad && ir::isFloating(m.dtype);
          value.elements.push_back(m);
        }
        name = ctx.name;
        value.debug_name = name;
        ir::ValueId id = out_.addValue(std::move(value));
        node.outputs.push_back(id);
        unpack.emplace_back(id, std::move(names));
        continue;
      } else if (kind == "as_sym_int") {
        name = str(member(*v, "as_name"));
        value.type = ir::ValueType::kInt;
        // The value at the hints; none when it is data-dependent (a later size that needs it
        // is the error).
        const json& sym = member(*sym_int_values_, name);
        if (!sym.is_null()) {
          auto c = symbols_.value(sym);
          if (c.ok()) value.constant = *c;
        }
      } else if (kind == "as_sym_float" || kind == "as_sym_bool") {
        name = str(member(*v, "as_name"));
        value.type = kind == "as_sym_float" ? ir::ValueType::kFloat : ir::ValueType::kBool;
      } else if (kind == "as_none") {
        value.type = ir::ValueType::kNone;
        value.constant = ir::None{};
      } else {
        return unsupported("node " + ctx.name + ": an output of kind " + kind +
                           " is not supported");
      }
      value.debug_name = name;
      ir::ValueId id = out_.addValue(std::move(value));
      node.outputs.push_back(id);
      if (!name.empty()) {
        APC_RETURN_IF_ERROR(define(name, nodeLabel(ctx)));
        values_[name] = id;
      }
    }
    out_.addNode(std::move(node));
    for (auto& [list, names] : unpack) {
      ir::Node un = opNode(ctx, "prim::ListUnpack");
      un.inputs = {list};
      for (size_t i = 0; i < names.size(); ++i) {
        ir::Value e;
        e.type = ir::ValueType::kTensor;
        e.debug_name = names[i];
        e.tensor = out_.value(list).elements[i];
        ir::ValueId id = out_.addValue(std::move(e));
        un.outputs.push_back(id);
        values_[names[i]] = id;
      }
      out_.addNode(std::move(un));
    }
    return Status::success();
  }

  // --- outputs -------------------------------------------------------------------------------

  Expected<ir::ValueId> outputValue(const json& arg) {
    APC_ASSIGN_OR_RETURN(auto u, unionOf(arg, "an output"));
    const auto& [kind, v] = u;
    if (kind == "as_tensor") return lookup(str(member(*v, "name")));
    if (kind == "as_sym_int" || kind == "as_sym_float" || kind == "as_sym_bool") {
      const char* lit = kind == "as_sym_int"     ? "as_int"
                        : kind == "as_sym_float" ? "as_float"
                                                 : "as_bool";
      return symRef(*v, lit);
    }
    return literal(kind, *v, "");
  }

  /// The pytree spec node -> OutputTree, taking leaves in order.
  Expected<ir::OutputTree> tree(const json& spec, const std::vector<ir::ValueId>& leaves,
                                size_t& next, int depth) {
    if (depth > 64) return parseError("output structure nested too deeply");
    const json& type = member(spec, "type");
    const json& children = member(spec, "children_spec");
    if (type.is_null()) {
      if (next >= leaves.size()) return parseError("out_spec has more leaves than outputs");
      return ir::OutputTree::makeLeaf(leaves[next++]);
    }
    if (!children.is_array()) return parseError("out_spec node without children_spec");
    ir::OutputTree t;
    std::string ty = str(type);
    const std::string context_text = str(member(spec, "context"));
    auto parsed_context = parseJsonText(context_text);
    if (!parsed_context.ok())
      return parsed_context.error().withContext("'" + path_ + "': an out_spec context");
    json context = std::move(parsed_context).value();
    bool keyed = ty == "builtins.dict" || ty == "collections.OrderedDict" ||
                 ty == "collections.defaultdict" ||
                 ty == "torch.fx.immutable_collections.immutable_dict";
    if (ty == "collections.defaultdict" && context.is_object()) context = member(context, "keys");
    if (!keyed && ty != "builtins.tuple" && ty != "builtins.list" &&
        ty != "collections.namedtuple" && ty != "torch.fx.immutable_collections.immutable_list")
      keyed = context.is_array() && context.size() == children.size();  // registered dict-likes
    if (keyed) {
      if (!context.is_array() || context.size() != children.size())
        return parseError("out_spec of type " + ty + " has no keys");
      t.kind = ir::OutputTree::Kind::kDict;
      for (const json& k : context)
        t.keys.push_back(k.is_string() ? k.get<std::string>() : k.dump());
    } else {
      t.kind = ty == "builtins.list" || ty == "torch.fx.immutable_collections.immutable_list"
                   ? ir::OutputTree::Kind::kList
                   : ir::OutputTree::Kind::kTuple;
    }
    for (const json& c : children) {
      APC_ASSIGN_OR_RETURN(ir::OutputTree child, tree(c, leaves, next, depth + 1));
      t.children.push_back(std::move(child));
    }
    return t;
  }

  Status addOutputs() {
    std::vector<ir::ValueId> leaves;
    for (const json& spec : member(*signature_, "output_specs")) {
      APC_ASSIGN_OR_RETURN(auto u, unionOf(spec, "an output spec"));
      const auto& [kind, body] = u;
      if (kind == "user_output") {
        APC_ASSIGN_OR_RETURN(ir::ValueId id, outputValue(member(*body, "arg")));
        leaves.push_back(id);
      } else if (kind == "loss_output") {
        APC_ASSIGN_OR_RETURN(ir::ValueId id, lookup(str(member(member(*body, "arg"), "name"))));
        leaves.push_back(id);
      } else if (kind == "buffer_mutation") {
        APC_ASSIGN_OR_RETURN(ir::ValueId id, lookup(str(member(member(*body, "arg"), "name"))));
        if (notes_) notes_->buffer_mutations.emplace_back(str(member(*body, "buffer_name")), id);
      } else {
        return unsupported("'" + path_ + "': an output of kind " + kind +
                           " (input or parameter mutation, gradients, tokens) is not supported");
      }
    }
    ir::OutputTree t;
    auto parsed_spec = parseJsonText(out_spec_);
    if (!parsed_spec.ok())
      return parsed_spec.error().withContext("'" + path_ + "': the signature's out_spec");
    const json spec = std::move(parsed_spec).value();
    if (spec.is_array() && spec.size() == 2 && spec[1].is_object()) {
      size_t next = 0;
      APC_ASSIGN_OR_RETURN(t, tree(spec[1], leaves, next, 0));
      if (next != leaves.size())
        return parseError("'" + path_ + "': out_spec has " + std::to_string(next) +
                          " leaves but the program has " + std::to_string(leaves.size()) +
                          " user outputs");
    } else if (leaves.size() == 1) {
      t = ir::OutputTree::makeLeaf(leaves[0]);
    } else {
      t.kind = ir::OutputTree::Kind::kTuple;
      for (ir::ValueId id : leaves) t.children.push_back(ir::OutputTree::makeLeaf(id));
    }
    out_.setOutputs(std::move(t));
    return Status::success();
  }

  const json& program_;
  const json& weights_;
  const json& constants_;
  std::string path_;
  const json* graph_ = nullptr;
  const json* signature_ = nullptr;
  const json* tensor_values_ = nullptr;
  const json* sym_int_values_ = nullptr;
  std::string out_spec_;
  Symbols symbols_;
  std::vector<UserInput> inputs_;
  std::vector<Deferred> deferred_;
  std::set<std::string> used_;
  std::map<std::string, ir::ValueId> parameter_nodes_;  // payload identity -> Parameter value
  ImportNotes* notes_ = nullptr;
  ir::Graph out_;
  std::unordered_map<std::string, ir::ValueId> values_;
  // Every name the program defines (signature inputs, node outputs) -> what defines it.
  std::unordered_map<std::string, std::string> defined_by_;
  size_t node_index_ = 0;  // the position of the node addOpNode reads
  std::unordered_map<std::string, std::shared_ptr<torch::jit::Operator>> schemas_;
};

struct Program {
  json program;    // models/model.json
  json weights;    // data/weights/model_weights_config.json, or an empty object
  json constants;  // data/constants/model_constants_config.json, or an empty object
};

Expected<Program> readProgram(const std::string& path) {
  APC_ASSIGN_OR_RETURN(Pt2Archive archive, Pt2Archive::open(path));
  if (!archive.has(kModelJsonRecord))
    return parseError("'" + path + "' is not an exported program: it has no " +
                      std::string(kModelJsonRecord));
  Program p;
  APC_ASSIGN_OR_RETURN(p.program, archive.json(kModelJsonRecord));
  p.weights = json::object();
  if (archive.has(kWeightsConfigRecord)) {
    APC_ASSIGN_OR_RETURN(p.weights, archive.json(kWeightsConfigRecord));
  }
  p.constants = json::object();
  if (archive.has(kConstantsConfigRecord)) {
    APC_ASSIGN_OR_RETURN(p.constants, archive.json(kConstantsConfigRecord));
  }
  return p;
}

}  // namespace

Expected<std::vector<InputSpec>> recordedExportedInputs(const std::string& path) {
  APC_ASSIGN_OR_RETURN(Program p, readProgram(path));
  ExportedImporter importer(p.program, p.weights, p.constants, path);
  try {
    APC_RETURN_IF_ERROR(importer.prepare());
    return importer.recordedInputs();
  } catch (const std::exception& e) {
    rethrowIfOutOfMemory(e);
    return parseError("'" + path + "': malformed models/model.json (" + e.what() + ")");
  }
}

Expected<ir::Graph> importExportedProgram(const std::string& path, const ImportOptions& options,
                                          ImportTimings* timings, ImportNotes* notes) {
  auto t0 = std::chrono::steady_clock::now();
  APC_ASSIGN_OR_RETURN(Program p, readProgram(path));
  if (timings) {
    timings->load_s = secondsSince(t0);
    timings->inline_s = 0;
  }
  auto t1 = std::chrono::steady_clock::now();
  ExportedImporter importer(p.program, p.weights, p.constants, path);
  Expected<ir::Graph> g = [&]() -> Expected<ir::Graph> {
    try {
      APC_RETURN_IF_ERROR(importer.prepare());
      APC_RETURN_IF_ERROR(importer.applyOverrides(options.inputs));
      return importer.build(notes);
    } catch (const std::exception& e) {
      rethrowIfOutOfMemory(e);
      return parseError("'" + path + "': malformed models/model.json (" + e.what() + ")");
    }
  }();
  if (!g.ok()) return g;
  APC_RETURN_IF_ERROR(functionalizeInPlace(*g, torchSchemaAliasing));
  g->name = std::filesystem::path(path).stem().string();
  if (timings) timings->interpret_s = secondsSince(t1);
  return g;
}

}  // namespace apc::frontend
