//===- apc/planner/checkpointing.h - Activation checkpointing as a planning choice -===//
//
// A checkpointed module runs its forward without autograd and again in backward (the runtime's
// checkpoint segments, proto::CheckpointSegment): it keeps only what it reads from outside
// instead of everything its ops save, for the price of a second forward. apc offers it per
// repeated module (a transformer block, a ResNet stage's block) and chooses it only when the
// device's memory needs it (`apc plan --device-memory`: the fastest plan that fits, with or
// without checkpointing), or as the user asks (`--checkpoint`).
//
// Candidates: sibling modules with the same sequence of tensor ops (size arithmetic aside; two or
// more of them), each of which
// ir::checkpointRange accepts (contiguous, nothing written in place outside it, tensors out), the
// outermost such level (the blocks, not the linears inside them).
//
// Price: the recompute runs the module's forward again: each op node's forward share of its
// compute (compute_us / (1 + its backward multiplier) when it has a backward) and the forward
// half of its input edges' redistributions, except parameters' (a re-gathered parameter is
// already priced twice; a replicated one moves nothing).
//
//===----------------------------------------------------------------------===//
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "apc/ir/graph.h"
#include "apc/plan/plan.h"
#include "apc/support/error.h"

namespace apc::plan {

/// The modules that may be checkpointed, in node order (see the file comment).
std::vector<std::string> checkpointCandidates(const ir::Graph& g);

/// The extra step time of recomputing `module`'s forward in backward under `p`'s placements.
/// Errors: a module ir::checkpointRange refuses.
Expected<double> recomputeUs(const ir::Graph& g, const Plan& p, std::string_view module);

/// Checkpoints `modules` in `p` (none: checkpointing off): sets p.checkpoint (in node order), the
/// totals' recompute_us and total_us, the memory estimates (predictMemoryAll) and the content
/// hash. `g` is the planned graph. Errors: a module that cannot be checkpointed or is named twice,
/// modules whose node ranges overlap.
Status applyCheckpointing(const ir::Graph& g, Plan& p, std::vector<std::string> modules);

/// Parses `--checkpoint`: "none", "all" (every candidate) or a comma-separated list of module
/// paths; returns the modules (empty for "none"). Errors name a module that is not a candidate.
Expected<std::vector<std::string>> parseCheckpointModules(const ir::Graph& g,
                                                          std::string_view text);

/// The cheapest checkpointing that makes `p`'s predicted peak under `optimizer` fit
/// `device_bytes`: candidates by ascending recompute time (ties in node order), the shortest
/// prefix of that order that fits (found by bisection: the peak does not grow as modules are
/// added), applied to `p`. False, with `p` unchanged, when even every candidate does not fit.
Expected<bool> checkpointToFit(const ir::Graph& g, Plan& p, int64_t device_bytes,
                               std::string_view optimizer);

}  // namespace apc::plan
