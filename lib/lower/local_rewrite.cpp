//===- lib/lower/local_rewrite.cpp - Op constants rewritten for local pieces ===//
//
// localizeNode: the registry entry's local rewrite (apc/strategy/local_rewrite.h), applied.
//
//===----------------------------------------------------------------------===//
#include "apc/lower/local_rewrite.h"

namespace apc::lower {

Expected<NodeRewrite> localizeNode(const ir::Node& node,
                                   const std::vector<std::optional<ir::Constant>>& constants,
                                   const RankPieces& pieces) {
  NodeRewrite r;
  const strategy::OpInfo* info = strategy::defaultRegistry().findEntry(node);
  if (!info || !info->local_rewrite) return r;
  Status st = info->local_rewrite(node, constants, pieces, r);
  if (!st.ok()) return st.error().withContext(node.qualifiedOp());
  return r;
}

}  // namespace apc::lower
