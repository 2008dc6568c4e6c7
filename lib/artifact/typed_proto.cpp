//===- lib/artifact/typed_proto.cpp - Placements, step kinds, reduce ops <-> proto ===//
//
// See apc/artifact/typed_proto.h. The switches over our enums list every value, so a value added
// to one of them without its proto counterpart is a -Wswitch error here.
//
//===----------------------------------------------------------------------===//
#include "apc/artifact/typed_proto.h"

#include <string>

namespace apc::artifact {

proto::ReduceOp toProto(mesh::ReduceOp op) {
  switch (op) {
    case mesh::ReduceOp::kSum:
      return proto::REDUCE_SUM;
    case mesh::ReduceOp::kMax:
      return proto::REDUCE_MAX;
    case mesh::ReduceOp::kMin:
      return proto::REDUCE_MIN;
    case mesh::ReduceOp::kAvg:
      return proto::REDUCE_AVG;
  }
  return proto::REDUCE_OP_UNSET;
}

Expected<mesh::ReduceOp> reduceOpFromProto(proto::ReduceOp op) {
  switch (op) {
    case proto::REDUCE_SUM:
      return mesh::ReduceOp::kSum;
    case proto::REDUCE_MAX:
      return mesh::ReduceOp::kMax;
    case proto::REDUCE_MIN:
      return mesh::ReduceOp::kMin;
    case proto::REDUCE_AVG:
      return mesh::ReduceOp::kAvg;
    case proto::REDUCE_OP_UNSET:
      return parseError("reduce op not set");
    default:  // proto3 keeps values it does not know
      break;
  }
  return parseError("unknown reduce op " + std::to_string(static_cast<int>(op)));
}

proto::StepKind toProto(layout::StepKind kind) {
  switch (kind) {
    case layout::StepKind::kAllGather:
      return proto::ALL_GATHER;
    case layout::StepKind::kAllReduce:
      return proto::ALL_REDUCE;
    case layout::StepKind::kReduceScatter:
      return proto::REDUCE_SCATTER;
    case layout::StepKind::kLocalSlice:
      return proto::LOCAL_SLICE;
    case layout::StepKind::kAllToAll:
      return proto::ALL_TO_ALL;
  }
  return proto::STEP_KIND_UNSET;
}

Expected<layout::StepKind> stepKindFromProto(proto::StepKind kind) {
  switch (kind) {
    case proto::ALL_GATHER:
      return layout::StepKind::kAllGather;
    case proto::ALL_REDUCE:
      return layout::StepKind::kAllReduce;
    case proto::REDUCE_SCATTER:
      return layout::StepKind::kReduceScatter;
    case proto::LOCAL_SLICE:
      return layout::StepKind::kLocalSlice;
    case proto::ALL_TO_ALL:
      return layout::StepKind::kAllToAll;
    case proto::STEP_KIND_UNSET:
      return parseError("redistribution step kind not set");
    default:
      break;
  }
  return parseError("unknown redistribution step kind " + std::to_string(static_cast<int>(kind)));
}

void toProto(const mesh::PlacementTuple& t, PlacementField* out) {
  for (const mesh::Placement& p : t) {
    proto::Placement* q = out->Add();
    switch (p.kind()) {
      case mesh::Placement::Kind::kReplicate:
        q->set_kind(proto::Placement::REPLICATE);
        break;
      case mesh::Placement::Kind::kShard:
        q->set_kind(proto::Placement::SHARD);
        q->set_dim(p.dim());
        break;
      case mesh::Placement::Kind::kPartial:
        q->set_kind(proto::Placement::PARTIAL);
        q->set_reduce_op(toProto(p.reduceOp()));
        break;
    }
  }
}

Expected<mesh::PlacementTuple> placementFromProto(const PlacementField& p) {
  mesh::PlacementTuple out;
  for (int i = 0; i < p.size(); ++i) {
    const proto::Placement& q = p.Get(i);
    const std::string where = "placement entry " + std::to_string(i) + ": ";
    switch (q.kind()) {
      case proto::Placement::REPLICATE:
        out.push_back(mesh::Placement::replicate());
        continue;
      case proto::Placement::SHARD:
        if (q.dim() < 0) return parseError(where + "shard dim " + std::to_string(q.dim()));
        out.push_back(mesh::Placement::shard(q.dim()));
        continue;
      case proto::Placement::PARTIAL: {
        auto op = reduceOpFromProto(q.reduce_op());
        if (!op.ok()) return parseError(where + "partial: " + op.error().message());
        out.push_back(mesh::Placement::partial(*op));
        continue;
      }
      case proto::Placement::KIND_UNSET:
        return parseError(where + "kind not set");
      default:
        break;
    }
    return parseError(where + "unknown kind " + std::to_string(static_cast<int>(q.kind())));
  }
  return out;
}

namespace {

Status checkTuple(const PlacementField& f, size_t mesh_ndim, const std::string& what) {
  auto t = placementFromProto(f);
  if (!t.ok()) return parseError(what + ": " + t.error().message());
  if (t->size() != mesh_ndim)
    return parseError(what + ": " + std::to_string(t->size()) + " placements on a " +
                      std::to_string(mesh_ndim) + "-dim mesh");
  return Status::success();
}

Status checkSteps(const google::protobuf::RepeatedPtrField<proto::RedistStep>& steps,
                  size_t mesh_ndim, const std::string& what) {
  for (int i = 0; i < steps.size(); ++i) {
    const proto::RedistStep& s = steps.Get(i);
    const std::string step = what + " step " + std::to_string(i);
    auto kind = stepKindFromProto(s.kind());
    if (!kind.ok()) return parseError(step + ": " + kind.error().message());
    if (s.mesh_dim() >= mesh_ndim)
      return parseError(step + ": mesh dim " + std::to_string(s.mesh_dim()) + " on a " +
                        std::to_string(mesh_ndim) + "-dim mesh");
    if (*kind == layout::StepKind::kAllReduce || *kind == layout::StepKind::kReduceScatter) {
      auto op = reduceOpFromProto(s.reduce_op());
      if (!op.ok()) return parseError(step + ": " + op.error().message());
    }
    APC_RETURN_IF_ERROR(checkTuple(s.before(), mesh_ndim, step + " (before)"));
    APC_RETURN_IF_ERROR(checkTuple(s.after(), mesh_ndim, step + " (after)"));
  }
  return Status::success();
}

}  // namespace

Status checkProgramEnums(const proto::Program& p) {
  const size_t ndim = static_cast<size_t>(p.mesh_shape_size());
  for (const auto* list : {&p.inputs(), &p.parameters(), &p.buffers(), &p.outputs()})
    for (const proto::ProgramTensor& t : *list)
      // Every tensor entry has a dtype; a non-tensor output leaf has only a name and a value.
      if (!t.dtype().empty())
        APC_RETURN_IF_ERROR(checkTuple(t.placement(), ndim, "tensor '" + t.name() + "'"));
  for (const proto::Redistribution& r : p.redistributions()) {
    const std::string edge = "edge '" + r.edge() + "'";
    APC_RETURN_IF_ERROR(checkTuple(r.from(), ndim, edge + " (from)"));
    APC_RETURN_IF_ERROR(checkTuple(r.to(), ndim, edge + " (to)"));
    APC_RETURN_IF_ERROR(checkSteps(r.forward(), ndim, edge + " forward"));
    if (r.requires_grad()) {
      APC_RETURN_IF_ERROR(checkTuple(r.grad_from(), ndim, edge + " (gradient from)"));
      APC_RETURN_IF_ERROR(checkTuple(r.grad_to(), ndim, edge + " (gradient to)"));
    }
    APC_RETURN_IF_ERROR(checkSteps(r.backward(), ndim, edge + " backward"));
    bool all_reduces = r.backward_size() >= 1;
    for (const proto::RedistStep& s : r.backward())
      all_reduces = all_reduces && s.kind() == proto::ALL_REDUCE &&
                    s.reduce_op() == r.backward(0).reduce_op();
    if (r.bucketed_gradient() &&
        (!r.requires_grad() || r.regather() || r.forward_size() != 0 || !all_reduces))
      return parseError(edge +
                        ": marked bucketed_gradient, but a bucketed gradient's edge moves nothing "
                        "forward and reduces its gradient with all-reduces of one op only");
  }
  return Status::success();
}

}  // namespace apc::artifact
