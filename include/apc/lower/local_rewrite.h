//===- apc/lower/local_rewrite.h - Op constants rewritten for local pieces -===//
//
// One rank's call of a node, rewritten for the rank's local pieces: the rewrite of each op is its
// registry entry's strategy::OpInfo::local_rewrite (the table and the types are in
// apc/strategy/local_rewrite.h); localizeNode looks it up and applies it.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <optional>
#include <vector>

#include "apc/ir/graph.h"
#include "apc/strategy/local_rewrite.h"
#include "apc/support/error.h"

namespace apc::lower {

using strategy::NodeRewrite;
using strategy::RankPieces;
using strategy::SymbolicSize;
using strategy::TensorPiece;

/// The rewrite of `node` for the rank whose pieces are `pieces`: its registry entry's
/// OpInfo::local_rewrite (strategy::defaultRegistry()), or none. `constants[i]` is the known value
/// of non-tensor input i (nullopt for tensors and unknown values). Errors: an op with a rewrite
/// whose arguments do not have the expected form or are unknown.
Expected<NodeRewrite> localizeNode(const ir::Node& node,
                                   const std::vector<std::optional<ir::Constant>>& constants,
                                   const RankPieces& pieces);

}  // namespace apc::lower
