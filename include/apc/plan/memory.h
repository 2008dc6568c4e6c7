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
// FSDP's grouped gathers (GatherGroup, given by lowering: the runtime's groups) follow the
// runtime's schedule in place of each parameter's own: a group's members gathered together, the
// next gather unit's flat buffer in flight, the group re-gathered together in backward, its
// gradients held until the group's one reduction is issued and its flat buffer until the end of
// backward (see placeGroups in memory.cpp). Without groups every gathered parameter is gathered and
// reduced on its own (a plan's estimates pass the groups: lower::predictRuntimeMemory).
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

/// One of the runtime's grouped FSDP parameter gathers (artifact::paramGatherGroups, which reads
/// them off the lowered program: lower::predictRuntimeMemory for a plan's estimates, lowering's
/// prediction for the artifact's; the plan alone does not know them). The runtime (ParallelModule,
/// with its default overlap and prefetch of one unit) gathers the members with ONE all-gather of a
/// flat buffer at the first member's reader, issued ahead at the previous gather unit's; it
/// re-gathers them together in backward when backward first needs one (and issues the previous
/// group's re-gather then); and it reduces their gradients with ONE reduce-scatter (or all-reduce)
/// of a flat buffer, issued when the last member's gradient arrives and waited at the end of
/// backward.
struct GatherGroup {
  std::vector<std::string> params;  // the members' parameter names, in program order
  int64_t gather_bytes = 0;         // the all-gather's flat output: every rank's padded slots
  int64_t ranks = 1;         // the ranks it gathers from (its flat input: gather_bytes / ranks)
  int64_t reduce_bytes = 0;  // the gradients' flat buffer (padded slots); 0: not reduced together
  bool regather = false;     // gathered again in backward (freed after the forward's readers)
};

/// The memory of one rank of `g` under the placements of `p` (its nodes and parameters) with
/// optimizer `optimizer`. `g` is the planned graph (plannedGraph(p)). `groups`: the runtime's
/// gather groups (none: every parameter gathered and reduced on its own). Errors: an unknown
/// optimizer, a plan whose nodes do not belong to `g`.
Expected<MemoryEstimate> predictMemory(const ir::Graph& g, const Plan& p,
                                       std::string_view optimizer,
                                       const std::vector<GatherGroup>& groups = {});

/// predictMemory under every optimizer of memoryOptimizers(), in that order (one pass).
Expected<std::vector<MemoryEstimate>> predictMemoryAll(const ir::Graph& g, const Plan& p,
                                                       const std::vector<GatherGroup>& groups = {});

}  // namespace apc::plan
