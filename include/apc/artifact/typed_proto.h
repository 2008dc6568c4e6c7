//===- apc/artifact/typed_proto.h - Placements, step kinds, reduce ops <-> proto ===//
//
// The program format carries placements, redistribution step kinds and reduce ops as protobuf
// enums (proto/apc.proto), not text. These are the only conversions between them and the typed
// forms (mesh::Placement, layout::StepKind, mesh::ReduceOp): lib/lower writes with the toProto
// calls, the runtime and `apc inspect` read with the *FromProto calls. Reading checks every value
// (a known enum value, set where it is needed, a shard dim >= 0) and fails with one line naming
// it, so that a damaged or foreign program is refused at load, not in a collective.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "apc.pb.h"
#include "apc/layout/layout.h"
#include "apc/mesh/placement.h"
#include "apc/support/error.h"

namespace apc::artifact {

using PlacementField = google::protobuf::RepeatedPtrField<proto::Placement>;

/// Appends one proto::Placement per mesh dim of `t` to `out`.
void toProto(const mesh::PlacementTuple& t, PlacementField* out);
proto::StepKind toProto(layout::StepKind kind);
proto::ReduceOp toProto(mesh::ReduceOp op);

/// The typed tuple; an unset or unknown kind, a negative shard dim or a partial without a known
/// reduce op is a kParse error naming the entry.
Expected<mesh::PlacementTuple> placementFromProto(const PlacementField& p);
/// An unset or unknown kind is a kParse error.
Expected<layout::StepKind> stepKindFromProto(proto::StepKind kind);
/// An unset or unknown op is a kParse error.
Expected<mesh::ReduceOp> reduceOpFromProto(proto::ReduceOp op);

/// Checks every typed field of a program: each placement converts and has one entry per mesh
/// dim, each step's kind converts, its mesh dim is on the mesh and a reducing step has its op.
/// readProgram runs it, so the runtime's conversions of a program it loaded cannot fail. The
/// error names the tensor or the redistribution's edge.
Status checkProgramEnums(const proto::Program& p);

}  // namespace apc::artifact
