//===- lib/frontend/weights.cpp - A model file's parameters and buffers ----===//
//
// loadModelState for both model kinds (see apc/frontend/weights.h). For exported programs the
// weight records are the raw bytes of each tensor's whole storage (torch/export/pt2_archive/
// _package.py: _save_raw_tensors), and the payload config gives every name's dtype, sizes,
// strides and storage offset into its record.
//
//===----------------------------------------------------------------------===//
#include "apc/frontend/weights.h"

#include <functional>
#include <map>
#include <set>

#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/script.h>
#include <nlohmann/json.hpp>

#include "apc/frontend/model.h"
#include "apc/frontend/script_module.h"
#include "apc/support/activity.h"
#include "apc/support/strings.h"
#include "pt2_archive.h"
#include "torch_types.h"

namespace apc::frontend {

namespace {

using nlohmann::json;

// --- TorchScript ---------------------------------------------------------------------------------

void collectConstants(torch::jit::Block* block, NamedTensors& out) {
  for (torch::jit::Node* node : block->nodes()) {
    if (node->kind() == c10::prim::Constant && node->outputs().size() == 1) {
      auto iv = torch::jit::toIValue(node->output());
      if (iv && iv->isTensor() && iv->toTensor().dim() > 0)
        out.emplace_back("__constant." + node->output()->debugName(), iv->toTensor());
    }
    for (torch::jit::Block* b : node->blocks()) collectConstants(b, out);
  }
}

Expected<NamedTensors> loadTorchScriptState(const std::string& path) {
  torch::jit::Module module;
  try {
    module = loadScriptModule(path);
  } catch (const std::exception& e) {
    rethrowIfOutOfMemory(e);
    return parseError("'" + path + "' is not a readable TorchScript archive (" + torchErrorLine(e) +
                      ")");
  }
  NamedTensors out;
  std::set<std::string> seen;
  for (const auto& p : module.named_parameters(/*recurse=*/true))
    if (seen.insert(tensorIdentity(p.value)).second) out.emplace_back(p.name, p.value);
  for (const auto& b : module.named_buffers(/*recurse=*/true))
    if (seen.insert(tensorIdentity(b.value)).second) out.emplace_back(b.name, b.value);
  // Tensor literals of the forward, named as importTorchScript names their Buffer nodes (it reads
  // the same inlined copy of the graph).
  if (auto method = module.find_method("forward")) {
    try {
      std::shared_ptr<torch::jit::Graph> graph = method->graph()->copy();
      torch::jit::Inline(*graph);
      torch::jit::EliminateDeadCode(graph);
      collectConstants(graph->block(), out);
    } catch (const std::exception& e) {
      rethrowIfOutOfMemory(e);
      return unsupported("cannot inline the forward of '" + path + "': " + torchErrorLine(e));
    }
  }
  return out;
}

// --- exported programs ---------------------------------------------------------------------------

class StateReader {
 public:
  explicit StateReader(Pt2Archive archive) : archive_(std::move(archive)) {}

  Status readConfigs() {
    if (archive_.has(kByteOrderRecord)) {
      APC_ASSIGN_OR_RETURN(std::string order, archive_.text(kByteOrderRecord));
      if (trim(order) != "little")
        return unsupported("'" + archive_.path() + "' stores weights " + std::string(trim(order)) +
                           "-endian; apc reads little-endian archives");
    }
    if (archive_.has(kWeightsConfigRecord)) {
      APC_ASSIGN_OR_RETURN(weights_, archive_.json(kWeightsConfigRecord));
    }
    if (archive_.has(kConstantsConfigRecord)) {
      APC_ASSIGN_OR_RETURN(constants_, archive_.json(kConstantsConfigRecord));
    }
    return Status::success();
  }

  /// payloadIdentity of the weights config's entry for `fqn` ("" when absent).
  std::string identity(const std::string& fqn) const {
    return payloadIdentity(member(member(weights_, "config"), fqn));
  }

  /// The tensor stored under `fqn` in the weights config, else the constants config.
  Expected<at::Tensor> tensor(const std::string& fqn) {
    const json& w = member(member(weights_, "config"), fqn);
    if (!w.is_null()) return payload(fqn, w, kWeightsDir);
    const json& c = member(member(constants_, "config"), fqn);
    if (!c.is_null()) return payload(fqn, c, kConstantsDir);
    return parseError("'" + archive_.path() + "' has no stored tensor for '" + fqn + "'");
  }

 private:
  Expected<at::Tensor> payload(const std::string& fqn, const json& meta, const std::string& dir) {
    auto bad = [&](const std::string& why) {
      return parseError("'" + archive_.path() + "': weight '" + fqn + "' " + why);
    };
    if (member(meta, "use_pickle") == true)
      return unsupported("'" + archive_.path() + "': weight '" + fqn +
                         "' is pickled (a tensor subclass); apc reads plain tensors only");
    const json& tm = member(meta, "tensor_meta");
    const json& dt = member(tm, "dtype");
    auto dtype = dt.is_number_integer() ? scalarTypeFromSerde(dt.get<int64_t>()) : std::nullopt;
    if (!dtype) return bad("has an unknown dtype");
    auto ints = [&](const json& list, std::vector<int64_t>& out) {
      for (const json& s : list) {
        const json& i = member(s, "as_int");
        if (!i.is_number_integer()) return false;
        out.push_back(i.get<int64_t>());
      }
      return true;
    };
    std::vector<int64_t> sizes, strides;
    if (!ints(member(tm, "sizes"), sizes) || !ints(member(tm, "strides"), strides) ||
        sizes.size() != strides.size())
      return bad("has symbolic or malformed sizes/strides");
    const json& off = member(member(tm, "storage_offset"), "as_int");
    int64_t offset = off.is_number_integer() ? off.get<int64_t>() : 0;
    // Sizes and strides come from the file: every product is checked (a hand-written input through
    // fuzz_pt2: sizes of 2^62 x 4 overflowed int64).
    auto tooLarge = [&] { return bad("has sizes or strides too large to address"); };
    int64_t numel = 1;
    for (size_t d = 0; d < sizes.size(); ++d) {
      if (strides[d] < 0 || sizes[d] < 0) return bad("has negative sizes or strides");
      if (__builtin_mul_overflow(numel, sizes[d], &numel)) return tooLarge();
    }
    std::string record = dir + member(meta, "path_name").get<std::string>();
    auto it = storages_.find(record);
    if (it == storages_.end()) {
      APC_ASSIGN_OR_RETURN(auto b, archive_.bytes(record));
      size_t nbytes = b.second;
      c10::Storage st(c10::Storage::use_byte_size_t(), static_cast<int64_t>(nbytes),
                      std::move(b.first), /*allocator=*/nullptr, /*resizable=*/false);
      it = storages_.emplace(record, std::move(st)).first;
    }
    const c10::Storage& storage = it->second;
    at::TensorOptions options = at::TensorOptions().dtype(*dtype);
    at::Tensor t;
    if (storage.nbytes() == 0 && numel > 0) {
      // Saved from a fake tensor: torch loads zeros; a zero-stride stub holds the same values.
      t = at::zeros({1}, options).expand(sizes);
    } else {
      int64_t last = offset;  // the highest element index the view reads
      for (size_t d = 0; d < sizes.size(); ++d) {
        int64_t span = 0;
        if (sizes[d] > 0 && (__builtin_mul_overflow(sizes[d] - 1, strides[d], &span) ||
                             __builtin_add_overflow(last, span, &last)))
          return tooLarge();
      }
      int64_t elem = static_cast<int64_t>(c10::elementSize(*dtype));
      int64_t end = 0;  // one past the last byte the view reads
      if (numel > 0 &&
          (offset < 0 || __builtin_add_overflow(last, 1, &end) ||
           __builtin_mul_overflow(end, elem, &end) || end > static_cast<int64_t>(storage.nbytes())))
        return bad("reads past the end of its " + std::to_string(storage.nbytes()) +
                   "-byte record " + record);
      t = at::empty({0}, options);
      t.set_(storage, offset, sizes, strides);
    }
    if (member(meta, "is_param") == true && member(tm, "requires_grad") == true)
      t.set_requires_grad(true);
    return t;
  }

  Pt2Archive archive_;
  json weights_ = json::object();
  json constants_ = json::object();
  std::map<std::string, c10::Storage> storages_;
};

Expected<NamedTensors> loadExportedState(const std::string& path) {
  APC_ASSIGN_OR_RETURN(Pt2Archive archive, Pt2Archive::open(path));
  if (!archive.has(kModelJsonRecord))
    return parseError("'" + path + "' is not an exported program: it has no " +
                      std::string(kModelJsonRecord));
  APC_ASSIGN_OR_RETURN(json program, archive.json(kModelJsonRecord));
  StateReader reader(std::move(archive));
  APC_RETURN_IF_ERROR(reader.readConfigs());
  const json& specs = member(member(member(program, "graph_module"), "signature"), "input_specs");
  NamedTensors out;
  std::set<std::string> tied;
  // Parameters, then buffers, then lifted constants (the importer's node order).
  for (const char* kind : {"parameter", "buffer", "tensor_constant"}) {
    for (const json& spec : specs) {
      const json& body = member(spec, kind);
      if (body.is_null()) continue;
      std::string name = member(body, std::string(kind) == "parameter" ? "parameter_name"
                                      : std::string(kind) == "buffer"  ? "buffer_name"
                                                                       : "tensor_constant_name")
                             .get<std::string>();
      if (std::string(kind) == "parameter") {
        // Tied parameters once, under the first name (as the importer makes their node).
        std::string identity = reader.identity(name);
        if (!identity.empty() && !tied.insert(identity).second) continue;
      }
      auto t = reader.tensor(name);
      if (!t.ok()) return t.error();
      out.emplace_back(name, *t);
    }
  }
  return out;
}

}  // namespace

Expected<NamedTensors> loadModelState(const std::string& path) {
  APC_ASSIGN_OR_RETURN(ModelFormat f, detectModelFormat(path));
  try {
    if (f == ModelFormat::kExportedProgram) return loadExportedState(path);
    return loadTorchScriptState(path);
  } catch (const std::exception& e) {
    rethrowIfOutOfMemory(e);
    return parseError("'" + path + "': cannot read its weights (" + torchErrorLine(e) + ")");
  }
}

}  // namespace apc::frontend
