//===- apc/planner/verify.h - A plan checked against its graph ----------------===//
//
// A plan file is verified, not trusted. planFromJson checks what the file alone determines (the
// content hashes to its content_hash, each parameter is placed as its node); verifyPlan checks
// what follows from the graph: every node's chosen strategy, enumerated again on the plan's mesh,
// places the node's inputs and outputs as the plan says. `apc validate`, `apc lower` and the C++
// API's apply_placement run it before lowering, so that a placement edited in the JSON (an output
// changed from P to R) is refused with one line naming the node instead of lowered into programs
// that compute another function.
//
//===----------------------------------------------------------------------===//
#pragma once

#include "apc/ir/graph.h"
#include "apc/plan/plan.h"
#include "apc/support/error.h"

namespace apc::plan {

/// Checks `p` against `g` (the graph it was made on): every plan node of a graph node names a node
/// of that kind and op; its strategy list, enumerated again as buildProblem enumerates it (on
/// solver::computeGraph under a mixed precision param_dtype; leaves: solver::leafPlacements), has
/// num_strategies entries; and strategy strategy_index of it has the node's input placements,
/// output placements and text. Every graph node the problem places has exactly one plan node.
/// Errors are kInvalidArgument, one line naming the plan node (`$.nodes[i] 'name' (op)`), what
/// the plan says and what its strategy says.
Status verifyPlan(const ir::Graph& g, const Plan& p);

}  // namespace apc::plan
