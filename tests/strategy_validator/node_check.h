//===- tests/strategy_validator/node_check.h - One node, one strategy, all ranks ===//
//
// The core of the strategy validator: for one op node of an imported graph, make random full
// inputs that the op accepts, run the op unsharded (the reference), and for one strategy on one
// mesh run the op on every simulated rank and compare the reassembled outputs with the reference.
//
// Inputs: floating tensors are standard normal in f64 (the IR's f32/bf16/f16 widened alike for
// reference and ranks); integer tensors that index something are drawn below the size they index
// (embedding indices < num_embeddings, loss targets < classes, index_select indices < the indexed
// dim, gather / scatter_add / index_add indices < self's size in dim, bincount's values <
// minlength), other integers small and non-negative; bools fair coin flips; batch_norm's
// running_var positive; scalar tensor literals keep their value; inputs whose values the IR's
// shapes fix are drawn to fit them (repeat_interleave's tensor repeats sum to the output's size,
// _grouped_mm's offs are sorted row ends). Non-tensor arguments are the IR's constants.
//
// A rank's inputs are cut from the full inputs by the strategy's input placements (sim_ranks.h:
// layout::localPiece pieces, random summands for Partial); its call is localized by the rewrite
// that lowering ships (apc/lower/local_rewrite.h, applied as lowering writes it; a vocab-parallel
// embedding runs its rewrite's local graph through the runtime's OpCollectiveRunner, the path of
// the ops with an internal collective);
// its outputs must together be the reference's outputs laid out as the strategy's output
// placements (checkLayout: each rank its piece, Partial mesh dims reduced, rtol 1e-6 in f64).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "apc/ir/graph.h"
#include "apc/mesh/device_mesh.h"
#include "apc/strategy/strategy.h"
#include "apc/strategy/token_local.h"
#include "op_runner.h"
#include "sim_ranks.h"

namespace apc::validator {

/// Ops without a float64 kernel (_grouped_mm: f32, bf16 and f16 only): their floating inputs are
/// made in the IR's dtype, not widened, and compared with kFloat32Tolerance.
bool keepsFloat32(const ir::Node& node);
/// Sharded and unsharded float32 results differ by the summation order of their contractions.
inline constexpr Tolerance kFloat32Tolerance{1e-4, 1e-4};

/// Random full inputs for a node: one IValue per node input (tensor, tensor list or constant).
Expected<std::vector<c10::IValue>> makeFullInputs(const ir::Graph& g, const ir::Node& node,
                                                  const NodeOp& op, at::Generator& gen);

/// Runs the node on (copies of) `inputs`; one IValue per node output.
Expected<std::vector<c10::IValue>> runNode(const ir::Node& node, const NodeOp& op,
                                           const std::vector<c10::IValue>& inputs);

/// Checks that the reference outputs have the IR's shapes (an importer check; the validator
/// compares against these shapes). Nullopt when they do.
std::optional<std::string> checkReferenceShapes(const ir::Graph& g, const ir::Node& node,
                                                const std::vector<c10::IValue>& outputs);

/// Structural check of a strategy against the node and mesh: one entry per input and output, a
/// tuple exactly for the tensor ones, tuples of the mesh's length with shard dims in range.
std::optional<std::string> checkStrategyForm(const ir::Graph& g, const ir::Node& node,
                                             const strategy::Strategy& s,
                                             const mesh::DeviceMesh& mesh);

struct CheckStats {
  int64_t rank_calls = 0;  // op calls on simulated ranks (one per class of identical ranks)
  int64_t rewrites = 0;    // rank calls that needed a local rewrite
  std::map<std::string, int64_t> rewrites_by_op;  // the same, per qualified op
};

/// Runs the strategy on every rank of `mesh` and compares with `full_outputs`. Nullopt when every
/// tensor output matches; otherwise one line saying what went wrong (a rank's call failing, a
/// shape, a value).
std::optional<std::string> checkStrategy(const ir::Graph& g, const ir::Node& node, const NodeOp& op,
                                         const strategy::Strategy& s, const mesh::DeviceMesh& mesh,
                                         const std::vector<c10::IValue>& full_inputs,
                                         const std::vector<c10::IValue>& full_outputs,
                                         at::Generator& gen, CheckStats& stats);

/// One variant of a token-local region (apc/strategy/token_local.h): `member_strategies` holds
/// the strategy of that variant for each member, in region.members order. The region runs
/// unsharded on random inputs (the sort's keys below the experts' count, factories as the graph
/// computes them, floating tensors in their IR dtype), then on every rank of `mesh`: its external
/// inputs cut by the placements the members read them at, each member's call localized by the
/// rewrite lowering ships, the members' outputs kept as the rank's values. The exit's pieces must
/// be the unsharded exit laid out as its output placement (float32: rtol 1e-4, atol 1e-6 of the
/// largest value). Nullopt when they are; otherwise one line.
std::optional<std::string> checkRegion(const ir::Graph& g, const strategy::TokenLocalRegion& region,
                                       const std::vector<strategy::Strategy>& member_strategies,
                                       const mesh::DeviceMesh& mesh, at::Generator& gen,
                                       CheckStats& stats);

}  // namespace apc::validator
