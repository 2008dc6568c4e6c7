//===- lib/cost/edge.cpp - Edge semantics ---------------------------------===//
//
// The rules of apc/cost/edge.h.
//
//===----------------------------------------------------------------------===//
#include "apc/cost/edge.h"

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

Precision::Precision(const mesh::MixedPrecision& mp)
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

}  // namespace apc::cost
