//===- apc/strategy/token_local.h - Token-local regions of dropless MoE layers -===//
//
// A dropless mixture-of-experts layer in Hugging Face's "grouped_mm" form (transformers 5.x,
// moe.py: Mixtral, Qwen2/3-MoE, OLMoE, GPT-OSS, DeepSeek-V3) sorts the (token, choice) pairs of
// the WHOLE batch by expert, runs the expert MLPs as grouped matmuls over the sorted rows (one
// group per expert, its rows given by the cumulative counts), and puts the rows back in pair order
// by indexing with the inverse permutation:
//
//   ids[S] = top_k_index.reshape(-1)                     (S = N tokens x k choices, token-major)
//   sorted, perm = sort(ids)
//   rows = hidden[N, D][perm // k]; w = top_k_weights.reshape(-1)[perm]
//   offs = cumsum(histc(sorted, E), dtype=int32)
//   out_sorted = grouped_mm(act(grouped_mm(rows, W1, offs)), W2, offs) * w[:, None]
//   inv = index_put(empty_like(perm), [perm], arange(S))
//   out = out_sorted[inv]                                (the region's exit, pair order again)
//
// No per-op rule can cut that region by tokens: the global sort's order is not the concatenation
// of the pieces' sorts. But the region as a whole is token-local: each output row depends on its
// own token's row and choices only, so ranks that run the whole region on their own tokens (their
// own sort, counts, offsets and grouped matmuls) get exactly their rows of the output. This file
// finds such regions and gives each member node extra strategies, marked Strategy::region_variant,
// that run it so (AutoParallel's local_map, for this one pattern):
//
// - per non-empty set M of mesh dims whose pieces cut the N tokens evenly: every CUT value (the
//   pair- or token-indexed tensors: the sort's input and outputs, the gathered rows, the expert
//   activations, the permutations, the external token rows and routing weights, the arange of the
//   inverse permutation) is S(0) on the mesh dims of M, and every WHOLE value (the per-expert
//   counts and offsets, the expert weights and what is computed from parameters only) is R; all
//   values are R on the other mesh dims;
// - inside the region the values are the rank's own, not pieces of the global ones: a CUT value
//   holds the rank's pairs in the rank's sorted order, and the WHOLE counts and offsets are the
//   rank's. Index values stay GLOBAL positions: the local rewrites (apc/strategy/local_rewrite.h)
//   add the rank's first position to the sort's indices, and subtract it where an index or
//   index_put reads a tensor cut on the indexed dim (only region strategies cut one);
// - the EXPERT CUT, per mesh dim m that cuts the E experts evenly (with every token cut of the
//   other mesh dims): the grouped matmuls' weights (and biases) S(0) on m, their outputs and
//   everything computed from them up to the exit Partial on m. Each rank multiplies the rows of
//   its own experts (the _grouped_mm local rewrite narrows the sorted rows to its groups' range,
//   read from offs at run time, and pads the product with zero rows); between two grouped
//   matmuls any row-wise op may run on the other rows (the next grouped matmul drops them); after
//   the last one only ops linear in those rows that keep a zero row zero (mul, div by a whole
//   value, index, views, sum) lead to the exit, whose Partial output the solver reduces. Backward
//   follows from the gradient convention: the sorted rows' gradient is Partial into the first
//   grouped matmul (an all-reduce on m), the routing weights' at their product (the same), the
//   expert weights' stays on its rank;
// - the variants are numbered alike on every member (Strategy::region_variant: token cuts first,
//   then expert cuts), and the solver takes one variant for all of a region's members or none
//   (graph_problem.cpp: an edge between two nodes that have region strategies costs +infinity
//   between different variants, a rule's strategy being variant 0), so no collective ever moves
//   a rank-local value; the region's inputs and its exit's output are ordinary placed tensors.
//
// The pattern is checked, not assumed: the members are the nodes reachable from the sort up to the
// one exit (an index by an index_put's result); every member must be an op of a row-wise list
// (pointwise ops, casts, chunks on other dims, the index ops, histc/bincount and a cumsum of
// their counts, _grouped_mm of cut rows by whole weights, linear/matmul of cut rows) with its dims
// off dim 0, every cut value must have the pair count S (or, outside, the token count N) as dim
// 0, and nothing but the exit's output may leave the region (no graph output, no size read).
// Anything else leaves the layer without region strategies, planned as before.
//
// Limits: the local pieces' first positions are computed from the local sizes (rank coordinate x
// local size), exact for equal pieces: lowering records the batch symbol's divisibility at the
// region's sort (proto::DivisibleDim), and the runtime refuses an uneven dynamic batch on every
// forward in one line. The expert cut does not balance the experts' rows (dropless routing).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "apc/ir/graph.h"
#include "apc/mesh/device_mesh.h"
#include "apc/strategy/strategy.h"

namespace apc::strategy {

/// One token-local region (see the file comment).
struct TokenLocalRegion {
  ir::NodeId root;                  // the sort
  ir::NodeId exit;                  // the index by the inverse permutation
  std::vector<ir::NodeId> members;  // in graph order, root and exit included
  /// Every tensor (or Tensor[]) value a member reads or writes, by ValueId: true when it is cut
  /// by tokens under the region's strategies, false when whole.
  std::map<uint32_t, bool> cut;
  int64_t pairs = 0;   // S: the sort's length
  int64_t tokens = 0;  // N: S / k
  /// The expert cut (see the file comment): the experts' count E (0: no expert cut), the values
  /// Partial on the expert mesh dim (the grouped matmuls' outputs and what is computed from them),
  /// and the grouped matmuls' weights (and biases), S(0) there.
  int64_t experts = 0;
  std::set<uint32_t> expert_rows;
  std::set<uint32_t> expert_weights;
};

/// The token-local regions of `g`, in graph order of their roots.
std::vector<TokenLocalRegion> findTokenLocalRegions(const ir::Graph& g);

/// The region strategies of member `node` (Strategy::region_variant set, compute_us 0: the caller
/// prices them): the token cuts, one per non-empty set of mesh dims whose pieces cut the region's
/// tokens into equal non-empty pieces, in order of the sets' bit masks; then, when the region has
/// an expert cut, per mesh dim whose size divides E, one per token cut of the other dims (the
/// empty one first).
std::vector<Strategy> tokenLocalStrategies(const ir::Graph& g, const TokenLocalRegion& region,
                                           const ir::Node& node, const mesh::DeviceMesh& mesh);

}  // namespace apc::strategy
