//===- apc/cost/redistribute.h - Redistribution planning and pricing ------===//
//
// How a tensor placed as `from` on a device mesh becomes placed as `to`: an ordered list of steps,
// each changing the placement of ONE mesh dim, with the forward cost of each step and the cost of
// its transpose, which carries the gradient back. The same plan prices edges for the solver and
// drives lowering, so the priced collectives are the executed ones.
//
// Layout semantics (apc/layout/layout.h): the mesh dims that shard one tensor dim split it in
// mesh-dim order, the earlier mesh dim being the outer split, each split with torch.chunk semantics
// (uneven dims allowed; pieces may be short or empty). Every intermediate state of a plan is a
// placement tuple with exactly these semantics, so a step is fully described by its kind, mesh dim,
// tensor dim(s), reduce op and the tuples before and after it; local piece sizes (also for uneven
// dims) follow from localPiece(global sizes, before/after, mesh, coordinate).
//
// Steps, on each group of ranks that differ only in coordinate `mesh_dim` (ordered by that
// coordinate); k is the rank's coordinate along mesh_dim, p the group size, and "local" each rank's
// tensor before the step:
//   AllGather      S(d) -> R     concatenate the group's locals along d, in coordinate order
//   AllReduce      P(op) -> R    reduce the group's locals elementwise with op
//   ReduceScatter  P(op) -> S(d) reduce with op, then keep torch.chunk piece k along d
//   LocalSlice     R -> S(d)     keep torch.chunk piece k of the local along d (no communication)
//   AllToAll       S(i) -> S(j)  cut the local along j into p torch.chunk pieces, send piece q to
//                                coordinate q, concatenate the arrivals along i in coordinate order
// A P -> P with the same op is no step. Legality, which makes every step exact under nested
// sharding: a step at mesh dim m that removes or adds a split of tensor dim x (gather, slice,
// reduce-scatter, either side of an all-to-all) needs that no mesh dim after m currently shards x,
// i.e. m is (or becomes) the innermost split of x. Partial mesh dims hold elementwise summands, so
// slicing, gathering and all-to-all on other mesh dims commute with them (a partial value may be
// sliced first and reduced on fewer bytes).
//
// Impossible: a value cannot become partial (S -> P, R -> P, P(op1) -> P(op2) are not data
// transitions), and two Partial mesh dims whose ops do not commute (max with sum, min with max;
// sum with avg is fine) cannot be reduced in either order. Such a pair gives a plan with
// feasible == false and a one-line reason, not an Error; callers treat it as infinite cost. Errors
// are for malformed arguments only (tuple lengths, shard dims out of range, unknown dtype, negative
// sizes, more than kMaxRedistributionMeshDims mesh dims).
//
// Ordering: the planner searches (Dijkstra) over intermediate tuples in which mesh dim m holds
// from[m], to[m], R or S(d) for any tensor dim d (Partial only where from has it), moving one mesh
// dim per legal step, and returns a cheapest plan (forward + priced backward), ties broken by fewer
// steps, deterministically. It finds what DTensor's fixed order does (gather inner to outer, then
// slice outer to inner) and the cheaper plans that order misses: gather on a slow link while the
// tensor is still small, slice partial values before reducing them, reduce-scatter + all-reduce +
// all-gather for [P, P] -> [R, R], all-to-all instead of gather + slice, and moving an inner split
// out of the way by an all-to-all. Examples on mesh [2, 2] (the tensor must be whole on mesh 0
// before mesh 1 may split it alone, and mesh 0 may only gather its innermost split):
//   1-d tensor, [S(0), S(0)] -> [R, S(0)]: all-gather(mesh 1, dim 0), all-gather(mesh 0, dim 0),
//     local-slice(mesh 1, dim 0)
//   2-d tensor, the same pair: all-to-all(mesh 1, dim 0->1), all-gather(mesh 0, dim 0),
//     all-to-all(mesh 1, dim 1->0)
// Above kMaxSearchStates states (big meshes with high-rank tensors) the shard options shrink to
// from[m], to[m] and R (at most 3^6 = 729 states).
//
// Bytes: each step's full_bytes is the size of the tensor as seen along its mesh dim: the largest
// piece of the state with mesh dim m's split undone, prod_d ceil(size_d / f_d) * dtype bytes, where
// f_d multiplies the sizes of the OTHER mesh dims sharding d at that point. It is the n of the
// collective formulas (apc/cost/collectives.h); for even dims, global bytes / those factors.
//
// Backward (DESIGN.md "Backward"): the gradient flows back through the transposed steps in reverse
// order; each step's backward_us prices its transpose on the same full_bytes:
//   AllGather      -> reduce-scatter  the grad of a gathered value consumed by ops sharded on m is
//                                     Partial; summing it onto the shards is a reduce-scatter
//   AllReduce      -> nothing         the Replicate grad goes to every partial summand
//   ReduceScatter  -> all-gather      the S grad becomes the Replicate grad of the partial input
//   LocalSlice     -> all-gather      the S grad becomes the Replicate grad of the sliced input
//   AllToAll       -> all-to-all      with i and j swapped
// This is DTensor's backward of a redistribution. When the consumer of a gathered value computes
// redundantly (Replicate on m) its grad is Replicate and a local slice would do: the price is then
// an upper bound. Lowering must choose each edge's exact backward from the grad's actual placement
// (redistributing the grad to `from` with P replaced by R is a plan of this same planner).
// Backward is priced only when the tensor takes a gradient (global.requires_grad); otherwise
// backward_us is 0 and the plan minimises the forward cost alone.
//
// A step's price is its collective's (CostModel::collectiveUs, the wait included) and, on a device
// with a measured elementwise curve, the local copies the runtime makes beside the call that the
// calibrated collectives (timed along dim 0) leave out (CostModel::localCopyUs): an all-reduce's
// clone, a local slice made contiguous, a gather or scatter along another dim than 0 moving it.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "apc/cost/collectives.h"
#include "apc/cost/cost_model.h"
#include "apc/ir/types.h"
#include "apc/layout/layout.h"
#include "apc/mesh/device_mesh.h"
#include "apc/mesh/placement.h"
#include "apc/support/error.h"

namespace apc::cost {

/// Largest mesh rank the planner accepts.
inline constexpr size_t kMaxRedistributionMeshDims = 6;
/// Largest number of intermediate tuples searched with every shard option (see "Ordering").
inline constexpr int kMaxSearchStates = 1024;

// The step kinds are the layout library's (the runtime runs them without the cost model).
using layout::StepKind;
using layout::stepKindName;
/// The collective a step runs forward (kNone for a local slice).
CollectiveKind forwardCollective(StepKind kind);
/// The collective its transpose runs on the gradient (see the table above).
CollectiveKind backwardCollective(StepKind kind);

/// One step: changes before[mesh_dim] into after[mesh_dim]; all other entries are equal.
struct RedistributionStep {
  StepKind kind = StepKind::kAllGather;
  size_t mesh_dim = 0;
  int64_t group_size = 1;  // mesh.size(mesh_dim)
  int gather_dim = -1;     // tensor dim that stops being split on mesh_dim: AllGather, AllToAll (i)
  int shard_dim = -1;      // tensor dim that becomes split: LocalSlice, ReduceScatter, AllToAll (j)
  mesh::ReduceOp reduce_op = mesh::ReduceOp::kSum;  // AllReduce, ReduceScatter
  mesh::PlacementTuple before;                      // the whole tuple before the step
  mesh::PlacementTuple after;                       // and after it
  int64_t full_bytes = 0;  // n: the tensor as seen along mesh_dim (see "Bytes" above)
  double forward_us = 0;   // this step's collective
  double backward_us = 0;  // its transpose (0 when the tensor takes no gradient)
  bool operator==(const RedistributionStep&) const;  // defaulted in the .cpp (C++17 users)
};

struct RedistributionPlan {
  mesh::PlacementTuple from;
  mesh::PlacementTuple to;
  bool feasible = true;
  std::string infeasible_reason;          // one line, when !feasible
  bool prices_backward = false;           // global.requires_grad
  std::vector<RedistributionStep> steps;  // in execution order; empty when from == to
  double forward_us = 0;                  // sum over steps
  double backward_us = 0;                 // sum over steps

  /// forward_us + backward_us, or +infinity when infeasible.
  double totalUs() const;
};

/// The cost of a plan without its steps.
struct RedistCost {
  bool feasible = true;
  double forward_us = 0;
  double backward_us = 0;
  int num_steps = 0;

  /// forward_us + backward_us, or +infinity when infeasible.
  double totalUs() const;
};

/// Plans the redistribution of a tensor of global metadata `global` from `from` to `to` on `mesh`,
/// each step priced by `model` (CostModel::collectiveUs; a model of another mesh rank is an
/// error). Errors (kInvalidArgument, kUnsupported) only for malformed arguments; an impossible
/// transition is a plan with feasible == false.
Expected<RedistributionPlan> planRedistribution(const ir::TensorMeta& global,
                                                const mesh::PlacementTuple& from,
                                                const mesh::PlacementTuple& to,
                                                const mesh::DeviceMesh& mesh,
                                                const CostModel& model);
/// The same priced over the mesh's own links (CostModel(DeviceSpec{}, mesh)); so are the other
/// functions below without a model.
Expected<RedistributionPlan> planRedistribution(const ir::TensorMeta& global,
                                                const mesh::PlacementTuple& from,
                                                const mesh::PlacementTuple& to,
                                                const mesh::DeviceMesh& mesh);

/// The cost of planRedistribution's plan (the same numbers) without building the step list: no heap
/// allocation unless it returns an error; well under a microsecond per call on a 2-d mesh.
Expected<RedistCost> redistributionCost(const ir::TensorMeta& global,
                                        const mesh::PlacementTuple& from,
                                        const mesh::PlacementTuple& to,
                                        const mesh::DeviceMesh& mesh, const CostModel& model);
Expected<RedistCost> redistributionCost(const ir::TensorMeta& global,
                                        const mesh::PlacementTuple& from,
                                        const mesh::PlacementTuple& to,
                                        const mesh::DeviceMesh& mesh);

/// redistributionCost(global, from, to, mesh) for every `to` of `tos`, with one search from `from`
/// for all targets without a Partial entry (they share its state space, see "Ordering"): the
/// planner's pricing asks for every (producer placement, consumer placement) pair of an edge, and
/// on 3-d meshes one search per pair was most of the construction time. Equal to the pairwise
/// results bit for bit (forward, backward, steps).
Expected<std::vector<RedistCost>> redistributionCosts(const ir::TensorMeta& global,
                                                      const mesh::PlacementTuple& from,
                                                      const std::vector<mesh::PlacementTuple>& tos,
                                                      const mesh::DeviceMesh& mesh,
                                                      const CostModel& model);
Expected<std::vector<RedistCost>> redistributionCosts(const ir::TensorMeta& global,
                                                      const mesh::PlacementTuple& from,
                                                      const std::vector<mesh::PlacementTuple>& tos,
                                                      const mesh::DeviceMesh& mesh);

/// Convenience: forward + backward microseconds; +infinity when the transition is impossible or
/// the arguments are malformed (call redistributionCost to tell those apart).
double redistributionCostUs(const ir::TensorMeta& global, const mesh::PlacementTuple& from,
                            const mesh::PlacementTuple& to, const mesh::DeviceMesh& mesh);

/// "all-gather(mesh 0, dim 0, 4.00 MiB)", "all-reduce(mesh 1, sum, 1.00 KiB)",
/// "reduce-scatter(mesh 0, dim 1, sum, 2.00 MiB)", "local-slice(mesh 1, dim 0, 4.00 MiB)",
/// "all-to-all(mesh 0, dim 0->1, 4.00 MiB)".
std::string describe(const RedistributionStep& step);

/// "S(0)R -> RR: all-gather(mesh 0, dim 0, 4.00 MiB)" (steps joined by "; "), "R -> R: no-op",
/// "R -> P: impossible (<reason>)". With `with_cost`, appends " [fwd 12.5 us, bwd 12.5 us]".
std::string describe(const RedistributionPlan& plan, bool with_cost = false);

}  // namespace apc::cost
