//===- lib/solver/baselines.cpp - Classic parallelism plans as pins --------===//
//
// DDP, FSDP (ZeRO-3), Megatron TP and FSDP+TP as parameter placements, and their application to a
// GraphProblem as pins. The rules, including the structural Megatron role analysis, are documented
// in apc/solver/baselines.h.
//
//===----------------------------------------------------------------------===//
#include "apc/solver/baselines.h"

#include <algorithm>
#include <cctype>
#include <numeric>

#include "apc/strategy/strategy.h"

namespace apc::solver {

using mesh::Placement;
using mesh::PlacementTuple;

const char* baselineName(Baseline b) {
  switch (b) {
    case Baseline::kDdp:
      return "ddp";
    case Baseline::kFsdp:
      return "fsdp";
    case Baseline::kTp:
      return "tp";
    case Baseline::kFsdpTp:
      return "fsdp+tp";
  }
  return "?";
}

Expected<Baseline> parseBaseline(std::string_view text) {
  std::string s(text);
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (s == "ddp") return Baseline::kDdp;
  if (s == "fsdp" || s == "zero3") return Baseline::kFsdp;
  if (s == "tp") return Baseline::kTp;
  if (s == "fsdp+tp" || s == "fsdp_tp") return Baseline::kFsdpTp;
  return invalidArgument("unknown baseline '" + std::string(text) +
                         "' (known: ddp, fsdp, tp, fsdp+tp)");
}

const std::vector<Baseline>& allBaselines() {
  static const std::vector<Baseline> all = {Baseline::kDdp, Baseline::kFsdp, Baseline::kTp,
                                            Baseline::kFsdpTp};
  return all;
}

bool baselineApplies(Baseline b, size_t mesh_ndim) {
  if (mesh_ndim == 0) return false;
  return b != Baseline::kFsdpTp || mesh_ndim >= 2;
}

const char* tpRoleName(TpRole r) {
  switch (r) {
    case TpRole::kNone:
      return "none";
    case TpRole::kColumnWeight:
      return "column-weight";
    case TpRole::kColumnBias:
      return "column-bias";
    case TpRole::kRowWeight:
      return "row-weight";
    case TpRole::kRowBias:
      return "row-bias";
    case TpRole::kEmbeddingVocab:
      return "embedding-vocab";
  }
  return "?";
}

namespace {

/// The parameter node a value comes from, looking through dtype casts and other ops that keep the
/// tensor's dims; nullopt when it is not a parameter.
std::optional<ir::NodeId> parameterOf(const ir::Graph& g, ir::ValueId v) {
  for (int hops = 0; hops < 8; ++hops) {
    const ir::Value& val = g.value(v);
    if (!val.producer.valid()) return std::nullopt;
    const ir::Node& n = g.node(val.producer);
    if (n.kind == ir::NodeKind::kParameter) return n.id;
    if (n.kind != ir::NodeKind::kOp || n.inputs.empty()) return std::nullopt;
    const strategy::OpInfo* info = strategy::defaultRegistry().findEntry(n);
    if (!info || info->tp.kind != strategy::TpUse::Kind::kKeepsDims) return std::nullopt;
    v = n.inputs[0];
  }
  return std::nullopt;
}

/// True when every rank gets a non-empty piece of every tensor dim under `p` (torch.chunk pieces,
/// nested in mesh-dim order).
bool cutsNonEmpty(const ir::TensorMeta& t, const PlacementTuple& p, const mesh::DeviceMesh& m) {
  for (int d = 0; d < static_cast<int>(t.rank()); ++d) {
    std::vector<int64_t> pieces;
    for (size_t k = 0; k < p.size(); ++k)
      if (p[k].isShard(d)) pieces.push_back(m.size(k));
    if (!mesh::cutsIntoNonEmptyPieces(t.shape[d].size, pieces)) return false;
  }
  return true;
}

/// FSDP's dim preference for a tensor whose dim 0 would be cut into `pieces_of_dim0` pieces if
/// every sharding mesh dim took it: dim 0 first when divisible, then dims by decreasing size.
std::vector<int> fsdpPreference(const ir::TensorMeta& t, int64_t pieces_of_dim0) {
  std::vector<int> dims(static_cast<size_t>(t.rank()));
  std::iota(dims.begin(), dims.end(), 0);
  std::stable_sort(dims.begin(), dims.end(),
                   [&](int a, int b) { return t.shape[a].size > t.shape[b].size; });
  if (!dims.empty() && pieces_of_dim0 > 0 && t.shape[0].size % pieces_of_dim0 == 0) {
    dims.erase(std::find(dims.begin(), dims.end(), 0));
    dims.insert(dims.begin(), 0);
  }
  return dims;
}

/// Fills mesh dims `fill` of `cur` (in order) with FSDP shards of `t`.
PlacementTuple fsdpFill(const ir::TensorMeta& t, PlacementTuple cur,
                        const std::vector<size_t>& fill, const mesh::DeviceMesh& m) {
  int64_t pieces = 1;
  for (size_t k : fill) pieces *= m.size(k);
  for (size_t k = 0; k < cur.size(); ++k)
    if (cur[k].isShard(0)) pieces *= m.size(k);
  std::vector<int> pref = fsdpPreference(t, pieces);
  for (size_t k : fill) {
    for (int d : pref) {
      PlacementTuple cand = cur;
      cand[k] = Placement::shard(d);
      if (cutsNonEmpty(t, cand, m)) {
        cur = std::move(cand);
        break;
      }
    }
  }
  return cur;
}

/// The tp placement of a parameter of the given role on mesh dim `k` (R elsewhere), or R when the
/// dim is too small.
PlacementTuple tpTuple(const ir::TensorMeta& t, TpRole role, size_t k, const mesh::DeviceMesh& m) {
  PlacementTuple p = mesh::replicated(m.ndim());
  int dim = -1;
  switch (role) {
    case TpRole::kColumnWeight:
    case TpRole::kColumnBias:
    case TpRole::kEmbeddingVocab:
      dim = 0;
      break;
    case TpRole::kRowWeight:
      dim = 1;
      break;
    case TpRole::kNone:
    case TpRole::kRowBias:
      break;
  }
  if (dim < 0 || dim >= t.rank()) return p;
  p[k] = Placement::shard(dim);
  if (!cutsNonEmpty(t, p, m)) p[k] = Placement::replicate();
  return p;
}

}  // namespace

std::map<std::string, TpRole> megatronRoles(const ir::Graph& g) {
  std::map<std::string, TpRole> roles;
  std::vector<bool> assigned(g.numNodes(), false);
  for (const ir::Node& n : g.nodes())
    if (n.kind == ir::NodeKind::kParameter) roles[n.name] = TpRole::kNone;
  auto assign = [&](std::optional<ir::NodeId> p, TpRole r) {
    if (!p || assigned[p->v]) return;
    assigned[p->v] = true;
    roles[g.node(*p).name] = r;
  };
  std::vector<bool> split(g.numValues(), false);  // false: stream
  const strategy::Registry& registry = strategy::defaultRegistry();
  using Kind = strategy::TpUse::Kind;
  for (const ir::Node& n : g.nodes()) {
    if (n.kind != ir::NodeKind::kOp) continue;
    // The op's part, from its registry entry (strategy::OpInfo::tp).
    const strategy::OpInfo* info = registry.findEntry(n);
    const strategy::TpUse tp = info ? info->tp : strategy::TpUse{};
    auto operand = [&](int i) -> std::optional<ir::NodeId> {
      if (i < 0 || static_cast<size_t>(i) >= n.inputs.size()) return std::nullopt;
      return parameterOf(g, n.inputs[static_cast<size_t>(i)]);
    };
    bool out_split = false;
    if (tp.kind == Kind::kLinear && !n.inputs.empty() && operand(tp.weight)) {
      bool row = split[n.inputs[0].v];
      assign(operand(tp.weight), row ? TpRole::kRowWeight : TpRole::kColumnWeight);
      assign(operand(tp.bias), row ? TpRole::kRowBias : TpRole::kColumnBias);
      out_split = !row;
    } else if (tp.kind == Kind::kVocab && operand(tp.weight)) {
      assign(operand(tp.weight), TpRole::kEmbeddingVocab);
    } else {
      for (ir::ValueId in : n.inputs) out_split = out_split || split[in.v];
    }
    for (ir::ValueId out : n.outputs) split[out.v] = out_split;
  }
  return roles;
}

Expected<std::map<std::string, PlacementTuple>> baselineParameterPlacements(
    const ir::Graph& g, Baseline b, const mesh::DeviceMesh& m) {
  if (!baselineApplies(b, m.ndim()))
    return invalidArgument(std::string("baseline '") + baselineName(b) + "' needs a mesh of " +
                           (b == Baseline::kFsdpTp ? "2 or more" : "1 or more") + " dims, got " +
                           m.toString());
  std::map<std::string, TpRole> roles;
  if (b == Baseline::kTp || b == Baseline::kFsdpTp) roles = megatronRoles(g);
  const size_t tp_dim = m.ndim() - 1;
  std::vector<size_t> all_dims(m.ndim()), dp_dims(m.ndim() - 1);
  std::iota(all_dims.begin(), all_dims.end(), size_t{0});
  std::iota(dp_dims.begin(), dp_dims.end(), size_t{0});

  std::map<std::string, PlacementTuple> out;
  for (const ir::Node& n : g.nodes()) {
    if (n.kind != ir::NodeKind::kParameter) continue;
    const ir::Value& v = g.value(n.outputs.at(0));
    if (!v.tensor) continue;
    const ir::TensorMeta& t = *v.tensor;
    PlacementTuple p = mesh::replicated(m.ndim());
    switch (b) {
      case Baseline::kDdp:
        break;
      case Baseline::kFsdp:
        p = fsdpFill(t, p, all_dims, m);
        break;
      case Baseline::kTp:
        p = tpTuple(t, roles.at(n.name), tp_dim, m);
        break;
      case Baseline::kFsdpTp:
        p = fsdpFill(t, tpTuple(t, roles.at(n.name), tp_dim, m), dp_dims, m);
        break;
    }
    out[n.name] = std::move(p);
  }
  return out;
}

std::optional<ir::NodeId> firstBatchInput(const ir::Graph& g) {
  for (ir::NodeId id : g.nodesOfKind(ir::NodeKind::kInput)) {
    const ir::Value& v = g.value(g.node(id).outputs.at(0));
    if (v.tensor && v.tensor->rank() >= 1 && v.tensor->shape[0].size > 0) return id;
  }
  return std::nullopt;
}

std::vector<bool> batchCarryingValues(const ir::Graph& g) {
  std::vector<bool> carries(g.numValues(), false);
  const std::optional<ir::NodeId> first = firstBatchInput(g);
  if (!first) return carries;
  const int64_t batch = g.value(g.node(*first).outputs.at(0)).tensor->shape[0].size;
  // Data flows from the inputs through tensors (and lists of them) only: a size read off an input
  // (aten::size, then arange for position ids, or a causal mask) is the same on every rank, so what
  // is computed from it does not carry the batch (GPT-2's [T] position ids, T a multiple of the
  // batch, did: the ddp plan split them and gathered the position embedding back every step).
  std::vector<bool> from_input(g.numValues(), false);
  for (const ir::Node& n : g.nodes()) {
    bool dep = n.kind == ir::NodeKind::kInput;
    for (ir::ValueId in : n.inputs) dep = dep || (from_input[in.v] && g.value(in).mayHoldTensors());
    for (ir::ValueId out : n.outputs) {
      from_input[out.v] = dep;
      const ir::Value& v = g.value(out);
      carries[out.v] = dep && v.tensor && v.tensor->rank() >= 1 &&
                       v.tensor->shape[0].size >= batch && v.tensor->shape[0].size % batch == 0;
    }
  }
  return carries;
}

Expected<GraphProblem> applyBaseline(GraphProblem gp, const ir::Graph& g, Baseline b,
                                     const mesh::DeviceMesh& m) {
  APC_ASSIGN_OR_RETURN(auto placements, baselineParameterPlacements(g, b, m));
  // The data-parallel mesh dims compute on batch shards: every op whose outputs carry the batch
  // takes a strategy with those outputs S(0) on each of them, when it has one (see baselines.h).
  const size_t dp_dims = dataParallelMeshDims(b, m.ndim());
  const std::vector<bool> carries = dp_dims ? batchCarryingValues(g) : std::vector<bool>{};
  for (size_t i = 0; dp_dims && i < gp.graph_nodes.size(); ++i) {
    if (!gp.graph_nodes[i].valid() || gp.graph_nodes[i].v >= g.numNodes()) continue;
    const ir::Node& n = g.node(gp.graph_nodes[i]);
    if (n.kind != ir::NodeKind::kOp) continue;
    std::vector<size_t> batch_outputs;
    for (size_t k = 0; k < n.outputs.size(); ++k)
      if (carries[n.outputs[k].v]) batch_outputs.push_back(k);
    if (batch_outputs.empty()) continue;
    const auto& strats = gp.strategies.at(i);
    std::vector<bool> data_parallel(strats.size(), false);
    bool any = false;
    for (size_t s = 0; s < strats.size(); ++s) {
      bool ok = true;
      for (size_t k : batch_outputs) {
        const auto& out = strats[s].outputs.at(k);
        for (size_t j = 0; ok && j < dp_dims; ++j) ok = out && (*out)[j].isShard(0);
      }
      data_parallel[s] = ok;
      any = any || ok;
    }
    if (!any) continue;
    for (size_t s = 0; s < strats.size(); ++s)
      if (!data_parallel[s]) gp.problem.nodes.at(i).costs.at(s) = kInfinity;
  }
  for (size_t i = 0; i < gp.graph_nodes.size(); ++i) {
    if (!gp.graph_nodes[i].valid()) continue;
    if (gp.graph_nodes[i].v >= g.numNodes())
      return invalidArgument("applyBaseline: the problem was built from another graph");
    const ir::Node& n = g.node(gp.graph_nodes[i]);
    if (n.kind != ir::NodeKind::kParameter) continue;
    auto it = placements.find(n.name);
    if (it == placements.end())
      return internalError("applyBaseline: no placement for parameter '" + n.name + "'");
    const auto& strats = gp.strategies.at(i);
    std::optional<uint32_t> pick;
    for (size_t s = 0; s < strats.size() && !pick; ++s) {
      const auto& out = strats[s].outputs.at(0);
      if (out && out->size() != m.ndim())
        return invalidArgument("applyBaseline: the problem was built for another mesh than " +
                               m.toString());
      if (out && *out == it->second) pick = static_cast<uint32_t>(s);
    }
    if (!pick)
      return internalError("applyBaseline: " + std::string(baselineName(b)) + " placement " +
                           mesh::toString(it->second) + " of parameter '" + n.name +
                           "' is not among its strategies");
    gp.problem.nodes.at(i).pinned = *pick;
    gp.problem.nodes.at(i).pin_group = "baseline";
  }
  gp.problem.memory.reset();
  return gp;
}

size_t dataParallelMeshDims(Baseline b, size_t mesh_ndim) {
  switch (b) {
    case Baseline::kDdp:
    case Baseline::kFsdp:
      return mesh_ndim;
    case Baseline::kTp:
      return 0;
    case Baseline::kFsdpTp:
      return mesh_ndim == 0 ? 0 : mesh_ndim - 1;
  }
  return 0;
}

PlacementTuple dataParallelInput(const ir::TensorMeta& t, const mesh::DeviceMesh& m, Baseline b) {
  PlacementTuple p = mesh::replicated(m.ndim());
  if (t.rank() == 0 || !baselineApplies(b, m.ndim())) return p;
  const size_t dp_dims = dataParallelMeshDims(b, m.ndim());
  for (size_t k = 0; k < dp_dims; ++k) {
    PlacementTuple cand = p;
    cand[k] = Placement::shard(0);
    if (cutsNonEmpty(t, cand, m)) p = std::move(cand);
  }
  return p;
}

double memoryFraction(const GraphProblem& gp, const std::vector<uint32_t>& choice) {
  if (gp.total_param_bytes <= 0) return 0;
  return memoryOf(gp.problem, choice) / gp.total_param_bytes;
}

}  // namespace apc::solver
