//===- lib/layout/layout.cpp - Local pieces and step kinds -----------------===//
#include "apc/layout/layout.h"

#include <string>

namespace apc::layout {

// Memberwise equality, defaulted here rather than in the header so that the header stays
// C++17 (installed headers, apcConfig.cmake).
bool DimPiece::operator==(const DimPiece&) const = default;

std::vector<DimPiece> localPiece(const std::vector<int64_t>& global_sizes,
                                 const mesh::PlacementTuple& placements,
                                 const mesh::DeviceMesh& mesh,
                                 const std::vector<int64_t>& coordinate) {
  std::vector<DimPiece> pieces(global_sizes.size());
  for (size_t d = 0; d < global_sizes.size(); ++d) pieces[d] = {0, global_sizes[d]};
  // Mesh-dim order: each shard splits the piece the earlier (outer) mesh dims left.
  for (size_t m = 0; m < placements.size(); ++m) {
    if (!placements[m].isShard()) continue;
    DimPiece& p = pieces[static_cast<size_t>(placements[m].dim())];
    int64_t n = mesh.size(m);
    int64_t k = coordinate[m];
    p = {p.offset + mesh::chunkOffset(p.size, n, k), mesh::chunkSize(p.size, n, k)};
  }
  return pieces;
}

std::vector<int64_t> maxLocalSizes(const ir::TensorMeta& global,
                                   const mesh::PlacementTuple& placements,
                                   const mesh::DeviceMesh& mesh) {
  std::vector<int64_t> sizes = ir::hintSizes(global.shape);
  for (size_t d = 0; d < sizes.size(); ++d) {
    int64_t f = mesh::shardFactor(placements, mesh.shape(), static_cast<int>(d));
    sizes[d] = (sizes[d] + f - 1) / f;
  }
  return sizes;
}

mesh::PlacementTuple elementPlacement(const mesh::PlacementTuple& list,
                                      const std::vector<int64_t>& element_sizes) {
  mesh::PlacementTuple t = list;
  for (mesh::Placement& p : t) {
    if (!p.isShard()) continue;
    const auto d = static_cast<size_t>(p.dim());
    if (d < element_sizes.size() && element_sizes[d] == 1) p = mesh::Placement::replicate();
  }
  return t;
}

const char* stepKindName(StepKind kind) {
  switch (kind) {
    case StepKind::kAllGather:
      return "all-gather";
    case StepKind::kAllReduce:
      return "all-reduce";
    case StepKind::kReduceScatter:
      return "reduce-scatter";
    case StepKind::kLocalSlice:
      return "local-slice";
    case StepKind::kAllToAll:
      return "all-to-all";
  }
  return "?";
}

}  // namespace apc::layout
