//===- apc/cost/edge.h - What moving a tensor along an edge means ---------===//
//
// One definition of an edge's semantics, used by the planner, which prices it
// (solver::buildGraphProblem), and by lowering, which emits it (lower::lowerPlan). An edge
// carries the value a producer placed at `from` to a consumer that reads it at `to`:
// - Forward: the tensor is redistributed from -> to (cost::planRedistribution), in the dtype the
//   program computes it in (Precision::compute: param_dtype under mixed precision).
// - Backward, when the tensor requires grad: the consumer leaves its gradient at
//   gradientPlacement(to, op_split), which is redistributed back to partialAsReplicate(from), the
//   producer's output placement with its pending sums done (the producer's own backward consumes
//   a gradient that is whole on every mesh dim where its output was Partial). An activation's
//   gradient travels in the compute dtype, a parameter's in Precision::reduceDtype (FSDP2's
//   reduce_dtype).
// - A parameter's redistributed copy is not kept from forward to backward (regathered): backward
//   redoes the forward redistribution, as FSDP re-gathers after resharding, so the memory that
//   sharding saves stays saved. The planner counts that forward twice; lowering marks it.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <optional>
#include <vector>

#include "apc/cost/redistribute.h"
#include "apc/ir/graph.h"
#include "apc/ir/types.h"
#include "apc/mesh/placement.h"
#include "apc/spec/spec.h"

namespace apc::cost {

/// `t` with every Partial mesh dim made Replicate: where a gradient lands on a producer's output
/// (and where a Partial output leaf ends: its sums done).
mesh::PlacementTuple partialAsReplicate(mesh::PlacementTuple t);

/// Per mesh dim, whether an op placed so splits its work there: some tensor input or output of it
/// is not Replicate on that dim. (Absent entries are non-tensor arguments.)
std::vector<bool> opSplit(const std::vector<std::optional<mesh::PlacementTuple>>& inputs,
                          const std::vector<std::optional<mesh::PlacementTuple>>& outputs,
                          size_t mesh_ndim);

/// The placement of the gradient an op leaves for an input it read at `input`: Shard stays Shard;
/// Partial becomes Replicate (the input's pending sum is linear, every rank gets the whole
/// gradient); Replicate becomes Partial on a mesh dim where the op splits its work (each rank's
/// piece of the op contributes a part of the gradient), else stays Replicate.
mesh::PlacementTuple gradientPlacement(const mesh::PlacementTuple& input,
                                       const std::vector<bool>& op_split);

/// The dtypes tensors travel in under a mixed precision policy (see apc/solver/graph_problem.h).
class Precision {
 public:
  explicit Precision(const spec::MixedPrecision& mp);
  /// The tensor as the program computes it: a floating tensor in param_dtype, when set.
  ir::TensorMeta compute(ir::TensorMeta t) const;
  /// The dtype a parameter stored as `stored` has its gradient reduced in: reduce_dtype, else
  /// param_dtype, else its compute dtype.
  ir::DType reduceDtype(const ir::TensorMeta& stored) const;

 private:
  std::optional<ir::DType> param_;
  std::optional<ir::DType> reduce_;
};

/// The graph as it computes under a mixed precision policy: the tensor metadata of every value
/// of floating dtype (parameters, floating inputs, activations, Tensor[] elements) set to
/// param_dtype, floating buffers included: lowering casts them like parameters (module.to's
/// semantics; rope tables in f32 would promote bf16 activations otherwise). Node and value
/// ids are unchanged, so strategies enumerated on it apply to `g`. Returns a copy of `g` when the
/// policy has no param_dtype.
ir::Graph computeGraph(const ir::Graph& g, const spec::MixedPrecision& mp);

/// Whether a value made by `producer` is regathered in backward instead of kept (a parameter).
bool regatheredInBackward(const ir::Node& producer);

/// The runtime's first and smallest gradient bucket (artifact::kFirstGradBucketBytes; lowering
/// asserts they agree).
inline constexpr double kGradBucketPricingBytes = 1024.0 * 1024.0;

/// The bucket the bucketed gradients of `g` are priced in: the runtime's first bucket, or, where
/// all of the model's parameter gradients take fewer bytes, their total (one bucket then holds
/// them all).
double gradientBucketPricingBytes(const ir::Graph& g);

/// Gradient buckets (the runtime's ParallelModuleOptions::grad_bucket_bytes): a parameter's edge
/// that moves nothing forward (from == to) and whose gradient's way back `grad_plan` is exactly
/// one all-reduce has that all-reduce batched with the others of its mesh dim in a flat bucket,
/// which pays the collective's latency once. Such an edge's backward is priced at its share of a
/// bucket of S = `bucket_bytes` (gradientBucketPricingBytes): for n bytes below S, n/S of what
/// the bucket adds to the latency, (collectiveUs(S) - collectiveUs(0)) n / S; from S up,
/// collectiveUs(n) - collectiveUs(0) (never below 0). Priced alone at its own size instead, a
/// small gradient would pay the steep small-message part of a measured table (on CPU Gloo, 4 KiB
/// to 1 MiB cost 2-3 times the latency) once per gradient, which its bucket pays once. The
/// planner and lowering price alike; nullopt for any other gradient plan.
/// Whether the runtime buckets a gradient of plan `grad_plan` (a parameter read where it lies): its
/// plan is one all-reduce, or one on each of several mesh dims with one op (a replicated parameter
/// of a 2-d data-parallel mesh), which a bucket runs once per mesh dim. bucketedGradientUs prices
/// only the first; the planner prices the others whole (an upper bound of what runs).
bool bucketsGradient(const RedistributionPlan& grad_plan);

std::optional<double> bucketedGradientUs(const RedistributionPlan& grad_plan,
                                         const CostModel& model, double bucket_bytes);

}  // namespace apc::cost
