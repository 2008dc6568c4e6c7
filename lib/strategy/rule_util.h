//===- lib/strategy/rule_util.h - Helpers shared by the rule families -----===//
//
// Private to lib/strategy: short placement constructors, DimStrategy builders sized for a node,
// dim normalization, the "uniform" strategies of ops that map every tensor dim to itself (identity
// ops, list packing), and the work counters shared by several families.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "apc/strategy/local_rewrite.h"
#include "apc/strategy/strategy.h"

namespace apc::strategy::detail {

using mesh::ReduceOp;

inline Placement R() {
  return Placement::replicate();
}
inline Placement S(int64_t d) {
  return Placement::shard(static_cast<int>(d));
}
inline Placement P(ReduceOp op = ReduceOp::kSum) {
  return Placement::partial(op);
}

/// Reduce ops that pass through ops linear in a tensor: sum, and avg (avg = sum / p).
inline const std::vector<ReduceOp> kSumAvg = {ReduceOp::kSum, ReduceOp::kAvg};
/// Only sum (used where avg would add strategies no producer emits in practice).
inline const std::vector<ReduceOp> kSumOnly = {ReduceOp::kSum};
inline const std::vector<ReduceOp> kNoPartial = {};

/// A DimStrategy sized for the node's inputs and outputs, every entry unset.
DimStrategy emptyDim(const RuleContext& c);
/// Every tensor input and output set to `p`; non-tensor entries unset.
DimStrategy uniformDim(const RuleContext& c, Placement p);
/// Every tensor input and output Replicate.
inline DimStrategy replicateAll(const RuleContext& c) {
  return uniformDim(c, R());
}

/// `d` normalized against `rank` (negative counts from the end); nullopt when out of range.
std::optional<int64_t> normDim(int64_t d, int64_t rank);
/// Indices of the tensor (or Tensor[]) inputs, in order.
std::vector<size_t> tensorInputs(const RuleContext& c);
/// Rank shared by every tensor input and output, or -1 when they differ or one is unknown.
int64_t commonRank(const RuleContext& c);

/// Strategies of ops whose tensor inputs and outputs all have one rank and keep every dim in
/// place (identity-like ops, list packing): all-R, then S(d) on every tensor for each d in
/// `dims`, then P(op) on every tensor for each op in `partials`. Empty when the ranks differ.
std::vector<DimStrategy> uniformStrategies(const RuleContext& c, const std::vector<int64_t>& dims,
                                           const std::vector<ReduceOp>& partials);
/// uniformStrategies over every dim of the common rank.
std::vector<DimStrategy> identityStrategies(const RuleContext& c,
                                            const std::vector<ReduceOp>& partials);

/// Dims 0..rank-1 except those in `except`.
std::vector<int64_t> dimsExcept(int64_t rank, const std::vector<int64_t>& except);

/// Product of local sizes.
double numel(const std::vector<int64_t>& sizes);
/// Bytes of the local shapes of input/output i (summed over Tensor[] elements).
double localInputBytes(const RuleContext& c, const LocalShapes& l, size_t i);
double localOutputBytes(const RuleContext& c, const LocalShapes& l, size_t i);
/// Whether input i of a contraction or convolution is one of its operands: a tensor input of two
/// or more dims (a bias is one dim).
bool isMatrixOperand(const RuleContext& c, size_t i);
/// Whether input i is an operand (isMatrixOperand) that takes a gradient: backward computes a
/// product for it.
bool operandTakesGradient(const RuleContext& c, size_t i);
/// The share of a contraction's or convolution's operand gradients its backward computes: an
/// operand that takes no gradient (a model's first layer reading its input) costs no product
/// (convolution_backward's output mask, linear's skipped mm). 1 for any other family.
double operandGradientShare(const RuleContext& c, cost::OpFamily family);

/// Work of a contraction: 2 * local output elements * local contracted size, where the
/// contracted size is the product of the local sizes of `lhs_input`'s dims in `lhs_contract`
/// (negative dims count from the end); bytes as in defaultWork.
Work contractionWork(const RuleContext& c, const LocalShapes& l, size_t lhs_input,
                     const std::vector<int64_t>& lhs_contract);
/// No kernel (views): zero work.
Work noWork(const RuleContext& c, const LocalShapes& l);

// The local rewrites of apc/strategy/local_rewrite.h (OpInfo::local_rewrite; local_rewrite.cpp).
/// view, _unsafe_view, reshape (size: 1): the local output shape.
Status rewriteViewSizes(const ir::Node& node, const std::vector<std::optional<ir::Constant>>& c,
                        const RankPieces& pieces, NodeRewrite& r);
/// expand, broadcast_to (size: 1): the local output shape.
Status rewriteExpandSizes(const ir::Node& node, const std::vector<std::optional<ir::Constant>>& c,
                          const RankPieces& pieces, NodeRewrite& r);
/// new_full, new_ones, new_zeros, new_empty (size: 1): the local output shape.
Status rewriteNewFactorySizes(const ir::Node& node,
                              const std::vector<std::optional<ir::Constant>>& c,
                              const RankPieces& pieces, NodeRewrite& r);
/// full, ones, zeros, empty (size: 0; the default and memory_format overloads): the local output
/// shape.
Status rewriteFactorySizes(const ir::Node& node, const std::vector<std::optional<ir::Constant>>& c,
                           const RankPieces& pieces, NodeRewrite& r);
/// unflatten (dim: 1, sizes: 2; the default and int overloads): the local sizes.
Status rewriteUnflattenSizes(const ir::Node& node,
                             const std::vector<std::optional<ir::Constant>>& c,
                             const RankPieces& pieces, NodeRewrite& r);
/// arange: the bounds of the rank's piece.
Status rewriteArangeBounds(const ir::Node& node, const std::vector<std::optional<ir::Constant>>& c,
                           const RankPieces& pieces, NodeRewrite& r);
/// narrow over the whole of a cut dim: the local length.
Status rewriteNarrowLength(const ir::Node& node, const std::vector<std::optional<ir::Constant>>& c,
                           const RankPieces& pieces, NodeRewrite& r);
/// embedding with the weight's rows cut: padding_idx and the masked lookup's local graph.
Status rewriteEmbeddingRows(const ir::Node& node, const std::vector<std::optional<ir::Constant>>& c,
                            const RankPieces& pieces, NodeRewrite& r);
/// sort / argsort of a 1-d input cut along the sorted dim (a token-local region,
/// apc/strategy/token_local.h): the rank's sort, its indices shifted to global positions.
Status rewriteLocalSort(const ir::Node& node, const std::vector<std::optional<ir::Constant>>& c,
                        const RankPieces& pieces, NodeRewrite& r);
/// index.Tensor / index_put with self cut along the indexed dim 0 (a token-local region): the
/// global positions of the one index tensor shifted to the rank's piece.
Status rewriteLocalPositions(const ir::Node& node,
                             const std::vector<std::optional<ir::Constant>>& c,
                             const RankPieces& pieces, NodeRewrite& r);
/// _grouped_mm with the groups of mat2 cut (a token-local region's expert cut): the rows of the
/// rank's own groups multiplied, the other rows zero.
Status rewriteLocalExperts(const ir::Node& node, const std::vector<std::optional<ir::Constant>>& c,
                           const RankPieces& pieces, NodeRewrite& r);
/// linear / addmm / baddbmm whose output is a Partial sum and whose bias (self) is Replicate on
/// those mesh dims: the bias added once, on the ranks at coordinate 0 of every such dim; the
/// others add it times zero (the local graph), so that the summands sum to the bias once.
Status rewriteAddendOnce(const ir::Node& node, const std::vector<std::optional<ir::Constant>>& c,
                         const RankPieces& pieces, NodeRewrite& r);
/// repeat: counts from symbols (dynamic dims only).
Status rewriteRepeatCounts(const ir::Node& node, const std::vector<std::optional<ir::Constant>>& c,
                           const RankPieces& pieces, NodeRewrite& r);

}  // namespace apc::strategy::detail
