//===- apc/runtime/op_collective.h - Running an op's local graph -----------===//
//
// A program node with a proto::OpCollective runs as its local graph (apc/ir/op_collective.h): the
// rank's computation of the node as plain ops, around all-reduce nodes for an op with an internal
// collective, or none (a local rewrite's graph, such as a vocab-parallel embedding's masked
// lookup), which the op's registry entry wrote at lowering. This runner knows no op: it feeds the
// node's arguments to the graph's input nodes, runs its ops through an Interpreter and each
// all-reduce node through the caller's function (ParallelModule: a sum all-reduce over the
// recorded mesh dims, autograd-aware; the strategy validator: a simulation across ranks). Autograd
// records the graph's ops as any others: gradients flow to the node's arguments through them.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/ivalue.h>

#include "apc/ir/graph.h"
#include "apc/runtime/interpreter.h"
#include "apc/support/error.h"

namespace apc::runtime {

class OpCollectiveRunner {
 public:
  /// The all-reduce of the k-th all-reduce node of the local graph (k in node order) on `t`
  /// (never called for a graph without all-reduce nodes).
  using AllReduceFn = std::function<at::Tensor(size_t k, const at::Tensor& t)>;

  /// Prepares `local` for a node with `num_inputs` inputs and `num_outputs` outputs: checks its
  /// form (ir::checkLocalGraph) and resolves its ops. Errors say what is wrong, on one line.
  static Expected<OpCollectiveRunner> create(ir::Graph local, size_t num_inputs, size_t num_outputs,
                                             const InterpreterOptions& options = {});

  /// The node's outputs for its arguments `args` (one per node input). Exceptions propagate (the
  /// caller is an external node's callback).
  std::vector<c10::IValue> run(const std::vector<c10::IValue>& args,
                               const AllReduceFn& all_reduce) const;

  /// How many all-reduce nodes the local graph has.
  size_t numAllReduces() const { return num_all_reduces_; }
  const ir::Graph& graph() const { return interp_->graph(); }

 private:
  std::shared_ptr<const Interpreter> interp_;
  std::vector<int> arg_of_node_;         // per local node: its argument index (input nodes), -1
  std::vector<int> all_reduce_of_node_;  // per local node: its all-reduce index, -1
  size_t num_all_reduces_ = 0;
};

}  // namespace apc::runtime
