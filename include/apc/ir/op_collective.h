//===- apc/ir/op_collective.h - An op's local computation on a rank -------===//
//
// Some ops do not run on a rank as "the op on the rank's pieces". A node's LOCAL GRAPH is the
// rank's computation of the node as plain ops on the rank's pieces, which the op's registry entry
// writes and lowering records in the rank's program (proto::OpCollective: the node, the mesh dims
// of its all-reduces, the graph); the runtime runs it with its interpreter without knowing the op
// (apc/runtime/op_collective.h). Two hooks of the registry write one:
//   - OpInfo::collective_local, for an op that runs a collective inside itself under some
//     placements (a batch-sharded training batch_norm all-reduces its statistics): plain ops
//     around kOpAllReduce nodes, each a sum all-reduce over the mesh dims that
//     OpInfo::collective gives (its backward: the same all-reduce of the gradient);
//   - OpInfo::local_rewrite, through NodeRewrite::local (apc/strategy/local_rewrite.h), for an op
//     whose rank computation depends on the rank's pieces but needs no collective (a
//     vocab-parallel embedding's masked lookup of the rank's rows): no kOpAllReduce node, no mesh
//     dims.
//
// A local graph's contract:
//   - one input node per input of the node, in order (named "arg0", "arg1", ...): the runtime
//     feeds each the value the node receives (a tensor, a scalar, a list, None), after lowering's
//     local rewrite of its constants;
//   - output leaves: one per output of the node, in order (a tuple tree);
//   - op nodes: ATen / prim ops by (op, overload) as in any graph, and kOpAllReduce nodes (one
//     tensor input, one tensor output; only with mesh dims);
//   - values carry no shapes (tensors are typed kOther): the rank's pieces decide them.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "apc/ir/graph.h"

namespace apc::ir {

/// The op of an all-reduce node in an op's local graph (see the file comment).
inline constexpr std::string_view kOpAllReduce = "apc::op_all_reduce";

/// Builds an op's local graph for `node` of `g`: the input nodes first, then the ops the caller
/// adds, then finish() with the outputs.
class LocalGraphBuilder {
 public:
  LocalGraphBuilder(const Graph& g, const Node& node);
  /// The same without the node's graph (a local rewrite sees the node's constants only): input i
  /// is typed as `inputs[i]`'s constant, or kOther (a tensor, or a value not known) when nullopt.
  LocalGraphBuilder(std::string name, const std::vector<std::optional<Constant>>& inputs,
                    size_t num_outputs);

  /// The value of the node's input i inside the local graph.
  ValueId arg(size_t i) const { return args_.at(i); }
  /// A constant (its type follows the alternative: None, int, float, bool, str, int[], ...).
  ValueId constant(Constant c);
  /// An op node with `inputs`; returns its single output, of type `type` (kOther: a tensor).
  ValueId op(const std::string& qualified_op, std::vector<ValueId> inputs,
             ValueType type = ValueType::kOther);
  /// prim::ListConstruct of `items` (a Tensor[] or an int[]).
  ValueId list(std::vector<ValueId> items, ValueType type);
  /// A kOpAllReduce node: the sum of `v` over the collective's mesh dims.
  ValueId allReduce(ValueId v);
  /// The graph, with one output leaf per entry of `outputs` (the node's outputs, in order); the
  /// builder is spent. Errors: a count other than the node's outputs, or a graph that does not
  /// verify.
  Expected<Graph> finish(const std::vector<ValueId>& outputs);

 private:
  ValueId addValue(ValueType type, NodeId producer, uint32_t output);
  void addInput(ValueType type);
  Graph g_;
  std::vector<ValueId> args_;
  size_t num_outputs_ = 0;
};

/// The checks every reader of a local graph makes (the runtime when it loads a program): one input
/// node per input of a node with `num_inputs` inputs and one output leaf per output, and every
/// kOpAllReduce node with one input and one output. Errors say which.
Status checkLocalGraph(const Graph& local, size_t num_inputs, size_t num_outputs);

}  // namespace apc::ir
