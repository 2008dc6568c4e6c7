//===- apc/frontend/exported_program.h - torch.export importer -------------===//
//
// Imports what `torch.export.save` writes (a `.pt2` zip: `archive_format` = "pt2",
// `models/model.json` = the serialized ExportedProgram, `data/weights/...` raw weight bytes) into
// the same apc Graph the TorchScript importer makes, without Python and without running anything:
// every value's shape and dtype is recorded in the program.
//
// 1. Read `models/model.json` (LibTorch's zip reader, nlohmann_json). Its schema_version major
//    must be kExportSchemaMajor.
// 2. Symbols: every symbolic size is a sympy srepr expression over the program's size symbols
//    (`Symbol('s77', ...)`, `Mul(Integer(64), Symbol('s77', ...))`) with a hint. A symbol's value
//    is the hint of a size that is that bare symbol. `ImportOptions::inputs` may change a symbol's
//    value (a symbolic dim of an input given another size; a symbol name given there renames the
//    symbol, e.g. `tokens:i64[B=8,128]`), within the exported range_constraints; a static dim
//    cannot change. Every size is then evaluated at these values (lib/frontend/sym_expr.h).
// 3. Nodes, in order: Input nodes (user inputs, named by forward_arg_names), Parameter nodes (by
//    parameter FQN, in signature order), Buffer nodes for the buffers and lifted tensor constants
//    the graph reads (by buffer FQN or constant name), then one Op node per graph node. Export
//    lifts a tied parameter under each of its names and saves it once: names whose weight records
//    are the same storage share one node, under the first name, as in a TorchScript import.
//    - `torch.ops.aten.linear.default` -> op "aten::linear", overload "" ("default" -> ""). The
//      operator must be registered; its schema fills in the arguments export leaves out at their
//      defaults, so that every node lists its arguments in schema order, as TorchScript does. A
//      number passed where the schema takes a Tensor (aten.add.Tensor(x, 1e-05)) becomes a 0-dim
//      tensor literal, as TorchScript records traced scalars.
//    - SymInt arithmetic (`aten.sym_size.int`, `_operator.mul/add/sub/floordiv/mod/neg`,
//      `torch.sym_max/sym_min`) becomes int-valued nodes the JIT can run (aten::sym_size.int,
//      aten::mul.int, ..., prim::max.int) whose constant is the value at the hints; a size list
//      mixing ints and SymInts becomes a prim::ListConstruct node with the evaluated list as its
//      constant, a Tensor[] argument a prim::ListConstruct of tensors, and a Tensor[] result a
//      prim::ListUnpack node after the op: the shapes of a TorchScript import.
//    - Runtime assertions (aten::_assert_tensor_metadata, _assert_scalar, sym_constrain_range*,
//      _assert_async) are dropped (ImportNotes::dropped_ops).
//    - Multi-output ops (native_layer_norm, ...) keep one IR output per result.
//    - module_path: the path of the innermost entry of the node's nn_module_stack
//      ("layers.0.attention.wq"); source: the innermost frame of its stack_trace outside torch's
//      own package ("model.py:42").
// 4. Outputs: the user outputs, in the structure of the program's out_spec (tuples, lists, dicts
//    as in TorchScript). Buffer mutations of a functional program (run_decompositions: BatchNorm
//    statistics in training mode) are not outputs; they are reported in
//    ImportNotes::buffer_mutations. (The default training IR updates buffers in place instead,
//    aten::add_ and batch_norm(training=True), as a TorchScript trace does.)
//
// A tensor dim whose size expression has free symbols becomes ir::Dim::symbolic(symbol, value at
// the hints), the symbol being the one that comes first in the inputs' shapes (B for B*T). These
// are apc's dynamic dims: a .pt2 with a dynamic batch needs no --input. requires_grad follows the
// TorchScript importer's rule (parameters as recorded, op outputs when some input requires it and
// the output is floating).
//
// Errors (one line): missing file (kNotFound); not a zip, truncated or corrupt archive, no
// models/model.json, malformed JSON (kParse; LibTorch's zip reader checks no CRCs, so damaged
// bytes are caught only where they break the JSON); unknown schema major version, higher-order ops
// (torch.ops.higher_order.cond/while_loop/...), ops that are not registered ATen operators,
// data-dependent sizes, non-tensor user inputs (kUnsupported); bad overrides (kInvalidArgument).
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

/// The export serde schema major version this importer reads (torch 2.13 writes 8.20).
inline constexpr int kExportSchemaMajor = 8;

/// Imports the exported program at `path` (see above).
Expected<ir::Graph> importExportedProgram(const std::string& path,
                                          const ImportOptions& options = {},
                                          ImportTimings* timings = nullptr,
                                          ImportNotes* notes = nullptr);

/// The program's user inputs as recorded (names, dtypes, shapes; symbolic dims with their hints).
Expected<std::vector<InputSpec>> recordedExportedInputs(const std::string& path);

}  // namespace apc::frontend
