//===- apc/frontend/import.h - Options and reports shared by the importers -===//
//
// What every importer (TorchScript, torch.export) takes and reports besides the graph: input
// shape overrides, wall times of its phases, and notes on what the program does beyond its
// outputs (buffer writes) or what the import dropped.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <cstdint>

#include "apc/frontend/input_spec.h"
#include "apc/ir/graph.h"

namespace apc::frontend {

struct ImportOptions {
  /// Overrides of input shapes by name; inputs not named here keep their recorded shapes.
  std::vector<InputSpec> inputs;
  /// When set, the importer hands its LibTorch structures (the loaded module, the inlined
  /// TorchScript graph, the meta tensors of its values) to this sink instead of freeing them
  /// before it returns. The library never decides their lifetime; apc's commands pass a sink that
  /// leaves them to the process exit, like clang's -disable-free (freeing a 126-layer LLaMA's
  /// inlined graph takes 0.05 s; tools/apc/common.h, leaveToExit). Library users leave it empty.
  std::function<void(std::shared_ptr<void>)> keep = nullptr;
  /// TorchScript: reuse the result of a meta execution for a later call of the same operator on
  /// equal arguments (a deep model's layers repeat them), when the graph has no in-place op. The
  /// imported graph is the same either way (tests/frontend compares them); off only to check that.
  bool memoize_meta = true;
  /// TorchScript: the most nodes the import interprets, loop bodies once per trip (loops are
  /// unrolled at import, and nested loops whose trip counts come from the input shapes multiply);
  /// past it the import fails with one line. A million takes the meta interpretation tens of
  /// seconds; a 126-layer scripted LLaMA stays far below it.
  int64_t max_interpreted_nodes = 1'000'000;
};

struct ImportTimings {
  double load_s = 0;       // reading the archive (torch::jit::load, or the zip and its JSON)
  double inline_s = 0;     // TorchScript: copy + inline + dead code elimination; .pt2: 0
  double interpret_s = 0;  // meta interpretation (TorchScript) or JSON -> IR, and IR construction
};

struct ImportNotes {
  /// Buffers the forward writes (torch.export's buffer_mutation outputs, such as BatchNorm's
  /// running statistics in training mode): the buffer's name and the graph value holding its new
  /// contents. These values are not graph outputs; nothing downstream writes them back yet.
  std::vector<std::pair<std::string, ir::ValueId>> buffer_mutations;
  /// Nodes left out of the graph, by qualified op, with their count: runtime assertions of
  /// exported programs (aten::_assert_tensor_metadata, aten::_assert_scalar, ...).
  std::map<std::string, int> dropped_ops;
};

}  // namespace apc::frontend
