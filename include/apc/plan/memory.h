//===- apc/plan/memory.h - Predicted memory per rank over a training step --===//
//
// What one rank holds over a training step under a plan: the parameters' local shards, buffers and
// the forward's inputs (persistent), the optimizer's state (SGD none, momentum one buffer, AdamW
// two, each of the parameter's local shard in its stored dtype, as lib/runtime/optimizer.cpp
// keeps them), the parameters' gradients (local shards, stored dtype), the activations autograd
// saves for backward, and the transient values: live intermediates, redistributed copies of
// inputs, gathered parameters, gradients in flight. Local sizes are the largest piece of each
// value under the plan's placements (layout::maxLocalSizes); floating activations are in the
// mixed precision policy's param_dtype (cost::computeGraph).
//
// The timeline follows the runtime (lib/runtime: the interpreter frees a value after its last use;
// parameter copies that a redistribution made are freed after use and gathered again in backward;
// gradients are set to none after each optimizer step):
//   forward, node by node: persistent + optimizer state + what earlier nodes saved + the values
//     still to be used + this node's redistributed inputs and outputs;
//   backward, node by node in reverse: persistent + optimizer state + what this node and earlier
//     ones saved + the parameter gradients made so far + the activation gradients pending (values
//     whose consumers have run backward and producer has not) + this node's input gradients;
//   the optimizer step: persistent + optimizer state + every gradient + one temporary of the
//     largest local parameter (AdamW's denominator, SGD's scaled gradient).
// The peak is the largest of these. Which tensors an op saves is the table in memory.cpp (ATen's
// derivatives.yaml, simplified: an input is saved when its partner of a product takes a gradient,
// an elementwise function saves its input or its output); an op the table does not know saves all
// of its tensor inputs. Tensors a view of a value makes share its storage.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "apc/ir/graph.h"
#include "apc/support/error.h"

namespace apc::plan {

struct Plan;
struct MemoryEstimate;

/// The runtime's default gradient bucket (artifact::kDefaultGradBucketBytes; lowering checks they
/// agree): the memory model holds one bucket at the end of backward.
inline constexpr int64_t kGradBucketBytes = int64_t{25} << 20;

/// The optimizers the memory model knows: "sgd" (no state), "momentum" (SGD with momentum: one
/// buffer per parameter) and "adamw" (two).
const std::vector<std::string>& memoryOptimizers();

/// Buffers of optimizer state per parameter byte: 0, 1 or 2. Unknown names are an error.
Expected<int> optimizerStateFactor(std::string_view optimizer);

/// The memory of one rank of `g` under the placements of `p` (its nodes and parameters) with
/// optimizer `optimizer`. `g` is the planned graph (plannedGraph(p)). Errors: an unknown
/// optimizer, a plan whose nodes do not belong to `g`.
Expected<MemoryEstimate> predictMemory(const ir::Graph& g, const Plan& p,
                                       std::string_view optimizer);

/// predictMemory under every optimizer of memoryOptimizers(), in that order (one pass).
Expected<std::vector<MemoryEstimate>> predictMemoryAll(const ir::Graph& g, const Plan& p);

}  // namespace apc::plan
