//===- apc/solver/baselines.h - Classic parallelism plans as pinned problems ===//
//
// The classic hand-written plans, expressed as pins on the parameter nodes of a GraphProblem (pin
// group "baseline") so that the same cost model prices them and the solver places everything else
// (activations, redistributions) as cheaply as the pins allow. The memory bound is removed: a
// baseline defines its own parameter memory, which memoryFraction reports. Comparing the
// optimizer's objective under that memory fraction with the baseline's objective is the issue's
// quality test: the baseline's choice is feasible for the optimizer, so the optimizer is never
// worse.
//
// Rules per baseline (p = the placement of one parameter on one mesh dim). A parameter placement is
// used only when every rank gets a non-empty piece of every sharded tensor dim (torch.chunk,
// nested in mesh-dim order); otherwise that mesh dim falls back as said below, ending at R.
//
//   ddp      every parameter R on every mesh dim.
//   fsdp     ZeRO-3: every parameter sharded on every mesh dim. The dim to shard is chosen per mesh
//            dim, in mesh-dim order, from the parameter's preference list: dim 0 first when its
//            size is divisible by the world size, then every dim by decreasing size (ties: lower
//            dim first). Each mesh dim takes the first dim of the list that still cuts into
//            non-empty pieces given the mesh dims before it (so S(d) nested on every mesh dim where
//            d allows it, else the next dim, else R).
//   tp       Megatron tensor parallelism on the LAST mesh dim; R on every other mesh dim:
//            column-parallel linear weight S(0), its bias S(0); row-parallel linear weight S(1),
//            its bias R; embedding tables vocab-sharded S(0); every other parameter (norms, convs,
//            parameters used by other ops) R. See "Megatron roles" below.
//   fsdp+tp  meshes of 2 or more dims: tp's placement on the last mesh dim, and on every other mesh
//            dim the fsdp choice above made given the tp placement (a dim the tp placement does not
//            use, or the same dim nested inside it, whichever comes first in the preference list).
//
// Megatron roles, from the structure of the graph alone (no names): a dataflow pass in graph order
// marks each value "stream" (replicated, as between transformer blocks) or "split" (sharded on the
// tp dim, as between a column- and a row-parallel linear). Graph inputs, parameters, buffers and
// constants are stream. Each op's part is its registry entry's strategy::TpUse (OpInfo::tp). A
// linear (`aten::linear`) whose weight is a parameter (directly or through dtype casts and
// aliases, TpUse::kKeepsDims) is row-parallel when its activation input is split and
// column-parallel otherwise; its output is stream after a row-parallel linear (Megatron's
// all-reduce) and split after a column-parallel one. A lookup table (`aten::embedding`, kVocab) of
// a parameter gives stream. Every other op's outputs are split when any input is split. In a
// transformer block this makes the linears that read the (normalized) block input column-parallel
// (wq, wk, wv, w1, w3; c_attn, c_fc) and the linear producing the block output that feeds the
// residual add row-parallel (wo, w2; c_proj); an lm head reading the final norm is column-parallel
// (vocab-sharded logits), and a two-linear MLP without residual (toy_block) is up column-parallel,
// down row-parallel. A parameter with several uses (tied embedding and lm head) takes the role of
// its first use in graph order.
//
// Inputs keep the placements of the spec the GraphProblem was built from. dataParallelInput gives
// the conventional batch sharding for a baseline, for callers that want it.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "apc/ir/graph.h"
#include "apc/mesh/device_mesh.h"
#include "apc/mesh/placement.h"
#include "apc/solver/graph_problem.h"
#include "apc/support/error.h"

namespace apc::solver {

enum class Baseline : uint8_t { kDdp, kFsdp, kTp, kFsdpTp };

/// "ddp", "fsdp", "tp", "fsdp+tp".
const char* baselineName(Baseline b);
/// Parses the names of baselineName (case-insensitive; "zero3" is accepted for fsdp and "fsdp_tp"
/// for fsdp+tp). The error lists the known names.
Expected<Baseline> parseBaseline(std::string_view text);
/// Every baseline, in enum order.
const std::vector<Baseline>& allBaselines();
/// Whether the baseline can be built on a mesh of `mesh_ndim` dims (fsdp+tp needs 2 or more).
bool baselineApplies(Baseline b, size_t mesh_ndim);

/// The Megatron role of a parameter (see the file comment).
enum class TpRole : uint8_t {
  kNone,           // R on the tp dim
  kColumnWeight,   // S(0)
  kColumnBias,     // S(0)
  kRowWeight,      // S(1)
  kRowBias,        // R
  kEmbeddingVocab  // S(0)
};
const char* tpRoleName(TpRole r);  // "none", "column-weight", ...

/// The Megatron role of every parameter of the graph, by fully qualified name (parameters without
/// a role are listed as kNone).
std::map<std::string, TpRole> megatronRoles(const ir::Graph& g);

/// The placement tuple the baseline gives each parameter of the graph, by fully qualified name.
/// Errors: fsdp+tp on a 1-d mesh (kInvalidArgument).
Expected<std::map<std::string, mesh::PlacementTuple>> baselineParameterPlacements(
    const ir::Graph& g, Baseline b, const mesh::DeviceMesh& m);

/// How many leading mesh dims the baseline uses for data parallelism: ddp and fsdp all, fsdp+tp all
/// but the last (tensor-parallel) one, tp none.
size_t dataParallelMeshDims(Baseline b, size_t mesh_ndim);

/// Values that carry the batch: computed from a model input through tensors (not through a size
/// read off one: position ids from arange(T) do not), of rank >= 1, with dim 0 a multiple of (and
/// at least) the first input's dim 0. Indexed by value id.
std::vector<bool> batchCarryingValues(const ir::Graph& g);

/// The input node whose dim 0 the baselines read as the batch: the first input with a tensor of
/// rank >= 1 and a positive dim 0 (nullopt when none has one).
std::optional<ir::NodeId> firstBatchInput(const ir::Graph& g);

/// The baseline as a problem: every parameter node of `gp` pinned (group "baseline") to the
/// placement of baselineParameterPlacements (replacing any earlier pin on it), the memory bound
/// removed. On the data-parallel mesh dims (ddp, fsdp: all; fsdp+tp: all but the last; tp: none)
/// every op node whose outputs carry the batch (batchCarryingValues) may only take strategies
/// with those outputs S(0) there (the others cost +infinity), when it has any: compute is batch
/// sharded as in DDP/FSDP, with replicated (ddp) or gathered-per-use (fsdp) parameters and their
/// Partial gradients all-reduced (ddp) or reduce-scattered (fsdp) by the edges' pricing.
/// Everything else is left to the solver. `g` and `m` must be those `gp` was built from. Errors: as
/// baselineParameterPlacements, and kInternal when a placement is not among the node's strategies.
Expected<GraphProblem> applyBaseline(GraphProblem gp, const ir::Graph& g, Baseline b,
                                     const mesh::DeviceMesh& m);

/// The conventional placement of a batch-first input under a baseline: S(0) on every mesh dim the
/// baseline uses for data parallelism (ddp, fsdp: every mesh dim; tp: none; fsdp+tp: every mesh
/// dim but the last), in mesh-dim order as long as the batch dim still cuts into non-empty pieces
/// (nested), R everywhere else. A rank-0 tensor is R everywhere.
mesh::PlacementTuple dataParallelInput(const ir::TensorMeta& t, const mesh::DeviceMesh& m,
                                       Baseline b);

/// Parameter memory per rank of a choice as a fraction of the total parameter bytes (0 for a
/// problem without parameters). Counts the per-strategy memory of the problem's nodes whether or
/// not a memory bound is set, so it works on baseline problems too.
double memoryFraction(const GraphProblem& gp, const std::vector<uint32_t>& choice);

}  // namespace apc::solver
