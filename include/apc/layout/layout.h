//===- apc/layout/layout.h - Local pieces of placed tensors, redistribution steps ===//
//
// Which part of a global tensor each rank holds under a placement tuple. Sharding follows DTensor:
// the mesh dims that shard one tensor dim split it one after the other in mesh-dim order, the
// earlier mesh dim being the outer split, and each split uses torch.chunk semantics on the piece
// left by the outer ones (chunk = ceil(size / p); piece k gets clamp(size - k * chunk, 0, chunk)).
// For uneven sizes this nested split differs from one flat split into the product of the mesh
// sizes: a dim of 5 over mesh dims [2, 2] gives pieces 2, 1, 1, 1 (nested), not 2, 2, 1, 0 (flat).
// The largest piece is the same either way: ceil(ceil(n / a) / b) == ceil(n / (a * b)).
// Replicate and Partial mesh dims do not cut the tensor. These functions define the layouts that
// the redistribution steps (StepKind, planned by apc/cost/redistribute.h) transform; lowering,
// the runtime and the strategy validator use them to slice tensors. A library of its own
// (apc_layout: ir and mesh only), so that the runtime needs no planner library for it.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "apc/ir/types.h"
#include "apc/mesh/device_mesh.h"
#include "apc/mesh/placement.h"
#include "apc/support/error.h"

namespace apc::layout {

/// The part of one tensor dim held by one rank: [offset, offset + size).
struct DimPiece {
  int64_t offset = 0;
  int64_t size = 0;
  bool operator==(const DimPiece&) const;  // defaulted in the .cpp (C++17 users)
};

/// The piece of every dim of a tensor of `global_sizes` held by the rank at `coordinate` (one entry
/// per mesh dim) under `placements`, by the nested rule above. Preconditions (unchecked):
/// placements.size() == mesh.ndim() == coordinate.size(), shard dims < global_sizes.size().
std::vector<DimPiece> localPiece(const std::vector<int64_t>& global_sizes,
                                 const mesh::PlacementTuple& placements,
                                 const mesh::DeviceMesh& mesh,
                                 const std::vector<int64_t>& coordinate);

/// The largest local size of each dim over all ranks: ceil(size / shardFactor(dim)), held by the
/// rank at coordinate 0. Symbolic dims use their hints. Same preconditions as localPiece.
std::vector<int64_t> maxLocalSizes(const ir::TensorMeta& global,
                                   const mesh::PlacementTuple& placements,
                                   const mesh::DeviceMesh& mesh);

/// The placement of one element of a Tensor[] whose list is placed `list` (a Tensor[] has one tuple
/// for all its elements, apc/strategy/strategy.h): the list's tuple with every Shard of a dim the
/// element holds at size 1 made Replicate. Such an element broadcasts along that dim against the
/// others (index.Tensor's index tensors [B, 1, 1] and [1, 1, S], einsum operands), so it is whole
/// under any cut of the dim; a size-1 dim could not be cut anyway (torch.chunk leaves the other
/// pieces empty). The planner, lowering and the strategy validator place list elements by this one
/// rule. A tensor that is not a list element is placed by its tuple as it is.
mesh::PlacementTuple elementPlacement(const mesh::PlacementTuple& list,
                                      const std::vector<int64_t>& element_sizes);

/// The kinds of redistribution step, each on the group of ranks that differ only in one mesh
/// coordinate (apc/cost/redistribute.h plans them and prices them; the runtime runs them).
enum class StepKind : uint8_t { kAllGather, kAllReduce, kReduceScatter, kLocalSlice, kAllToAll };

/// "all-gather", "all-reduce", "reduce-scatter", "local-slice", "all-to-all" (for messages; the
/// program format carries proto::StepKind, see apc/artifact/typed_proto.h).
const char* stepKindName(StepKind kind);

}  // namespace apc::layout
