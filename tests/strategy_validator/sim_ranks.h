//===- tests/strategy_validator/sim_ranks.h - Simulated ranks in one process ===//
//
// The strategy validator runs every rank of a device mesh inside one process: a placed tensor is a
// vector of local tensors indexed by rank (rank = row-major index of its mesh coordinate). This
// file holds the three things every check needs, written independently of lib/cost's own step
// executor:
//
// - distribute: cut a full tensor into the local tensors of a placement tuple, the pieces given by
//   layout::localPiece (nested torch.chunk sharding), Partial mesh dims holding random summands
//   whose reduction is the value (sum / avg: linear summands; max / min: the value on one rank,
//   strictly smaller / larger values elsewhere). A summand belongs to a combination of coordinates
//   along the partial mesh dims, so ranks that differ only in Replicate mesh dims hold identical
//   tensors (a bilinear op with inputs [P, R] and [R, P] is exact only then);
// - the collectives of apc/cost/redistribute.h on simulated ranks (all-gather, all-reduce,
//   reduce-scatter, local slice, all-to-all), each a plain function over the groups of one mesh
//   dim;
// - checkLayout: whether the local tensors of every rank are exactly the layout a tuple prescribes
//   for a full reference value (Partial mesh dims are reduced first; every rank is compared with
//   its own piece, so ranks of a Replicate mesh dim must agree).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "apc/cost/redistribute.h"
#include "apc/layout/layout.h"
#include "apc/mesh/device_mesh.h"
#include "apc/mesh/placement.h"
#include "apc/support/error.h"

namespace apc::validator {

/// One tensor on every simulated rank, indexed by rank.
using RankTensors = std::vector<at::Tensor>;

/// Piece `k` of a dim of size `n` cut into `p` pieces with torch.chunk semantics (written here
/// independently of mesh::chunkOffset): chunk = ceil(n / p), piece k = [min(k*chunk, n), +size).
layout::DimPiece chunkOf(int64_t n, int64_t p, int64_t k);

/// The sub-tensor `full[piece_0, piece_1, ...]` (a view).
at::Tensor slicePiece(const at::Tensor& full, const std::vector<layout::DimPiece>& piece);

/// The piece of `full` that the rank at `coordinate` holds under `t` (layout::localPiece), ignoring
/// Partial mesh dims (a view).
at::Tensor localOf(const at::Tensor& full, const mesh::PlacementTuple& t,
                   const mesh::DeviceMesh& mesh, const std::vector<int64_t>& coordinate);

/// Whether the partial ops of a tuple can be reduced in any order (all linear, or all the same).
bool partialsCommute(const mesh::PlacementTuple& t);

/// The local tensors of `full` placed as `t`, contiguous like a runtime's local shards (views of
/// `full` or of fresh summands where already contiguous: copy them before running an op that
/// writes its inputs). Partial mesh dims get random summands drawn from `gen` (see the file
/// comment). Errors: Partial of a bool tensor, partial ops that do not commute.
Expected<RankTensors> distribute(const at::Tensor& full, const mesh::PlacementTuple& t,
                                 const mesh::DeviceMesh& mesh, at::Generator& gen);

// --- simulated collectives, in place on the groups of mesh dim m --------------------------------
// Each operates on every group of ranks that differ only in coordinate m (in coordinate order); k
// below is a rank's coordinate along m and p the group size.

/// S(dim) -> R: every rank gets the concatenation of its group's locals along `dim`.
void allGather(RankTensors& locals, const mesh::DeviceMesh& mesh, size_t m, int64_t dim);
/// P(op) -> R: every rank gets the elementwise reduction of its group's locals.
void allReduce(RankTensors& locals, const mesh::DeviceMesh& mesh, size_t m, mesh::ReduceOp op);
/// P(op) -> S(dim): reduce as allReduce, then keep torch.chunk piece k along `dim`.
void reduceScatter(RankTensors& locals, const mesh::DeviceMesh& mesh, size_t m, mesh::ReduceOp op,
                   int64_t dim);
/// R -> S(dim): keep torch.chunk piece k of the local along `dim` (no communication).
void localSlice(RankTensors& locals, const mesh::DeviceMesh& mesh, size_t m, int64_t dim);
/// S(gather_dim) -> S(shard_dim): cut the local along shard_dim into p torch.chunk pieces, send
/// piece q to coordinate q, concatenate the arrivals along gather_dim in coordinate order.
void allToAll(RankTensors& locals, const mesh::DeviceMesh& mesh, size_t m, int64_t gather_dim,
              int64_t shard_dim);

/// Runs one redistribution step with the functions above. Errors: a step whose fields are
/// inconsistent (missing dims, before/after differing at another mesh dim than mesh_dim).
Status executeStep(RankTensors& locals, const cost::RedistributionStep& step,
                   const mesh::DeviceMesh& mesh);

// --- checking
// -------------------------------------------------------------------------------------

struct Tolerance {
  double rtol = 1e-6;
  double atol = 1e-9;
};

/// Nullopt when every rank's local is exactly its piece of `full` under `t` (after reducing the
/// Partial mesh dims in mesh-dim order); otherwise one line naming the first offending rank, the
/// expected and actual shapes or the largest difference. Floating values compare with `tol`
/// (NaNs equal), others exactly.
std::optional<std::string> checkLayout(const RankTensors& locals, const at::Tensor& full,
                                       const mesh::PlacementTuple& t, const mesh::DeviceMesh& mesh,
                                       Tolerance tol = {});

/// "[5,6,3]".
std::string shapeText(const at::Tensor& t);

}  // namespace apc::validator
