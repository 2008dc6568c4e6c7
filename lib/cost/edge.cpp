//===- lib/cost/edge.cpp - Edge semantics ---------------------------------===//
//
// The rules of apc/cost/edge.h.
//
//===----------------------------------------------------------------------===//
#include "apc/cost/edge.h"

#include <algorithm>

#include "apc/cost/cost_model.h"

namespace apc::cost {

using mesh::Placement;
using mesh::PlacementTuple;

PlacementTuple partialAsReplicate(PlacementTuple t) {
  for (Placement& p : t)
    if (p.isPartial()) p = Placement::replicate();
  return t;
}

std::vector<bool> opSplit(const std::vector<std::optional<PlacementTuple>>& inputs,
                          const std::vector<std::optional<PlacementTuple>>& outputs,
                          size_t mesh_ndim) {
  std::vector<bool> split(mesh_ndim, false);
  for (const auto* list : {&inputs, &outputs})
    for (const auto& t : *list)
      if (t)
        for (size_t d = 0; d < t->size() && d < mesh_ndim; ++d)
          if (!(*t)[d].isReplicate()) split[d] = true;
  return split;
}

PlacementTuple gradientPlacement(const PlacementTuple& input, const std::vector<bool>& op_split) {
  PlacementTuple g = input;
  for (size_t d = 0; d < input.size(); ++d) {
    if (input[d].isPartial())
      g[d] = Placement::replicate();
    else if (input[d].isReplicate() && d < op_split.size() && op_split[d])
      g[d] = Placement::partial();
  }
  return g;
}

Precision::Precision(const spec::MixedPrecision& mp)
    : param_(mp.param_dtype), reduce_(mp.reduce_dtype ? mp.reduce_dtype : mp.param_dtype) {}

ir::TensorMeta Precision::compute(ir::TensorMeta t) const {
  if (param_ && ir::isFloating(t.dtype)) t.dtype = *param_;
  return t;
}

ir::DType Precision::reduceDtype(const ir::TensorMeta& stored) const {
  return reduce_ && ir::isFloating(stored.dtype) ? *reduce_ : compute(stored).dtype;
}

bool regatheredInBackward(const ir::Node& producer) {
  return producer.kind == ir::NodeKind::kParameter;
}

double gradientBucketPricingBytes(const ir::Graph& g) {
  double total = 0;
  for (ir::NodeId id : g.nodesOfKind(ir::NodeKind::kParameter))
    for (ir::ValueId v : g.node(id).outputs)
      if (const auto& t = g.value(v).tensor; t && t->requires_grad)
        total += static_cast<double>(t->bytes());
  return total > 0 ? std::min(total, kGradBucketPricingBytes) : kGradBucketPricingBytes;
}

bool bucketsGradient(const RedistributionPlan& grad_plan) {
  if (!grad_plan.feasible || grad_plan.steps.empty()) return false;
  for (const RedistributionStep& s : grad_plan.steps)
    if (s.kind != StepKind::kAllReduce || s.reduce_op != grad_plan.steps.front().reduce_op)
      return false;
  return true;
}

std::optional<double> bucketedGradientUs(const RedistributionPlan& grad_plan,
                                         const CostModel& model, double bucket_bytes) {
  if (!grad_plan.feasible || grad_plan.steps.size() != 1 ||
      grad_plan.steps[0].kind != StepKind::kAllReduce)
    return std::nullopt;
  const RedistributionStep& s = grad_plan.steps[0];
  const double bytes = static_cast<double>(s.full_bytes);
  const double priced_at = std::max(bytes, bucket_bytes);
  const double latency =
      model.collectiveUs(CollectiveKind::kAllReduce, s.mesh_dim, s.group_size, 0.0);
  const double bucket =
      model.collectiveUs(CollectiveKind::kAllReduce, s.mesh_dim, s.group_size, priced_at);
  return std::max(bucket - latency, 0.0) * bytes / priced_at;
}

ir::Graph computeGraph(const ir::Graph& g, const spec::MixedPrecision& mp) {
  ir::Graph out = g;
  if (!mp.param_dtype) return out;
  const Precision p(mp);
  for (uint32_t i = 0; i < out.numValues(); ++i) {
    ir::Value& v = out.value(ir::ValueId{i});
    if (v.tensor) v.tensor = p.compute(*v.tensor);
    for (ir::TensorMeta& e : v.elements) e = p.compute(e);
  }
  return out;
}

}  // namespace apc::cost
