//===- apc/mesh/placement.h - Shard / Replicate / Partial placements -------===//
//
// A Placement says how a tensor is laid out along ONE mesh dimension:
//   S(d)       shard tensor dim d (torch.chunk semantics: ceil-sized pieces, the last may be short)
//   R          replicate
//   P / P(op)  partial: every rank holds a summand (op sum by default; max, min, avg where needed)
// A PlacementTuple has one entry per mesh dimension. Text forms, all parsed: `S(0)R` (the printed
// form), `S(0),R` and `[S(0), R]`.
//
// The notation every printer uses (plan JSON "strategy", `apc plan` summary and --verbose log,
// `apc explain`, `apc diff`, the dot/SVG pictures, the C++ API's printers), README "Reading a
// plan":
//   a tensor's placement  its mesh-dim placements concatenated, mesh dim 0 first: `S(0)S(1)`,
//                         `RR`, `PR` (a partial sum), `P(max)R`
//                         (toCompactString)
//   an op's strategy      its tensor inputs' placements joined by `,`, then ` -> `, then its
//                         tensor outputs' joined by `,`: `S(0)R,RS(1) -> S(0)S(1)`
//                         (toSignatureString; Strategy::toString)
// On a mesh of n dims every placement has exactly n entries, so a `,` always separates two tensors.
// toString (`S(0),R`) is kept for machine forms only (checkpoint metadata); messages, errors
// included, use the compact form.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "apc/support/error.h"

namespace apc::mesh {

enum class ReduceOp : uint8_t { kSum, kMax, kMin, kAvg };
const char* reduceOpName(ReduceOp op);  // "sum", "max", ...

class Placement {
 public:
  enum class Kind : uint8_t { kReplicate, kShard, kPartial };

  static Placement replicate() { return Placement(Kind::kReplicate, 0, ReduceOp::kSum); }
  static Placement shard(int dim) { return Placement(Kind::kShard, dim, ReduceOp::kSum); }
  static Placement partial(ReduceOp op = ReduceOp::kSum) {
    return Placement(Kind::kPartial, 0, op);
  }

  Kind kind() const { return kind_; }
  bool isReplicate() const { return kind_ == Kind::kReplicate; }
  bool isShard() const { return kind_ == Kind::kShard; }
  bool isShard(int dim) const { return kind_ == Kind::kShard && dim_ == dim; }
  bool isPartial() const { return kind_ == Kind::kPartial; }
  /// The sharded tensor dim (only for kShard).
  int dim() const { return dim_; }
  ReduceOp reduceOp() const { return op_; }

  /// "S(0)", "R", "P", "P(max)".
  std::string toString() const;
  /// Parses one placement: "S(1)", "Shard(1)", "R", "Replicate", "P", "P(max)", "Partial".
  static Expected<Placement> parse(std::string_view text);

  bool operator==(const Placement& o) const {
    return kind_ == o.kind_ && (kind_ != Kind::kShard || dim_ == o.dim_) &&
           (kind_ != Kind::kPartial || op_ == o.op_);
  }
  /// A total order for deterministic containers.
  bool operator<(const Placement& o) const;

 private:
  Placement(Kind k, int dim, ReduceOp op) : kind_(k), dim_(dim), op_(op) {}
  Kind kind_;
  int dim_;
  ReduceOp op_;
};

/// One placement per mesh dimension.
using PlacementTuple = std::vector<Placement>;

/// "S(0),R" (machine forms; printers use toCompactString).
std::string toString(const PlacementTuple& t);
/// "S(0)R": how every printer writes a tensor's placement (see the notation above).
std::string toCompactString(const PlacementTuple& t);
/// "S(0)R,RS(1) -> S(0)S(1)": how every printer writes an op's strategy (see the notation above);
/// entries without a tensor (nullopt) are left out.
std::string toSignatureString(const std::vector<std::optional<PlacementTuple>>& inputs,
                              const std::vector<std::optional<PlacementTuple>>& outputs);
/// Parses "S(0)R", "S(0),R" or "[S(0), R]"; each entry as in Placement::parse.
Expected<PlacementTuple> parsePlacementTuple(std::string_view text);
/// All-replicate tuple of the given length.
PlacementTuple replicated(size_t mesh_ndim);
/// Checks that every shard dim is in [0, tensor_rank): an error names the placement and the rank.
Status checkPlacementTuple(const PlacementTuple& t, int64_t tensor_rank, size_t mesh_ndim);

/// Number of pieces the tensor dim `dim` is cut into by the tuple (product of mesh sizes of the
/// mesh dims that shard it).
int64_t shardFactor(const PlacementTuple& t, const std::vector<int64_t>& mesh_shape, int dim);

/// Size of piece `index` of a dim of size `size` split into `pieces` with torch.chunk semantics:
/// chunk = ceil(size / pieces); piece i gets clamp(size - i*chunk, 0, chunk).
int64_t chunkSize(int64_t size, int64_t pieces, int64_t index);
/// Offset of piece `index` (i*chunk clamped to size).
int64_t chunkOffset(int64_t size, int64_t pieces, int64_t index);
/// Whether cutting a dim of `size` by the piece counts `pieces`, outer first (each count cuts
/// every piece the outer ones left, by chunkSize, as apc/layout/layout.h nests them), leaves every
/// piece non-empty. A count of 1 does not cut. torch.chunk leaves empty pieces even when size >=
/// pieces (4 over 3: 2, 2, 0). The one home of the rule: strategy enumeration offers no shard
/// that breaks it, and the classic baselines (apc/solver/baselines.h) cut no dim that would.
bool cutsIntoNonEmptyPieces(int64_t size, const std::vector<int64_t>& pieces);

}  // namespace apc::mesh
