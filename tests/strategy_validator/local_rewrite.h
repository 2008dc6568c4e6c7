//===- tests/strategy_validator/local_rewrite.h - Local rewrites of op calls ===//
//
// A node of the IR is written for global tensors: its constant arguments (view sizes, factory
// sizes, arange bounds, embedding row numbers) describe the whole tensor. When a rank runs the
// node on its local pieces, some of those arguments must describe the local piece instead, and a
// few ops need a small wrapper. This file is the complete list of such rewrites that the strategy
// validator needed for the rules of lib/strategy to hold; lowering (lib/lower) must apply the same
// rewrites to the per-rank programs, so they are kept here as one small reusable function:
//
//   op (argument)                              rewrite on a rank
//   view, reshape, _unsafe_view, expand,       the size list becomes the rank's local output shape
//     broadcast_to (size / shape)
//   unflatten (sizes)                          the sizes become the local sizes of the output dims
//                                              [dim, dim + len(sizes))
//   full, ones, zeros, empty, new_full,        the size list becomes the local output shape
//     new_ones, new_zeros, new_empty (size)
//   arange (start, end, step)                  when the output is cut: start' = start + off*step,
//                                              end' = start' + len*step for the rank's piece
//                                              [off, off+len)
//   narrow (length)                            a narrow over the whole of a cut dim (start 0,
//                                              length = global size) keeps the whole local piece
//   embedding (indices)                        with the weight cut along dim 0 (vocab-parallel,
//                                              output Partial): indices are shifted by the rank's
//                                              row offset, indices outside the local rows read row
//                                              0 and their output rows are zeroed afterwards (the
//                                              other ranks' summands supply them); padding_idx is
//                                              shifted too, or -1 when not local
//
// All other arguments keep their global values: dims, split sizes and slice bounds of dims that
// the rules keep whole, reduction dims, scalars. An op not listed runs unchanged.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>

#include "apc/cost/layout.h"
#include "apc/ir/graph.h"
#include "apc/support/error.h"

namespace apc::validator {

/// The part of one tensor that a rank holds.
struct TensorPiece {
  std::vector<int64_t> global;        // global sizes
  std::vector<cost::DimPiece> local;  // the rank's piece of each dim (cost::localPiece)

  std::vector<int64_t> localSizes() const;
  /// True when the rank holds the whole of dim d.
  bool whole(size_t d) const { return local.at(d).offset == 0 && local.at(d).size == global.at(d); }
};

/// What a rank holds of a node's tensors: per node input and output, one piece per tensor (one
/// for a tensor, one per element for a Tensor[], none for non-tensor values).
struct RankPieces {
  std::vector<std::vector<TensorPiece>> inputs;
  std::vector<std::vector<TensorPiece>> outputs;
};

/// The fix-ups of one rank's call.
struct LocalCall {
  std::vector<std::string> notes;                       // one line per rewrite applied
  std::function<void(std::vector<c10::IValue>&)> post;  // applied to the outputs; may be empty
};

/// Rewrites `args` (one IValue per node input, tensors already local) in place for the rank whose
/// pieces are `pieces`, per the table above. `schema` names the arguments (nullptr for prim ops,
/// which need no rewrite). Errors: a listed op whose arguments do not have the expected form.
Expected<LocalCall> localizeCall(const ir::Node& node, const c10::FunctionSchema* schema,
                                 std::vector<c10::IValue>& args, const RankPieces& pieces);

}  // namespace apc::validator
