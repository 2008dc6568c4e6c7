//===- apc/lower/lower.h - Per-rank programs from a graph and a plan -------===//
//
// Lowering applies a plan to the imported graph and writes one proto::Program per rank
// (proto/apc.proto, "Per-rank programs"): the graph with every value at this rank's LOCAL shape
// (layout::localPiece: nested torch.chunk pieces, uneven and empty pieces allowed), op constants
// rewritten for the local pieces (apc/lower/local_rewrite.h), and a `redistribute` node on every
// edge whose forward placement or gradient placement changes.
//
// Edges. For a tensor edge producer value u (placed `src`) -> consumer input i (required `dst` by
// the consumer's chosen strategy), with the gradient convention of apc.proto:
//   grad_from[m] = R     where dst[m] is P (the gradient of a partial value is replicated),
//                = P     where dst[m] is R and the consumer op is sharded or partial on mesh dim m
//                        (some tensor input or output of its strategy is S or P there),
//                = dst[m] otherwise;
//   grad_to      = src with P replaced by R.
// The edge gets a redistribute node when src != dst, or when u takes a gradient (floating dtype,
// requires_grad) and grad_from != grad_to. Its forward steps are cost::planRedistribution(src,
// dst) and its backward steps cost::planRedistribution(grad_from, grad_to): the same planner that
// priced the plan, so the priced collectives are the executed ones (the backward is exact where
// the priced transposed plan was an upper bound). Edges into the same value with the same
// (dst, grad_from) share one node, placed before the first consumer. Tensor lists (split/chunk
// outputs) must keep their placement (their rules follow the producer); a change is kUnsupported.
//
// Outputs. An output leaf ends in the placement the spec requires for it (spec.outputs), or its
// producer's placement when free, with P replaced by R: Partial outputs are reduced by a final
// redistribute node (all-reduce / reduce-scatter). Program.outputs lists the leaves in OutputTree
// order, named by their path ("output" for a single leaf, "0", "1.logits" inside structures).
//
// Shape arithmetic. Op nodes whose outputs are all non-tensor values with a constant known at
// import time (aten::size, prim::ListConstruct of sizes, int arithmetic) are dropped: their
// consumers read the constants, with GLOBAL values (the program's semantics is the global
// program's), except the arguments rewritten by local_rewrite.h. Then nodes none of whose
// outputs is used (and that write no input: names ending in '_') are removed. Shape nodes whose
// values are unknown are kept and run on LOCAL tensors (no sample model has one).
//
// Devices. Device constants are kept as the importer recorded them ("cpu", or "meta" for devices
// read off a tensor): the runtime maps them to its own device.
//
// Mixed precision (spec.mixed_precision, recorded in Program.mixed_precision). With param_dtype
// set, every floating parameter, buffer and forward input is held in its model dtype (the leaf
// node's value; ProgramTensor.storage_dtype) and cast at once by an `aten::to.dtype` node
// (ProgramTensor.dtype = param_dtype), before any redistribute node: parameters are all-gathered
// in param_dtype, and autograd casts their gradients back to the storage dtype. Buffers are cast
// as `module.to(param_dtype)` casts them (an f32 rope table times a bf16 activation would give
// f32 and fail at the next bf16 matmul); the single-process reference of a mixed-precision run
// is the module cast whole to param_dtype. Values the model makes itself (factory ops without a
// dtype, `.float()`, `type_as`) keep what its code asks for, as in eager PyTorch. Floating values
// of the program are recorded in param_dtype (an approximation: ops with an explicit dtype
// argument keep producing what they ask for at run time). Output leaves are cast to output_dtype,
// or back to the model's dtype, by `aten::to.dtype` nodes at the end (their source_node is -1).
// reduce_dtype applies to parameters' gradients (FSDP2's MixedPrecisionPolicy, and what the
// planner prices): the redistribution of a parameter's edge records it (Redistribution.
// reduce_dtype) and the runtime casts the gradient to it before each reducing backward step
// (all-reduce, reduce-scatter) and back after it; activations' gradients are reduced in their own
// dtype. Every step's priced_bytes is in the dtype it moves: the program's dtype of the value
// (param_dtype for floating values), reduce_dtype for those reducing steps.
//
// Value metadata. Local values keep the global TensorMeta's dtype and requires_grad; a symbolic
// dim keeps its symbol with the local size as hint.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "apc.pb.h"
#include "apc/artifact/artifact.h"  // kProgramFormatVersion
#include "apc/ir/graph.h"
#include "apc/plan/memory.h"
#include "apc/plan/plan.h"
#include "apc/support/error.h"

namespace apc::lower {

/// The op name of redistribute nodes in the program's Graph; their Node.kind is "redistribute".
inline constexpr const char* kRedistributeOp = "apc::redistribute";

struct LowerOptions {
  /// Drop op nodes computing known non-tensor values and the nodes left without users.
  bool drop_shape_arithmetic = true;
  /// Record Program.prediction (the plan's step, memory and the replayed schedule); off: the
  /// program alone (predictRuntimeMemory reads only its gather groups).
  bool predict = true;
  /// Keep the gradient of a replicated computation partial back to its parameters (see
  /// decidePartialGradients in lower.cpp): off, every replicated value read by a data-split op
  /// has its gradient all-reduced where it is read.
  bool partial_gradients = true;
};

/// The program of one rank (0 <= rank < world size of plan.spec.mesh). `g` is the graph the plan
/// was made from (imported again from plan.model with the plan's inputs); errors when the plan
/// does not match it (node count, kinds), when a redistribution is impossible, or when an op's
/// constants cannot be rewritten. The error names the node.
Expected<proto::Program> lowerRank(const ir::Graph& g, const plan::Plan& p, int64_t rank,
                                   const LowerOptions& options = {});

/// lowerRank for every rank in rank order, each program handed to `sink` (then dropped) as soon as
/// it is made: memory for one program at a time (apc lower and apc plan --artifact write each to
/// disk). Stops at the first error of lowering or of `sink`.
Status lowerEachRank(const ir::Graph& g, const plan::Plan& p,
                     const std::function<Status(const proto::Program&)>& sink,
                     const LowerOptions& options = {});

/// The gather groups of a lowered program (artifact::paramGatherGroups, the runtime's) as the
/// memory model takes them (plan::GatherGroup).
std::vector<plan::GatherGroup> memoryGatherGroups(const proto::Program& program);

/// The plan's memory per rank as the runtime holds it: plan::predictMemoryAll with the gather
/// groups the runtime makes of rank 0's program (memoryGatherGroups), which the plan alone does
/// not know; the groups' members are gathered, held and reduced together (plan/memory.h). A plan
/// that redistributes fewer than two parameters has no group and is not lowered; a plan that
/// cannot be lowered (its lowering reports the error when the artifact is written) keeps the
/// estimate without groups. makePlan and checkpointing record this estimate in Plan.memory.
Expected<std::vector<plan::MemoryEstimate>> predictRuntimeMemory(const ir::Graph& g,
                                                                 const plan::Plan& p);

/// lowerRank for every rank, in rank order.
Expected<std::vector<proto::Program>> lowerPlan(const ir::Graph& g, const plan::Plan& p,
                                                const LowerOptions& options = {});

}  // namespace apc::lower
