//===- lib/frontend/model.cpp - Import a model file of either kind ---------===//
#include "apc/frontend/model.h"

#include <filesystem>

#include "pt2_archive.h"

namespace apc::frontend {

const char* modelFormatName(ModelFormat f) {
  return f == ModelFormat::kExportedProgram ? "exported program" : "TorchScript";
}

Expected<ModelFormat> detectModelFormat(const std::string& path) {
  APC_RETURN_IF_ERROR(checkModelPath(path));
  auto archive = Pt2Archive::open(path);
  if (!archive.ok()) {
    // Not a readable zip: let the importer its name suggests report it.
    return std::filesystem::path(path).extension() == ".pt2" ? ModelFormat::kExportedProgram
                                                             : ModelFormat::kTorchScript;
  }
  return archive->isExportedProgram() ? ModelFormat::kExportedProgram : ModelFormat::kTorchScript;
}

namespace {

/// torch.cat skips operands that are 1-d and empty (its legacy rule for empty tensors), as in
/// transformers' empty key/value caches: `cat([torch.tensor([]), k], dim=-2)`. They are dropped
/// from the list here, so that the planner and lowering see the concatenation that runs (a 1-d
/// operand beside 4-d ones fits no sharding rule, and its buffer no placement).
void dropEmptyCatOperands(ir::Graph& g) {
  std::vector<int> uses(g.numValues(), 0);
  for (const ir::Node& n : g.nodes())
    for (ir::ValueId v : n.inputs) ++uses[v.v];
  for (const ir::Node& n : g.nodes()) {
    if (n.op != "aten::cat" || n.inputs.empty()) continue;
    ir::Value& list = g.value(n.inputs[0]);
    if (list.type != ir::ValueType::kTensorList || !list.producer.valid() || uses[list.id.v] != 1)
      continue;
    ir::Node& construct = g.node(list.producer);
    if (construct.op != "prim::ListConstruct" || construct.inputs.size() != list.elements.size())
      continue;
    std::vector<ir::ValueId> kept_inputs;
    std::vector<ir::TensorMeta> kept_elements;
    for (size_t i = 0; i < construct.inputs.size(); ++i) {
      const ir::TensorMeta& e = list.elements[i];
      const bool empty_1d = e.shape.size() == 1 && !e.shape[0].isSymbolic() && e.shape[0].size == 0;
      if (empty_1d) continue;
      kept_inputs.push_back(construct.inputs[i]);
      kept_elements.push_back(e);
    }
    if (kept_inputs.size() == construct.inputs.size() || kept_inputs.empty()) continue;
    construct.inputs = std::move(kept_inputs);
    list.elements = std::move(kept_elements);
  }
}

/// einsum(equation, Tensor[] operands) reads its operands through one list value, and a list has
/// one placement for all its elements: a label could be cut only where it sits at the same dim of
/// every operand, so neither data parallelism over a label one operand lacks ('egcd,edf->egcf'
/// cut on g) nor a token-to-expert exchange ('gsec,egcd->gsd') could be planned. When the list is
/// a prim::ListConstruct of tensors read by this einsum alone, the einsum takes its operands as
/// inputs instead: aten::einsum.operands(equation, t0, t1, ...), apc's own overload (the runtime
/// packs the operands into the list again), each operand with its own placement.
void einsumOperandsAsInputs(ir::Graph& g) {
  std::vector<int> uses(g.numValues(), 0);
  for (const ir::Node& n : g.nodes())
    for (ir::ValueId v : n.inputs) ++uses[v.v];
  for (ir::ValueId v : g.outputs().leaves()) ++uses[v.v];
  std::vector<bool> dead(g.numNodes(), false);
  bool any = false;
  for (size_t i = 0; i < g.numNodes(); ++i) {
    ir::Node& n = g.node(ir::NodeId(static_cast<uint32_t>(i)));
    if (n.op != "aten::einsum" || n.inputs.size() < 2 || n.inputs.size() > 3) continue;
    if (n.inputs.size() == 3 && g.value(n.inputs[2]).type != ir::ValueType::kNone) continue;
    const ir::Value& list = g.value(n.inputs[1]);
    if (list.type != ir::ValueType::kTensorList || !list.producer.valid() || uses[list.id.v] != 1)
      continue;
    const ir::Node& construct = g.node(list.producer);
    if (construct.op != "prim::ListConstruct" || construct.inputs.empty()) continue;
    bool tensors = true;
    for (ir::ValueId e : construct.inputs) tensors = tensors && g.value(e).isTensor();
    if (!tensors) continue;
    std::vector<ir::ValueId> inputs{n.inputs[0]};
    inputs.insert(inputs.end(), construct.inputs.begin(), construct.inputs.end());
    dead[construct.id.v] = true;
    n.overload = std::string(ir::kEinsumOperandsOverload);
    n.inputs = std::move(inputs);
    any = true;
  }
  if (any) g.removeNodes(dead);
}

}  // namespace

Expected<ir::Graph> importModel(const std::string& path, const ImportOptions& options,
                                ImportTimings* timings, ImportNotes* notes) {
  APC_ASSIGN_OR_RETURN(ModelFormat f, detectModelFormat(path));
  Expected<ir::Graph> g = f == ModelFormat::kExportedProgram
                              ? importExportedProgram(path, options, timings, notes)
                              : importTorchScript(path, options, timings);
  if (g.ok()) {
    dropEmptyCatOperands(*g);
    einsumOperandsAsInputs(*g);
  }
  return g;
}

Expected<std::vector<InputSpec>> recordedModelInputs(const std::string& path) {
  APC_ASSIGN_OR_RETURN(ModelFormat f, detectModelFormat(path));
  if (f == ModelFormat::kExportedProgram) return recordedExportedInputs(path);
  return recordedInputs(path);
}

}  // namespace apc::frontend
