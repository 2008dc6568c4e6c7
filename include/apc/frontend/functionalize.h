//===- apc/frontend/functionalize.h - In-place ops made out of place -------===//
//
// Traced TorchScript and torch.export's training IR keep in-place ATen ops (`relu_`, `add_`,
// `hardswish_`, `dropout_`, ...). The sharded runtime cannot keep their aliasing: a rank's input
// piece is often a redistributed copy or an autograd view of another value, so a write into it
// either misses the tensor later readers see or corrupts autograd (LibTorch 2 refuses an in-place
// write into a custom Function's view output; 1.13 silently gave wrong gradients there: the
// ResNet-50 divergence). So every importer ends with this pass, which rewrites the graph into
// value semantics:
//
//   * `y = op_(x, ...)` becomes `y = op(x, ...)` (the functional overload), and every later read
//     of x, or of a value that only re-reads x's memory (scripted code reads `x` after `x.add_()`),
//     reads y instead. Traced graphs and FX already rebind later reads to y; scripted ones do not.
//   * A write into a module's tensor (a buffer or a parameter: BatchNorm's `num_batches_tracked
//     += 1`) or into an input stays in place: it is state, and the runtime keeps each rank's piece
//     of it. Its sharding rule is the out-of-place rule restricted to output == input 0.
//   * A write through a chain of slices and selects of a tensor that is read later (the
//     attention mask `mask[a:b, c:d] = k` of Swin) becomes the functional op plus scatters
//     (`slice_scatter`, `select_scatter`) writing the new view back into a new version of the
//     base, which later reads of the base read: torch's own functionalization. Every write through
//     every alias is replayed in order: a second write through the same view (`v.mul_(2);
//     v.add_(100.)`, or the chain `v.mul_(2).add_(100.)`) writes back the first one's result, and
//     another view of the base read afterwards (taken by ops that always return views: slice,
//     select, view, transpose, ...) is recomputed from the base's new version. A write through
//     another kind of view (`view`, `transpose`) whose base is read later, or while a value taken
//     by an op that may copy (`reshape`, `contiguous`) is still read, cannot be expressed without
//     aliasing: a clear one-line error names the op and where it is.
//
// What a node's schema says about aliasing comes from a callback, so the pass itself is torch-free
// (the importers pass torchSchemaAliasing, tests a table).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "apc/ir/graph.h"
#include "apc/support/error.h"

namespace apc::frontend {

/// What a node's schema says about aliasing.
struct NodeAliasing {
  /// The op writes its input 0 in place (`Tensor(a!) self`) and returns it.
  bool in_place = false;
  /// For an in-place op: the functional op and overload computing the same value out of place;
  /// empty when there is none.
  std::string functional_op, functional_overload;
  /// Per output: the input it may alias (a view such as `Tensor(a) self -> Tensor(a)`), or -1.
  std::vector<int> output_aliases;
};

using AliasingOf = std::function<NodeAliasing(const ir::Node&)>;

struct FunctionalizeReport {
  int functionalized = 0;  // in-place ops rewritten out of place
  int kept = 0;            // writes into module state or inputs, kept in place
  int scattered = 0;       // of the functionalized: writes through views written back by scatters
};

/// Rewrites the graph's in-place ops as described above. Value ids are kept; node ids too unless
/// scatters were inserted (then nodes after the first one shift).
Expected<FunctionalizeReport> functionalizeInPlace(ir::Graph& g, const AliasingOf& aliasing);

/// The aliasing facts of ATen/prim ops from LibTorch's operator registry (defined in the frontend
/// library, which links LibTorch).
NodeAliasing torchSchemaAliasing(const ir::Node& node);

}  // namespace apc::frontend
