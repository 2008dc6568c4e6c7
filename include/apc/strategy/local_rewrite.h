//===- apc/strategy/local_rewrite.h - Op constants rewritten for local pieces //
//
// A node of the IR is written for global tensors: its constant arguments (view sizes, factory
// sizes, arange bounds, embedding rows) describe the whole tensor. When a rank runs the node on
// its local pieces some of those arguments must describe the local piece instead. Each op's
// rewrite is its registry entry's OpInfo::local_rewrite, set where the op is registered (one
// function of lib/strategy/local_rewrite.cpp per row); lowering applies it
// (apc/lower/local_rewrite.h). The table below is the complete set, the one the strategy
// validator established for the rules of lib/strategy (tests/strategy_validator/local_rewrite.h
// holds the same table over IValues; it should later call this torch-free version):
//
//   op (argument position)                     rewrite on a rank
//   view, _unsafe_view, expand, broadcast_to   the size list becomes the rank's local output shape
//     (size: 1), reshape (shape: 1)
//   unflatten (dim: 1, sizes: 2)               the sizes become the local sizes of the output dims
//                                              [dim, dim + len(sizes))
//   full, ones, zeros, empty (size: 0),        the size list becomes the local output shape
//     new_full, new_ones, new_zeros,
//     new_empty (size: 1)
//   arange (end | start, end | start, end,     when the output is cut: start' = start + off*step,
//     step)                                    end' = start' + len*step for the rank's piece
//                                              [off, off+len); arange(end) becomes
//                                              arange.start(start', end')
//   narrow (dim: 1, start: 2, length: 3)       a narrow over the whole of a cut dim (start 0,
//                                              length = global size) keeps the whole local piece
//   embedding (padding_idx: 2)                 with the weight cut along dim 0 (vocab-parallel,
//                                              output Partial): padding_idx is shifted by the
//                                              rank's row offset, or -1 when the row is not local,
//                                              and the node runs as its local graph (`local`
//                                              below), the masked lookup of the rank's rows
//                                              [off, off + rows): idx = indices - off; outside =
//                                              idx < 0 | idx >= rows; out = embedding(weight,
//                                              idx.masked_fill(outside, 0), padding_idx, ...)
//                                              .masked_fill(outside.unsqueeze(-1), 0) (the other
//                                              ranks' Partial summands supply the zeroed rows)
//   linear (bias: 2), addmm, baddbmm (self:    output a Partial sum on mesh dims where the bias
//     0)                                       is Replicate (Megatron's row-parallel linear): the
//                                              ranks off coordinate 0 of such a dim run the local
//                                              graph op(..., bias * 0, ...), so the summands add
//                                              the bias once (its gradient is then a Partial sum
//                                              there, as any replicated input's of a split op)
//   repeat (repeats: 1)                        dynamic dims only (below)
//   sort, argsort (and .stable) of a 1-d       the rank's own sort (a token-local region,
//     input cut along it                       apc/strategy/token_local.h; no rule cuts the
//                                              sorted dim): the local graph argsort, values
//                                              gathered by it, indices + the piece's first
//                                              position
//   index.Tensor, index_put with self cut      the one index tensor's global positions - the
//     along the indexed dim 0                  piece's first position (a token-local region; no
//                                              rule cuts an indexed dim)
//   _grouped_mm with mat2's groups cut         the rows of the rank's groups [g0, g1):
//     (a token-local region's expert cut; no   narrow(self, 0, start, end - start) with start =
//     rule cuts the groups)                    offs[g0 - 1] (0 for g0 = 0), end = offs[g1 - 1]
//                                              read at run time (Int.Tensor), multiplied with
//                                              offs[g0:g1] - start, and padded with zero rows to
//                                              self's row count (constant_pad_nd): a Partial
//                                              whose rows are each on the rank of their group
//
// The piece's first position in the sort and index rows is local arithmetic, coordinate x the local
// size along dim 0 (aten::size.int, aten::mul.int in the local graph), exact for the even pieces
// a token-local region requires, at any batch size.
//
// Dynamic dims (a dynamic batch): the importers fold sizes computed from a symbol to their value
// at the hint, so every rewrite above also says how the program recomputes them at run time:
// - view / reshape / _unsafe_view with exactly one symbolic output dim: its entry of the size list
//   is -1 (an entry of -1 already in the list is kept only when it is that dim);
// - expand / broadcast_to: -1 ("keep the input's size") for every symbolic output dim whose input
//   dim, aligned from the right, is symbolic too (LLaMA's repeat_kv);
// - every other symbolic output dim of a size list (expand from size 1 as in Hugging Face's
//   attention masks and ViT's class token, factories such as zeros(B, ...), unflatten), and the
//   bounds of an arange over a symbolic dim, and repeat's count where it repeats a size-1 dim
//   to a symbolic one (`cls.repeat(B, 1, 1)`), become a SymbolicSize: the runtime computes the
//   entry on every forward from the symbol's value (per_symbol x symbol is the dim's global
//   size) and this rank's piece of the dim under the tensor's placement (layout::localPiece).
//   A symbolic dim that is not proportional to its symbol (ir::Dim::per_symbol 0) keeps its hint.
//
// All other arguments keep their global values: dims, split sizes and slice bounds of dims that
// the rules keep whole, reduction dims, scalars, and ints computed from sizes (aten::size gives
// the GLOBAL size in the program's semantics). An op without a rewrite runs unchanged.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "apc/ir/graph.h"
#include "apc/layout/layout.h"
#include "apc/mesh/placement.h"
#include "apc/strategy/strategy.h"
#include "apc/support/error.h"

namespace apc::strategy {

/// The part of one tensor that a rank holds.
struct TensorPiece {
  std::vector<int64_t> global;          // global sizes (hints for symbolic dims)
  std::vector<layout::DimPiece> local;  // the rank's piece of each dim (layout::localPiece)
  std::vector<bool> symbolic;           // per dim: dynamic (a symbol); empty: all static
  std::vector<ir::Dim> dims;            // the global dims (symbol and per_symbol)
  mesh::PlacementTuple placement;       // how the tensor is placed (its pieces' rule)

  std::vector<int64_t> localSizes() const;
  /// True when the rank holds the whole of dim d.
  bool whole(size_t d) const { return local.at(d).offset == 0 && local.at(d).size == global.at(d); }
};

/// What a rank holds of a node's tensors: per node input and output, one piece per tensor (one
/// for a tensor, one per element for a Tensor[], none for non-tensor values).
struct RankPieces {
  std::vector<std::vector<TensorPiece>> inputs;
  std::vector<std::vector<TensorPiece>> outputs;
  std::vector<int64_t> coordinate;  // the rank's mesh coordinate (empty: 0 on every mesh dim)
};

/// One argument (or one element of an int[] argument) recomputed on every forward from a symbol's
/// run-time value: shift + scale x (the size, offset or end of this rank's piece of dim `dim` of a
/// tensor placed `placement`, whose global size there is per_symbol x the symbol).
struct SymbolicSize {
  enum class Part { kSize, kOffset, kEnd };
  size_t input = 0;      // argument position in the node as emitted (after `prepend`)
  int64_t element = -1;  // element of an int[] argument; -1: an int argument
  std::string symbol;
  int64_t per_symbol = 1;
  mesh::PlacementTuple placement;
  size_t rank = 0;
  size_t dim = 0;
  Part part = Part::kSize;
  int64_t scale = 1;
  int64_t shift = 0;
};

/// The rewrite of one rank's call of a node.
struct NodeRewrite {
  /// (input position, new constant) pairs, in position order.
  std::vector<std::pair<size_t, ir::Constant>> replace;
  /// When set, the node runs as this overload with `prepend` inserted as input 0 (arange(end)
  /// becoming arange.start).
  std::optional<std::string> overload;
  std::optional<ir::Constant> prepend;
  /// When set, the rank runs the node as this local graph (apc/ir/op_collective.h: one input per
  /// node input, fed the node's arguments after the rewrites above; one output leaf per node
  /// output; plain ops, no kOpAllReduce node) instead of the op: a computation that depends on the
  /// rank's pieces but needs no collective (a vocab-parallel embedding's masked lookup). Lowering
  /// records it as a proto::OpCollective without mesh dims; the runtime runs it without knowing
  /// the op.
  std::optional<ir::Graph> local;
  /// Arguments the runtime recomputes from symbols (a dynamic batch; see the file comment).
  std::vector<SymbolicSize> symbolic;
  std::vector<std::string> notes;  // one line per rewrite applied ("size := [8, 64, 1, 12]")

  bool empty() const { return replace.empty() && !overload && !local && symbolic.empty(); }
};

}  // namespace apc::strategy
