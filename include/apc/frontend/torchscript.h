//===- apc/frontend/torchscript.h - TorchScript importer -------------------===//
//
// Imports a TorchScript archive (scripted or traced, torch.jit.save) into an apc Graph with global
// shapes, without materializing weights or activations:
//
// 1. Load the archive (loadScriptModule, apc/frontend/script_module.h: torch::jit::load without
//    its quantized-convolution rewrite); copy the forward graph and inline every method call.
// 2. Create one Parameter node per entry of named_parameters() (tied parameters once, under the
//    first name, as PyTorch reports them), Buffer nodes for the buffers the forward reads, and one
//    Input node per forward argument.
// 3. Interpret the inlined graph once, node by node, on meta tensors: every op runs through its
//    registered operator. Many meta kernels of LibTorch 2.13 are registered from Python
//    (torch/_meta_registrations.py) and are missing in a C++ process: relu, native_batch_norm
//    (so layer_norm and batch_norm), index_select (embedding), where.self (inside
//    scaled_dot_product_attention's math path), convolution. Such ops fall back to the
//    TorchScript shape functions (symbolic_shape_registry), and convolution and
//    scaled_dot_product_attention, which have none, to hand rules. Scalars derived from sizes stay
//    real CPU values, so size arithmetic (aten::size, NumToTensor, floordiv) is exact. When no op
//    of the graph is in-place, an operator called again on equal arguments (meta tensors of equal
//    dtype, sizes and strides; equal scalars and lists) reuses its first outputs: a deep model's
//    layers repeat their calls (ImportOptions::memoize_meta).
// 4. prim::If whose condition does not depend on the inputs is flattened to the taken branch; other
//    control flow is an error naming the node and its source line.
//
// 5. Only when some input has a symbolic dim (`x:f32[B=8,16]`): for each symbol, the graph is
//    interpreted a second time with that symbol's hint doubled, and every tensor dim (values and
//    tensor-list elements) whose size differs between the runs becomes that symbol, hint kept.
//    Int constants derived from a dynamic dim (aten::size, arithmetic on it) keep the hint:
//    lowering writes the one symbolic dim of a view / reshape output as -1
//    (apc/lower/local_rewrite.h), which covers the size lists such ints build; other consumers of
//    them (expand, factories, arange) stay at the hint, so models using them (llama_tiny's
//    repeat_kv expands to B) do not run at other batches yet. When the second run gives a
//    different graph (a branch on a size), the dims stay static. Static imports are unchanged (one
//    interpretation).
//
// The input shapes come from `ImportOptions::inputs`, else from the archive's
// `extra/apc_inputs.json` (written by our sample generator), else from the complete tensor types
// recorded in the graph; an input without a shape is an error.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <string>
#include <vector>

#include "apc/frontend/import.h"
#include "apc/frontend/input_spec.h"
#include "apc/ir/graph.h"
#include "apc/support/error.h"

namespace apc::frontend {

/// Imports the archive at `path`. Errors: missing file (kNotFound), not a TorchScript archive or
/// truncated (kParse), unknown input name or wrong rank/dtype (kInvalidArgument), control flow that
/// cannot be flattened and ops that fail shape inference (kUnsupported).
Expected<ir::Graph> importTorchScript(const std::string& path, const ImportOptions& options = {},
                                      ImportTimings* timings = nullptr);

/// The forward's inputs as recorded in the archive (names in order, shapes where known).
Expected<std::vector<InputSpec>> recordedInputs(const std::string& path);

}  // namespace apc::frontend
