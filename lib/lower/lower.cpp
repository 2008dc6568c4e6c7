//===- lib/lower/lower.cpp - Per-rank programs from a graph and a plan -----===//
//
// One Lowerer per rank: reads the plan's placements per graph node, decides which nodes survive
// (shape arithmetic with known constants is dropped, then dead nodes), and emits the local graph
// in graph order with redistribute nodes before their first consumer (see apc/lower/lower.h).
//
//===----------------------------------------------------------------------===//
#include "apc/lower/lower.h"

#include "apc/plan/memory.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "apc/artifact/artifact.h"
#include "apc/artifact/typed_proto.h"
#include "apc/cost/compute.h"
#include "apc/cost/cost_model.h"
#include "apc/cost/device.h"
#include "apc/cost/edge.h"
#include "apc/cost/redistribute.h"
#include "apc/ir/proto_io.h"
#include "apc/layout/layout.h"
#include "apc/lower/local_rewrite.h"
#include "apc/lower/schedule.h"
#include "apc/mesh/placement.h"
#include "apc/strategy/strategy.h"
#include "apc/support/strings.h"

namespace apc::lower {

namespace {

using mesh::Placement;
using mesh::PlacementTuple;

bool writesInput(const std::string& op) {
  return !op.empty() && op.back() == '_';
}

/// TorchScript's ScalarType code of a floating dtype (aten::to's dtype argument).
/// The placement of a Tensor[] element under its list's (layout::elementPlacement).
PlacementTuple elementPlacement(const ir::TensorMeta& element, const PlacementTuple& list) {
  return layout::elementPlacement(list, ir::hintSizes(element.shape));
}

int64_t scalarTypeCode(ir::DType d) {
  switch (d) {
    case ir::DType::kF16:
      return 5;
    case ir::DType::kF64:
      return 7;
    case ir::DType::kBF16:
      return 15;
    default:
      return 6;  // f32
  }
}

/// The plan's placements of one graph node.
struct NodePlacements {
  bool present = false;
  std::vector<std::optional<PlacementTuple>> inputs;
  std::vector<std::optional<PlacementTuple>> outputs;
};

/// One output leaf: its path name, value and the placement the spec requires (nullopt: free).
struct Leaf {
  std::string path;
  ir::ValueId value;
  std::optional<PlacementTuple> want;
};

Status collectLeaves(const ir::OutputTree& gt, const spec::OutputPlacementTree* st,
                     const std::string& path, std::vector<Leaf>& out) {
  using K = spec::OutputPlacementTree::Kind;
  if (st && st->kind == K::kFree) st = nullptr;
  if (gt.kind == ir::OutputTree::Kind::kLeaf) {
    if (st && st->kind != K::kLeaf)
      return invalidArgument("output " + path + ": structured placement for a single output");
    out.push_back({path.empty() ? "output" : path, gt.leaf,
                   st ? std::optional<PlacementTuple>(st->placements) : std::nullopt});
    return Status::success();
  }
  if (st && st->kind == K::kLeaf)
    return invalidArgument("output " + path + ": one placement for a structured output");
  for (size_t i = 0; i < gt.children.size(); ++i) {
    std::string key = gt.kind == ir::OutputTree::Kind::kDict ? gt.keys.at(i) : std::to_string(i);
    const spec::OutputPlacementTree* child = nullptr;
    if (st && st->kind == K::kSequence && i < st->children.size()) child = &st->children[i];
    if (st && st->kind == K::kDict)
      for (size_t k = 0; k < st->keys.size(); ++k)
        if (st->keys[k] == key) child = &st->children[k];
    APC_RETURN_IF_ERROR(
        collectLeaves(gt.children[i], child, path.empty() ? key : path + "." + key, out));
  }
  return Status::success();
}

}  // namespace

/// The members' names, the flat buffers' bytes as GroupedGather and GroupedReduceScatter lay them
/// out (each member in a slot of its largest piece, one slot per rank; an all-reduce then a
/// slice: the full gradients), and whether they are re-gathered. A group's gradients are reduced
/// together when it takes them by one reduce-scatter or an all-reduce then a slice
/// (artifact::gatherGradientForm).
std::vector<plan::GatherGroup> memoryGatherGroups(const proto::Program& program) {
  const std::vector<int> groups = artifact::paramGatherGroups(program);
  std::map<uint32_t, int> param_of_value;
  for (int i = 0; i < program.parameters_size(); ++i)
    param_of_value[program.parameters(i).value()] = i;
  auto dtypeBytesOf = [](const std::string& name) {
    return ir::dtypeBytes(ir::parseDType(name).value_or(ir::DType::kF32));
  };
  std::map<int, plan::GatherGroup> by_group;
  // Per group: the gradients' bytes as one all-reduce (full) and as one reduce-scatter (padded
  // slots), and whether a member takes an all-reduce (then the group does: GroupedReduceScatter).
  struct Reduce {
    int64_t full = 0, slots = 0;
    bool all_reduce = false;
  };
  std::map<int, Reduce> reduce;
  for (size_t i = 0; i < groups.size(); ++i) {
    if (groups[i] < 0) continue;
    const proto::Node& node = program.graph().nodes(static_cast<int>(i));
    const proto::Redistribution& red = program.redistributions(
        static_cast<int>(program.node_redistribution(static_cast<int>(i)) - 1));
    const proto::ProgramTensor& param = program.parameters(param_of_value.at(node.inputs(0)));
    plan::GatherGroup& grp = by_group[groups[i]];
    grp.params.push_back(param.name());
    grp.regather = red.regather();
    // The (last) all-gather's output: a slot of the largest piece per member, one per rank; a
    // gather over several mesh dims gathers from the product of their ranks.
    const proto::RedistStep& f = red.forward(red.forward_size() - 1);
    const std::string& stored =
        param.storage_dtype().empty() ? param.dtype() : param.storage_dtype();
    int64_t numel = 1;
    for (int64_t s : f.local_in()) numel *= s;
    const int64_t along =
        f.gather_dim() >= 0 && f.gather_dim() < f.local_in_size() ? f.local_in(f.gather_dim()) : 1;
    int64_t most = along;
    for (int64_t s : f.group_sizes()) most = std::max(most, s);
    const int64_t ranks = std::max<int64_t>(f.group_sizes_size(), 1);
    const int64_t row = along > 0 ? numel / along : 0;
    grp.gather_bytes += ranks * row * most * dtypeBytesOf(stored);
    grp.ranks = 1;
    for (const proto::RedistStep& st : red.forward())
      grp.ranks *= std::max<int64_t>(st.group_sizes_size(), 1);
    // The gradients' flat buffer.
    const artifact::GatherGradientForm form = artifact::gatherGradientForm(red);
    if (!red.requires_grad() || form == artifact::GatherGradientForm::kOther) continue;
    const proto::RedistStep& b = red.backward(0);
    const int64_t elem =
        dtypeBytesOf(red.reduce_dtype().empty() ? param.dtype() : red.reduce_dtype());
    int64_t full = 1;
    for (int64_t s : b.local_in()) full *= s;
    Reduce& rd = reduce[groups[i]];
    rd.full += full * elem;
    // A chain's first flat buffer: the full gradients (an all-reduce's, or a reduce-scatter's
    // slots, about as large).
    if (form == artifact::GatherGradientForm::kAllReduceSlice ||
        form == artifact::GatherGradientForm::kChain) {
      rd.all_reduce = true;
      continue;
    }
    const int64_t ranks_b = std::max<int64_t>(b.group_sizes_size(), 1);
    const int64_t cut =
        b.shard_dim() >= 0 && b.shard_dim() < b.local_in_size() ? b.local_in(b.shard_dim()) : 1;
    const int64_t b_row = cut > 0 ? full / cut : 0;
    rd.slots += ranks_b * b_row * mesh::chunkSize(cut, ranks_b, 0) * elem;
  }
  std::vector<plan::GatherGroup> out;
  for (auto& [id, grp] : by_group) {
    if (auto rd = reduce.find(id); rd != reduce.end())
      grp.reduce_bytes = rd->second.all_reduce ? rd->second.full : rd->second.slots;
    out.push_back(std::move(grp));
  }
  return out;
}

namespace {

class Lowerer {
 public:
  Lowerer(const ir::Graph& g, const plan::Plan& p, const cost::CostModel& model, int64_t rank,
          const LowerOptions& options)
      : g_(g),
        p_(p),
        mesh_(p.spec.mesh),
        model_(model),
        rank_(rank),
        options_(options),
        grad_bucket_bytes_(cost::gradientBucketPricingBytes(g)) {}

  Expected<proto::Program> run();

 private:
  Status readPlacements();
  void decideLiveness();
  void decidePartialGradients();
  /// The mesh dims an op's work is split on (cost::opSplit of its placements), and those its
  /// outputs' gradients stay partial on (partial_grad_): its replicated inputs' gradients are
  /// partial there.
  std::vector<bool> gradientSplit(const ir::Node& n) const;
  /// `t` with Replicate on the mesh dims of one rank, where every placement holds the whole
  /// tensor (a Shard is all of it, a Partial the value itself).
  PlacementTuple onManyRanks(PlacementTuple t) const {
    for (size_t d = 0; d < t.size() && d < mesh_.ndim(); ++d)
      if (mesh_.size(d) == 1) t[d] = Placement::replicate();
    return t;
  }
  /// Whether the runtime buckets the gradient `grad_plan` of value `gv` read as `dst`: a
  /// parameter read where it lies whose gradient is one all-reduce, or one on each of several
  /// mesh dims.
  bool bucketsGradient(ir::ValueId gv, const PlacementTuple& dst,
                       const cost::RedistributionPlan& grad_plan) const {
    return cost::regatheredInBackward(g_.node(g_.value(gv).producer)) &&
           onManyRanks(*placement_[gv.v]) == onManyRanks(dst) && cost::bucketsGradient(grad_plan);
  }
  /// The placement a value's gradient is brought to where the value is read: its own placement
  /// with Partial as Replicate, and Partial on the dims partial_grad_ keeps it so.
  PlacementTuple gradientTarget(ir::ValueId gv) const;
  /// The price edge() gives a gradient's redistribution grad_from -> grad_to of value `gv` read
  /// as `dst` (a parameter read where it lies: its share of a gradient bucket); nullopt when
  /// impossible. `in_bucket`, when given: what the runtime's buckets make of it, each mesh dim's
  /// all-reduce at its share of a bucket (edge() prices those of several dims whole); -1 when it
  /// is not bucketed.
  std::optional<double> gradientUs(ir::ValueId gv, const PlacementTuple& dst,
                                   const PlacementTuple& grad_from, const PlacementTuple& grad_to,
                                   double* in_bucket = nullptr) const;
  ir::TensorMeta localMeta(const ir::TensorMeta& global, const PlacementTuple& t) const;
  std::vector<layout::DimPiece> pieces(const ir::TensorMeta& global, const PlacementTuple& t) const;
  TensorPiece pieceOf(const ir::TensorMeta& global, const PlacementTuple& t) const;
  /// proto::Program::random_pieces of random node `n`: this rank's coordinates on the mesh dims
  /// (of more than one rank) where n's first output is sharded, row-major; 0 on the others.
  uint64_t randomPiece(const ir::Node& n) const {
    const std::optional<PlacementTuple>& t =
        n.outputs.empty() ? std::nullopt : placement_[n.outputs.front().v];
    uint64_t piece = 0;
    for (size_t d = 0; d < mesh_.ndim(); ++d) {
      const bool cut = t && d < t->size() && (*t)[d].isShard();
      piece = piece * static_cast<uint64_t>(mesh_.size(d)) +
              (cut ? static_cast<uint64_t>(coord_[d]) : 0);
    }
    return piece;
  }
  ir::ValueId addValue(const ir::Value& global, const std::optional<PlacementTuple>& t,
                       std::string debug_name);
  ir::NodeId addNode(ir::Node n, int32_t source, uint32_t redistribution = 0);
  Expected<ir::ValueId> localInput(ir::ValueId gv);
  Expected<ir::ValueId> edge(ir::ValueId gv, const PlacementTuple& dst,
                             const std::vector<bool>& op_split, const std::string& consumer,
                             const std::string& module_path);
  Status fillSteps(const cost::RedistributionPlan& plan, const ir::TensorMeta& meta,
                   std::optional<ir::DType> reduce_dtype,
                   google::protobuf::RepeatedPtrField<proto::RedistStep>* out) const;
  Status emitLeafNode(const ir::Node& n);
  Status emitOp(const ir::Node& n);
  /// Whether a graph input has a dim of symbol `symbol` (the runtime binds symbols from inputs).
  bool inputSymbol(const std::string& symbol) {
    if (!input_symbols_) {
      input_symbols_.emplace();
      for (ir::NodeId id : g_.nodesOfKind(ir::NodeKind::kInput))
        for (ir::ValueId v : g_.node(id).outputs)
          if (const auto& t = g_.value(v).tensor)
            for (const ir::Dim& d : t->shape)
              if (d.isSymbolic()) input_symbols_->insert(d.symbol);
    }
    return input_symbols_->count(symbol) > 0;
  }
  std::optional<std::set<std::string>> input_symbols_;  // inputSymbol's, made on first use
  Status emitOutputs();
  ir::ValueId castTo(ir::ValueId local, ir::DType dtype, const std::string& module_path,
                     int32_t source);
  /// The dtype a floating value has in the program under mixed precision.
  ir::DType computeDtype(ir::DType d) const {
    const auto& mp = p_.spec.mixed_precision;
    return mp.param_dtype && ir::isFloating(d) ? *mp.param_dtype : d;
  }
  /// Fills program_.divisible (see proto::DivisibleDim) once the inputs are known.
  void recordDivisibility();
  /// Fills program_.prediction from the plan (after the graph and redistributions are written).
  Status recordPrediction();
  void addProgramTensor(const std::string& name, const ir::TensorMeta& global,
                        const PlacementTuple& t, ir::ValueId local,
                        google::protobuf::RepeatedPtrField<proto::ProgramTensor>* out) const;

  const ir::Graph& g_;
  const plan::Plan& p_;
  const mesh::DeviceMesh& mesh_;
  const cost::CostModel& model_;  // the plan's: lowered edges carry the prices it solved with
  int64_t rank_;
  LowerOptions options_;
  double grad_bucket_bytes_;  // cost::gradientBucketPricingBytes, as the planner's
  std::vector<int64_t> coord_;

  std::vector<NodePlacements> placed_;                    // per graph node
  std::vector<std::optional<PlacementTuple>> placement_;  // per graph value (tensors)
  std::vector<bool> dropped_, live_;                      // per graph node
  /// Per graph node and mesh dim: the node computes replicated there and its outputs' gradients
  /// stay partial there, reduced at its parameters instead (decidePartialGradients).
  std::vector<std::vector<bool>> partial_grad_;

  ir::Graph out_;
  std::vector<ir::ValueId> vmap_;  // graph value -> program value
  std::map<std::string, ir::ValueId> edge_cache_;
  std::vector<uint32_t> node_redistribution_;
  std::vector<int32_t> source_node_;
  proto::Program program_;
  ir::OutputTree out_tree_;
};

Status Lowerer::readPlacements() {
  placed_.assign(g_.numNodes(), {});
  for (const plan::PlanNode& pn : p_.nodes) {
    if (!pn.graph_node) continue;
    if (*pn.graph_node >= g_.numNodes())
      return invalidArgument("plan node '" + pn.name + "' names graph node " +
                             std::to_string(*pn.graph_node) + ", the graph has " +
                             std::to_string(g_.numNodes()));
    const ir::Node& n = g_.node(ir::NodeId(*pn.graph_node));
    if (pn.kind != ir::nodeKindName(n.kind) || pn.input_placements.size() != n.inputs.size() ||
        pn.outputs.size() != n.outputs.size())
      return invalidArgument("plan node '" + pn.name + "' does not match graph node " +
                             std::to_string(n.id.v) + " (" + n.qualifiedOp() +
                             "): the model changed since planning");
    NodePlacements& np = placed_[n.id.v];
    np.present = true;
    auto read = [&](const std::vector<std::optional<PlacementTuple>>& in,
                    std::vector<std::optional<PlacementTuple>>& out) -> Status {
      for (const auto& t : in) {
        if (t && t->size() != mesh_.ndim())
          return invalidArgument("plan node '" + pn.name + "': placement of " +
                                 std::to_string(t->size()) + " entries on a " +
                                 std::to_string(mesh_.ndim()) + "-d mesh");
        out.push_back(t);
      }
      return Status::success();
    };
    APC_RETURN_IF_ERROR(read(pn.input_placements, np.inputs));
    APC_RETURN_IF_ERROR(read(pn.outputs, np.outputs));
  }
  placement_.assign(g_.numValues(), std::nullopt);
  for (const ir::Value& v : g_.values()) {
    bool tensorish = (v.isTensor() && v.tensor) || v.type == ir::ValueType::kTensorList;
    if (!tensorish) continue;
    std::optional<PlacementTuple> t;
    if (v.producer.valid()) {
      const NodePlacements& np = placed_[v.producer.v];
      if (np.present && v.producer_output < np.outputs.size()) t = np.outputs[v.producer_output];
    }
    placement_[v.id.v] = t ? *t : mesh::replicated(mesh_.ndim());
    int64_t rank = v.tensor ? v.tensor->rank() : -1;
    for (const ir::TensorMeta& e : v.elements) rank = e.rank();
    if (rank >= 0) {
      Status st = mesh::checkPlacementTuple(*placement_[v.id.v], rank, mesh_.ndim());
      if (!st.ok()) return st.error().withContext("%" + v.debug_name);
    }
  }
  return Status::success();
}

void Lowerer::decideLiveness() {
  dropped_.assign(g_.numNodes(), false);
  live_.assign(g_.numNodes(), true);
  if (!options_.drop_shape_arithmetic) return;
  for (const ir::Node& n : g_.nodes()) {
    if (!g_.isShapeNode(n.id) || writesInput(n.op)) continue;
    bool known = true;
    for (ir::ValueId v : n.outputs) known = known && g_.value(v).constant.has_value();
    dropped_[n.id.v] = known;
  }
  std::vector<bool> needed(g_.numValues(), false);
  for (ir::ValueId v : g_.outputs().leaves()) needed[v.v] = true;
  for (size_t i = g_.numNodes(); i-- > 0;) {
    const ir::Node& n = g_.nodes()[i];
    bool live = true;
    if (n.kind == ir::NodeKind::kOp) {
      live = false;
      if (!dropped_[i]) {
        live = writesInput(n.op);
        for (ir::ValueId v : n.outputs) live = live || needed[v.v];
      }
    }
    live_[i] = live;
    if (live)
      for (ir::ValueId v : n.inputs) needed[v.v] = true;
  }
}

std::vector<layout::DimPiece> Lowerer::pieces(const ir::TensorMeta& global,
                                              const PlacementTuple& t) const {
  return layout::localPiece(ir::hintSizes(global.shape), t, mesh_, coord_);
}

TensorPiece Lowerer::pieceOf(const ir::TensorMeta& global, const PlacementTuple& t) const {
  TensorPiece tp{ir::hintSizes(global.shape), pieces(global, t), {}, global.shape, t};
  for (const ir::Dim& d : global.shape) tp.symbolic.push_back(d.isSymbolic());
  return tp;
}

/// Gradients kept partial through replicated computation. A value computed on every rank of a
/// mesh dim alike (its op's inputs and outputs Replicate there) and read by ops whose work is split
/// over that dim (a batch-sharded add of a position embedding, a window attention adding its bias
/// table) receives a Partial gradient there; edge() would all-reduce it where it is read, one
/// blocking collective in the middle of backward. Backward is linear in the gradient and every
/// rank of the dim holds the same forward values, so the partial gradient can instead flow on
/// through the replicated ops unreduced, down to the parameters they read, whose gradients then
/// take the all-reduce (bucketed with the others, as torch's DDP reduces a position embedding's
/// gradient). Per set of mesh dims (all of them together, then each alone), the set kept so is
/// the largest set of live ops that
///   - compute replicated on the dims (gradientSplit false) and write no input;
///   - have every gradient-carrying output read only by ops that read it Replicate on the dims
///     and are split there or in the set (never an output leaf, never a tensor list);
///   - have every gradient-carrying input a parameter's or a set member's output;
/// then, per connected group of it, kept only where the cost model prices the group's parameter
/// gradients below the reductions it saves: at their share of a bucket where bucketed (the
/// bandwidth they add), plus one all-reduce's latency per dim where no other parameter's gradient
/// is bucketed on the dims (they would make a bucket of their own).
void Lowerer::decidePartialGradients() {
  const size_t ndim = mesh_.ndim();
  partial_grad_.assign(g_.numNodes(), std::vector<bool>(ndim, false));
  if (!options_.partial_gradients) return;
  auto carriesGrad = [&](ir::ValueId id) {
    const ir::Value& v = g_.value(id);
    if (v.type == ir::ValueType::kTensorList) {
      for (const ir::TensorMeta& e : v.elements)
        if (e.requires_grad && ir::isFloating(e.dtype)) return true;
      return false;
    }
    return v.tensor && v.tensor->requires_grad && ir::isFloating(v.tensor->dtype);
  };
  auto fromParameter = [&](ir::ValueId id) {
    const ir::Value& v = g_.value(id);
    return v.producer.valid() && g_.node(v.producer).kind == ir::NodeKind::kParameter;
  };
  const std::vector<std::vector<ir::Use>> uses = g_.computeUses();
  std::vector<bool> leaf(g_.numValues(), false);
  for (ir::ValueId v : g_.outputs().leaves()) leaf[v.v] = true;
  auto readAs = [&](const ir::Node& u, uint32_t i) -> PlacementTuple {
    const NodePlacements& np = placed_[u.id.v];
    return np.present && i < np.inputs.size() && np.inputs[i] ? *np.inputs[i]
                                                              : *placement_[u.inputs[i].v];
  };
  // One pass over the mesh dims `dims` together: a member is replicated on each of them and its
  // gradients stay partial on all of them. The mesh dims at once first (a batch sharded over
  // several dims reduces on each), then each dim alone.
  auto decide = [&](const std::vector<size_t>& dims) {
    std::vector<std::vector<bool>> split(g_.numNodes());  // gradientSplit, before this pass
    for (const ir::Node& n : g_.nodes())
      if (placed_[n.id.v].present) split[n.id.v] = gradientSplit(n);
    auto splitOnAll = [&](const ir::Node& u) {
      if (split[u.id.v].size() != ndim) return false;
      for (size_t d : dims)
        if (!split[u.id.v][d]) return false;
      return true;
    };
    auto replicatedOnAll = [&](const PlacementTuple& t) {
      for (size_t d : dims)
        if (!t[d].isReplicate()) return false;
      return true;
    };
    std::vector<bool> in(g_.numNodes(), false);
    for (const ir::Node& n : g_.nodes()) {
      if (n.kind != ir::NodeKind::kOp || !live_[n.id.v] || split[n.id.v].size() != ndim ||
          writesInput(n.op))
        continue;
      bool ok = false;
      for (ir::ValueId o : n.outputs) ok = ok || carriesGrad(o);
      for (size_t d : dims) ok = ok && !split[n.id.v][d];
      in[n.id.v] = ok;
    }
    // The largest set: drop members that break a condition until none does. A drop can break
    // the condition of the members it reads (their readers) and of those that read it (their
    // inputs): those are checked again (a worklist, linear in the graph).
    auto keeps = [&](const ir::Node& n) {
      for (ir::ValueId o : n.outputs) {
        if (!carriesGrad(o)) continue;
        const ir::Value& ov = g_.value(o);
        if (!(ov.isTensor() && ov.tensor && !leaf[o.v] && placement_[o.v] &&
              replicatedOnAll(*placement_[o.v])))
          return false;
        for (const ir::Use& use : uses[o.v]) {
          const ir::Node& u = g_.node(use.node);
          if (!live_[u.id.v]) continue;
          if (!(u.kind == ir::NodeKind::kOp && !writesInput(u.op) && split[u.id.v].size() == ndim &&
                replicatedOnAll(readAs(u, use.input_index)) && (splitOnAll(u) || in[u.id.v])))
            return false;
        }
      }
      for (ir::ValueId i : n.inputs)
        if (carriesGrad(i) &&
            !(g_.value(i).isTensor() &&
              (fromParameter(i) || (g_.value(i).producer.valid() && in[g_.value(i).producer.v]))))
          return false;
      return true;
    };
    std::vector<uint32_t> work;
    for (const ir::Node& n : g_.nodes())
      if (in[n.id.v]) work.push_back(n.id.v);
    while (!work.empty()) {
      const ir::Node& n = g_.node(ir::NodeId(work.back()));
      work.pop_back();
      if (!in[n.id.v] || keeps(n)) continue;
      in[n.id.v] = false;
      for (ir::ValueId i : n.inputs)
        if (const ir::Value& iv = g_.value(i); iv.producer.valid() && in[iv.producer.v])
          work.push_back(iv.producer.v);
      for (ir::ValueId o : n.outputs)
        for (const ir::Use& use : uses[o.v])
          if (in[use.node.v]) work.push_back(use.node.v);
    }
    // Connected groups (a member reading another's output joins its group), each priced.
    std::vector<size_t> group(g_.numNodes());
    for (size_t i = 0; i < group.size(); ++i) group[i] = i;
    auto find = [&](size_t i) {
      size_t root = i;
      while (group[root] != root) root = group[root];
      while (group[i] != root) i = std::exchange(group[i], root);
      return root;
    };
    for (const ir::Node& n : g_.nodes())
      if (in[n.id.v])
        for (ir::ValueId i : n.inputs)
          if (const ir::Value& iv = g_.value(i); iv.producer.valid() && in[iv.producer.v])
            group[find(n.id.v)] = find(iv.producer.v);
    // Per group: the reductions saved minus the parameter gradients added, as the runtime runs
    // them (buckets).
    std::map<size_t, double> saving;
    std::set<size_t> new_bucket;  // groups that bucket a parameter's gradient
    std::set<std::string> seen;   // edges priced once, as edge() lowers them once
    auto price = [&](size_t grp, ir::ValueId gv, const ir::Node& u, uint32_t input,
                     bool reader_kept, bool value_kept) {
      const PlacementTuple dst = readAs(u, input);
      std::vector<bool> reader = split[u.id.v];
      const PlacementTuple before_from = cost::gradientPlacement(dst, reader);
      if (reader_kept)
        for (size_t d : dims) reader[d] = true;
      const PlacementTuple after_from = cost::gradientPlacement(dst, reader);
      const std::string key =
          std::to_string(gv.v) + "|" + mesh::toString(dst) + "|" + mesh::toString(after_from);
      if (!seen.insert(key).second) return;
      const PlacementTuple before_to = gradientTarget(gv);
      PlacementTuple after_to = before_to;
      if (value_kept)
        for (size_t d : dims) after_to[d] = Placement::partial();
      double bucket_before = -1, bucket_after = -1;
      const std::optional<double> before =
          gradientUs(gv, dst, before_from, before_to, &bucket_before);
      const std::optional<double> after = gradientUs(gv, dst, after_from, after_to, &bucket_after);
      if (bucket_after >= 0 && bucket_before < 0) new_bucket.insert(grp);
      if (!before || !after) {
        saving[grp] = -std::numeric_limits<double>::infinity();
        return;
      }
      saving[grp] += (bucket_before >= 0 ? bucket_before : *before) -
                     (bucket_after >= 0 ? bucket_after : *after);
    };
    for (const ir::Node& n : g_.nodes()) {
      if (!in[n.id.v]) continue;
      const size_t grp = find(n.id.v);
      saving.emplace(grp, 0.0);
      for (ir::ValueId o : n.outputs)
        if (carriesGrad(o))
          for (const ir::Use& use : uses[o.v])
            if (live_[use.node.v] && !in[use.node.v])
              price(grp, o, g_.node(use.node), use.input_index, false, true);
      for (uint32_t i = 0; i < n.inputs.size(); ++i)
        if (carriesGrad(n.inputs[i]) && fromParameter(n.inputs[i]))
          price(grp, n.inputs[i], n, i, true, false);
    }
    // Whether the plan buckets a parameter's gradient on these dims already: a parameter read
    // where it lies, Replicate on them, by an op split over them (outside the set).
    bool bucket_exists = false;
    for (const ir::Node& u : g_.nodes()) {
      if (bucket_exists || !live_[u.id.v] || in[u.id.v] || !splitOnAll(u)) continue;
      for (uint32_t i = 0; i < u.inputs.size() && !bucket_exists; ++i)
        bucket_exists = carriesGrad(u.inputs[i]) && fromParameter(u.inputs[i]) &&
                        readAs(u, i) == *placement_[u.inputs[i].v] && replicatedOnAll(readAs(u, i));
    }
    if (!bucket_exists)
      for (size_t grp : new_bucket)
        for (size_t d : dims)
          saving[grp] -=
              model_.collectiveUs(cost::CollectiveKind::kAllReduce, d, mesh_.size(d), 0.0);
    for (const ir::Node& n : g_.nodes())
      if (in[n.id.v] && saving.at(find(n.id.v)) > 0)
        for (size_t d : dims) partial_grad_[n.id.v][d] = true;
  };
  // The dims of more than one rank (on one rank a Partial is the value itself).
  std::vector<size_t> many;
  for (size_t d = 0; d < ndim; ++d)
    if (mesh_.size(d) > 1) many.push_back(d);
  if (many.size() > 1) decide(many);
  for (size_t d : many) decide({d});
}

std::vector<bool> Lowerer::gradientSplit(const ir::Node& n) const {
  const NodePlacements& np = placed_[n.id.v];
  std::vector<bool> split = cost::opSplit(np.inputs, np.outputs, mesh_.ndim());
  if (n.id.v < partial_grad_.size())
    for (size_t d = 0; d < split.size() && d < partial_grad_[n.id.v].size(); ++d)
      split[d] = split[d] || partial_grad_[n.id.v][d];
  return split;
}

PlacementTuple Lowerer::gradientTarget(ir::ValueId gv) const {
  const ir::Value& v = g_.value(gv);
  PlacementTuple t = cost::partialAsReplicate(*placement_[gv.v]);
  if (v.producer.valid() && v.producer.v < partial_grad_.size())
    for (size_t d = 0; d < t.size() && d < partial_grad_[v.producer.v].size(); ++d)
      if (partial_grad_[v.producer.v][d]) t[d] = Placement::partial();
  return t;
}

std::optional<double> Lowerer::gradientUs(ir::ValueId gv, const PlacementTuple& dst,
                                          const PlacementTuple& grad_from,
                                          const PlacementTuple& grad_to, double* in_bucket) const {
  const ir::Value& v = g_.value(gv);
  ir::TensorMeta meta = *v.tensor;
  meta.dtype = computeDtype(meta.dtype);
  auto bwd =
      cost::planRedistribution(meta, onManyRanks(grad_from), onManyRanks(grad_to), mesh_, model_);
  if (!bwd.ok() || !bwd->feasible) return std::nullopt;
  // As edge() prices it.
  if (in_bucket) *in_bucket = -1;
  if (bucketsGradient(gv, dst, *bwd)) {
    if (in_bucket) {
      *in_bucket = 0;
      for (const cost::RedistributionStep& st : bwd->steps) {
        cost::RedistributionPlan one = *bwd;
        one.steps = {st};
        *in_bucket += cost::bucketedGradientUs(one, model_, grad_bucket_bytes_).value_or(0.0);
      }
    }
    if (auto b = cost::bucketedGradientUs(*bwd, model_, grad_bucket_bytes_)) return *b;
  }
  return bwd->forward_us;
}

ir::TensorMeta Lowerer::localMeta(const ir::TensorMeta& global, const PlacementTuple& t) const {
  ir::TensorMeta m = global;
  std::vector<layout::DimPiece> pc = pieces(global, t);
  for (size_t d = 0; d < m.shape.size(); ++d) m.shape[d].size = pc[d].size;
  return m;
}

ir::ValueId Lowerer::addValue(const ir::Value& global, const std::optional<PlacementTuple>& t,
                              std::string debug_name) {
  ir::Value v;
  v.type = global.type;
  v.debug_name = std::move(debug_name);
  if (global.tensor) {
    v.tensor = t ? localMeta(*global.tensor, *t) : *global.tensor;
    if (!global.constant) v.tensor->dtype = computeDtype(v.tensor->dtype);
  }
  for (const ir::TensorMeta& e : global.elements) {
    v.elements.push_back(t ? localMeta(e, elementPlacement(e, *t)) : e);
    v.elements.back().dtype = computeDtype(e.dtype);
  }
  v.constant = global.constant;
  return out_.addValue(std::move(v));
}

ir::NodeId Lowerer::addNode(ir::Node n, int32_t source, uint32_t redistribution) {
  node_redistribution_.push_back(redistribution);
  source_node_.push_back(source);
  return out_.addNode(std::move(n));
}

Expected<ir::ValueId> Lowerer::localInput(ir::ValueId gv) {
  if (vmap_[gv.v].valid()) return vmap_[gv.v];
  const ir::Value& v = g_.value(gv);
  if (!v.constant)
    return internalError("%" + v.debug_name + " is used before the program defines it");
  vmap_[gv.v] = addValue(v, std::nullopt, v.debug_name);
  return vmap_[gv.v];
}

/// `meta` carries the dtype the steps move; `reduce_dtype`, when set, the dtype the reducing
/// steps (all-reduce, reduce-scatter) move instead: their priced bytes are scaled to it.
Status Lowerer::fillSteps(const cost::RedistributionPlan& plan, const ir::TensorMeta& meta,
                          std::optional<ir::DType> reduce_dtype,
                          google::protobuf::RepeatedPtrField<proto::RedistStep>* out) const {
  std::vector<int64_t> sizes = ir::hintSizes(meta.shape);
  auto local = [&](const PlacementTuple& t, const std::vector<int64_t>& coord) {
    std::vector<int64_t> s;
    for (const layout::DimPiece& d : layout::localPiece(sizes, t, mesh_, coord))
      s.push_back(d.size);
    return s;
  };
  for (const cost::RedistributionStep& s : plan.steps) {
    proto::RedistStep* ps = out->Add();
    ps->set_kind(artifact::toProto(s.kind));
    ps->set_mesh_dim(static_cast<uint32_t>(s.mesh_dim));
    ps->set_gather_dim(s.gather_dim);
    ps->set_shard_dim(s.shard_dim);
    if (s.kind == cost::StepKind::kAllReduce || s.kind == cost::StepKind::kReduceScatter)
      ps->set_reduce_op(artifact::toProto(s.reduce_op));
    for (int64_t x : local(s.before, coord_)) ps->add_local_in(x);
    for (int64_t x : local(s.after, coord_)) ps->add_local_out(x);
    // group_sizes: along the gathered dim (before) for all-gather / all-to-all, along the cut dim
    // (after) for local-slice / reduce-scatter; cut_sizes: all-to-all's cut dim (after).
    std::vector<int64_t> member = coord_;
    for (int64_t k = 0; k < mesh_.size(s.mesh_dim); ++k) {
      member[s.mesh_dim] = k;
      if (s.kind == cost::StepKind::kAllGather || s.kind == cost::StepKind::kAllToAll)
        ps->add_group_sizes(local(s.before, member).at(static_cast<size_t>(s.gather_dim)));
      if (s.kind == cost::StepKind::kLocalSlice || s.kind == cost::StepKind::kReduceScatter)
        ps->add_group_sizes(local(s.after, member).at(static_cast<size_t>(s.shard_dim)));
      if (s.kind == cost::StepKind::kAllToAll)
        ps->add_cut_sizes(local(s.after, member).at(static_cast<size_t>(s.shard_dim)));
    }
    const bool reduces =
        s.kind == cost::StepKind::kAllReduce || s.kind == cost::StepKind::kReduceScatter;
    int64_t bytes = s.full_bytes;
    if (reduces && reduce_dtype && ir::dtypeBytes(meta.dtype) > 0)
      bytes = bytes / ir::dtypeBytes(meta.dtype) * ir::dtypeBytes(*reduce_dtype);
    ps->set_priced_bytes(bytes);
    bool symbolic = false;
    for (const ir::Dim& d : meta.shape) symbolic = symbolic || d.isSymbolic();
    if (symbolic)
      for (const ir::Dim& d : meta.shape) ps->add_dynamic(d.isSymbolic());
    artifact::toProto(s.before, ps->mutable_before());
    artifact::toProto(s.after, ps->mutable_after());
  }
  return Status::success();
}

Expected<ir::ValueId> Lowerer::edge(ir::ValueId gv, const PlacementTuple& dst,
                                    const std::vector<bool>& op_split, const std::string& consumer,
                                    const std::string& module_path) {
  const ir::Value& v = g_.value(gv);
  const PlacementTuple& src = *placement_[gv.v];
  const bool grad = v.tensor->requires_grad && ir::isFloating(v.tensor->dtype);
  // The edge's semantics (gradient placements, dtypes, regather) are apc/cost/edge.h's, which
  // the planner priced, but for the gradients decidePartialGradients keeps partial.
  PlacementTuple grad_from = cost::gradientPlacement(dst, op_split);
  PlacementTuple grad_to = gradientTarget(gv);
  APC_ASSIGN_OR_RETURN(ir::ValueId local_src, localInput(gv));
  if (src == dst && (!grad || grad_from == grad_to)) return local_src;
  // An edge that differs only on mesh dims of one rank moves nothing and runs no node (on a mesh
  // of [1] every edge is such; each node would cost a dispatch forward and backward), and its
  // steps are planned without those dims.
  if (onManyRanks(src) == onManyRanks(dst) &&
      (!grad || onManyRanks(grad_from) == onManyRanks(grad_to)))
    return local_src;
  // The steps move the tensor in the dtype the program holds it in (param_dtype under mixed
  // precision), and so does its gradient; a parameter's gradient is reduced in reduce_dtype
  // (FSDP2's MixedPrecisionPolicy; the planner prices the same, see apc/solver/graph_problem.h).
  ir::TensorMeta meta = *v.tensor;
  if (const ir::Value& lv = out_.value(local_src); lv.tensor) meta.dtype = lv.tensor->dtype;
  std::optional<ir::DType> reduce_dtype;
  const bool regathered = cost::regatheredInBackward(g_.node(v.producer));
  if (grad && regathered) {
    ir::DType d = cost::Precision(p_.spec.mixed_precision).reduceDtype(*v.tensor);
    if (d != meta.dtype) reduce_dtype = d;
  }
  std::string key = std::to_string(gv.v) + "|" + mesh::toString(dst) + "|" +
                    (grad ? mesh::toString(grad_from) : std::string("-"));
  if (auto it = edge_cache_.find(key); it != edge_cache_.end()) return it->second;

  std::string name = "%" + v.debug_name + " -> " + consumer;
  proto::Redistribution r;
  artifact::toProto(onManyRanks(src), r.mutable_from());
  artifact::toProto(onManyRanks(dst), r.mutable_to());
  auto fwd = cost::planRedistribution(meta, onManyRanks(src), onManyRanks(dst), mesh_, model_);
  if (!fwd.ok()) return fwd.error().withContext(name);
  if (!fwd->feasible)
    return unsupported(name + ": " + mesh::toString(src) + " -> " + mesh::toString(dst) +
                       " is impossible (" + fwd->infeasible_reason + ")");
  APC_RETURN_IF_ERROR(fillSteps(*fwd, meta, std::nullopt, r.mutable_forward()));
  r.set_requires_grad(grad);
  // As the planner priced the edge (solver::buildGraphProblem): the gradient's own
  // redistribution, and the forward once more where backward regathers.
  double backward_us = 0;
  if (grad) {
    artifact::toProto(onManyRanks(grad_from), r.mutable_grad_from());
    artifact::toProto(onManyRanks(grad_to), r.mutable_grad_to());
    auto bwd =
        cost::planRedistribution(meta, onManyRanks(grad_from), onManyRanks(grad_to), mesh_, model_);
    if (!bwd.ok()) return bwd.error().withContext(name + " (gradient)");
    if (!bwd->feasible)
      return unsupported(name + ": gradient " + mesh::toString(grad_from) + " -> " +
                         mesh::toString(grad_to) + " is impossible (" + bwd->infeasible_reason +
                         ")");
    APC_RETURN_IF_ERROR(fillSteps(*bwd, meta, reduce_dtype, r.mutable_backward()));
    backward_us = bwd->forward_us;
    // A parameter read where it lies whose gradient is one all-reduce, or one on each of several
    // mesh dims: the runtime buckets it (the flag); the planner priced the first at its share of
    // a bucket (cost::bucketedGradientUs), the others whole.
    if (bucketsGradient(gv, dst, *bwd)) {
      if (auto b = cost::bucketedGradientUs(*bwd, model_, grad_bucket_bytes_)) backward_us = *b;
      r.set_bucketed_gradient(true);
    }
    if (reduce_dtype) r.set_reduce_dtype(ir::dtypeName(*reduce_dtype));
  }
  if (grad && regathered)
    for (const proto::RedistStep& s : r.forward())
      if (s.kind() != proto::LOCAL_SLICE) r.set_regather(true);
  if (r.regather()) backward_us += fwd->forward_us;
  r.set_priced_forward_us(fwd->forward_us);
  r.set_priced_backward_us(backward_us);
  r.set_edge(name);
  *program_.add_redistributions() = std::move(r);

  ir::ValueId out = addValue(v, dst, v.debug_name + ".r" + std::to_string(edge_cache_.size()));
  ir::Node n;
  n.kind = ir::NodeKind::kOp;
  n.op = kRedistributeOp;
  n.inputs = {local_src};
  n.outputs = {out};
  n.module_path = module_path;
  addNode(std::move(n), -1, static_cast<uint32_t>(program_.redistributions_size()));
  edge_cache_.emplace(std::move(key), out);
  return out;
}

void Lowerer::addProgramTensor(
    const std::string& name, const ir::TensorMeta& global, const PlacementTuple& t,
    ir::ValueId local, google::protobuf::RepeatedPtrField<proto::ProgramTensor>* out) const {
  proto::ProgramTensor* pt = out->Add();
  pt->set_name(name);
  for (const ir::Dim& d : global.shape) {
    proto::Dim* pd = pt->add_global_shape();
    pd->set_size(d.size);
    pd->set_symbol(d.symbol);
  }
  pt->set_dtype(ir::dtypeName(global.dtype));
  artifact::toProto(t, pt->mutable_placement());
  for (const layout::DimPiece& d : pieces(global, t)) {
    proto::Piece* pc = pt->add_local();
    pc->set_offset(d.offset);
    pc->set_size(d.size);
  }
  pt->set_value(local.v);
  pt->set_requires_grad(global.requires_grad);
}

Status Lowerer::emitLeafNode(const ir::Node& n) {
  if (n.outputs.size() != 1) return internalError(n.qualifiedOp() + " node without one output");
  const ir::Value& v = g_.value(n.outputs[0]);
  google::protobuf::RepeatedPtrField<proto::ProgramTensor>* list = nullptr;
  if (!v.tensor) {  // a non-tensor forward argument: kept as is
    vmap_[v.id.v] = addValue(v, std::nullopt, v.debug_name);
  } else {
    const PlacementTuple& t = *placement_[v.id.v];
    vmap_[v.id.v] = addValue(v, t, v.debug_name);
    list = n.kind == ir::NodeKind::kInput       ? program_.mutable_inputs()
           : n.kind == ir::NodeKind::kParameter ? program_.mutable_parameters()
                                                : program_.mutable_buffers();
    addProgramTensor(n.name, *v.tensor, t, vmap_[v.id.v], list);
  }
  ir::Node copy = n;
  copy.inputs.clear();
  copy.outputs = {vmap_[v.id.v]};
  addNode(std::move(copy), static_cast<int32_t>(n.id.v));
  // Mixed precision: floating parameters, buffers and inputs are held in their own dtype (the
  // node's value) and cast to param_dtype at once, so every collective and op sees param_dtype.
  // Buffers are cast like parameters (what `module.to(param_dtype)` does, and what the planner
  // assumes of every value a buffer feeds): an f32 table (LLaMA's rope cos/sin) multiplied into
  // a bf16 activation would otherwise promote it to f32 and meet a bf16 matmul further on. Values
  // the model makes itself (factory ops, `.float()`, `type_as`) keep the dtypes its code gives
  // them, as in eager PyTorch with the same casts.
  // The cast belongs to no module: it runs beside the leaves, before any layer's ops, and a
  // module that reads the leaf stays one contiguous range of ops (ir::checkpointRange; with the
  // leaf's module path, the casts of every layer's parameters sat among the leaves at the top, and
  // no layer could be checkpointed under mixed precision).
  if (v.tensor && n.kind != ir::NodeKind::kOp && computeDtype(v.tensor->dtype) != v.tensor->dtype) {
    ir::ValueId stored = vmap_[v.id.v];
    out_.value(stored).tensor->dtype = v.tensor->dtype;
    vmap_[v.id.v] = castTo(stored, computeDtype(v.tensor->dtype), "", static_cast<int32_t>(n.id.v));
    proto::ProgramTensor& pt = *list->rbegin();
    pt.set_storage_dtype(ir::dtypeName(v.tensor->dtype));
    pt.set_dtype(ir::dtypeName(computeDtype(v.tensor->dtype)));
  }
  return Status::success();
}

ir::ValueId Lowerer::castTo(ir::ValueId local, ir::DType dtype, const std::string& module_path,
                            int32_t source) {
  ir::Value out = out_.value(local);
  out.tensor->dtype = dtype;
  out.debug_name += "." + std::string(ir::dtypeName(dtype));
  out.constant.reset();
  ir::ValueId cast = out_.addValue(std::move(out));
  ir::Node n;
  n.kind = ir::NodeKind::kOp;
  n.op = "aten::to";
  n.overload = "dtype";
  n.inputs = {local, out_.addConstant(ir::ValueType::kInt, scalarTypeCode(dtype)),
              out_.addConstant(ir::ValueType::kBool, false),
              out_.addConstant(ir::ValueType::kBool, false),
              out_.addConstant(ir::ValueType::kNone, ir::None{})};
  n.outputs = {cast};
  n.module_path = module_path;
  addNode(std::move(n), source);
  return cast;
}

Status Lowerer::emitOp(const ir::Node& n) {
  const NodePlacements& np = placed_[n.id.v];
  std::string consumer = n.qualifiedOp() + " #" + std::to_string(n.id.v);
  const std::vector<bool> op_split = gradientSplit(n);

  std::vector<ir::ValueId> inputs;
  // Where each tensor input is computed on (the op's internal collective, OpInfo::collective).
  std::vector<std::optional<PlacementTuple>> computed_on(n.inputs.size());
  RankPieces rp;
  rp.coordinate = coord_;
  std::vector<std::optional<ir::Constant>> constants;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    ir::ValueId gv = n.inputs[i];
    const ir::Value& v = g_.value(gv);
    std::optional<PlacementTuple> want =
        np.present && i < np.inputs.size() ? np.inputs[i] : std::nullopt;
    std::vector<TensorPiece> tp;
    if (v.isTensor() && v.tensor && placement_[gv.v] && v.producer.valid()) {
      PlacementTuple dst = want ? *want : *placement_[gv.v];
      computed_on[i] = dst;
      std::string where = consumer + " (input " + std::to_string(i) + ")";
      APC_ASSIGN_OR_RETURN(ir::ValueId local, edge(gv, dst, op_split, where, n.module_path));
      inputs.push_back(local);
      tp.push_back(pieceOf(*v.tensor, dst));
    } else if (v.type == ir::ValueType::kTensorList && placement_[gv.v] && v.producer.valid()) {
      if (want && *want != *placement_[gv.v])
        return unsupported(consumer + " (input " + std::to_string(i) + "): tensor list %" +
                           v.debug_name + " placed " + mesh::toCompactString(*placement_[gv.v]) +
                           ", needed " + mesh::toCompactString(*want));
      APC_ASSIGN_OR_RETURN(ir::ValueId local, localInput(gv));
      inputs.push_back(local);
      for (const ir::TensorMeta& e : v.elements)
        tp.push_back(pieceOf(e, elementPlacement(e, *placement_[gv.v])));
    } else {
      APC_ASSIGN_OR_RETURN(ir::ValueId local, localInput(gv));
      inputs.push_back(local);
      if (v.tensor) {
        PlacementTuple r = mesh::replicated(mesh_.ndim());
        tp.push_back(pieceOf(*v.tensor, r));
      }
    }
    rp.inputs.push_back(std::move(tp));
    constants.push_back(v.isTensor() || v.type == ir::ValueType::kTensorList ? std::nullopt
                                                                             : v.constant);
  }
  for (ir::ValueId gv : n.outputs) {
    const ir::Value& v = g_.value(gv);
    std::vector<TensorPiece> tp;
    if (v.tensor && placement_[gv.v]) tp.push_back(pieceOf(*v.tensor, *placement_[gv.v]));
    for (const ir::TensorMeta& e : v.elements)
      tp.push_back(pieceOf(e, elementPlacement(e, *placement_[gv.v])));
    rp.outputs.push_back(std::move(tp));
  }

  auto rewrite = localizeNode(n, constants, rp);
  if (!rewrite.ok()) return rewrite.error().withContext(consumer);
  ir::Node copy = n;
  for (const auto& [pos, c] : rewrite->replace) {
    const ir::Value& gv = g_.value(n.inputs[pos]);
    inputs[pos] = out_.addConstant(gv.type, c, gv.debug_name + ".local");
  }
  if (rewrite->overload) copy.overload = *rewrite->overload;
  if (rewrite->prepend) {
    ir::ValueType type = std::holds_alternative<double>(*rewrite->prepend) ? ir::ValueType::kFloat
                                                                           : ir::ValueType::kInt;
    inputs.insert(inputs.begin(), out_.addConstant(type, *rewrite->prepend, "start.local"));
  }
  copy.inputs = std::move(inputs);
  copy.outputs.clear();
  for (ir::ValueId gv : n.outputs) {
    const ir::Value& v = g_.value(gv);
    vmap_[gv.v] = addValue(v, placement_[gv.v], v.debug_name);
    copy.outputs.push_back(vmap_[gv.v]);
  }
  ir::NodeId id = addNode(std::move(copy), static_cast<int32_t>(n.id.v));
  // The node's local graph, which the runtime runs in place of the op (proto::OpCollective,
  // apc/ir/op_collective.h): the one of a collective the op runs inside itself (its registry
  // entry's OpInfo::collective and collective_local), with the mesh dims its all-reduces reduce
  // over, or the one of its local rewrite (NodeRewrite::local, no collective: a vocab-parallel
  // embedding's masked lookup).
  const std::string label = n.qualifiedOp() + " (" + n.module_path + ")";
  auto recordLocal = [&](const ir::Graph& local, const std::vector<size_t>& mesh_dims) -> Status {
    proto::OpCollective* oc = program_.add_op_collectives();
    oc->set_node(id.v);
    for (size_t m : mesh_dims) oc->add_mesh_dims(static_cast<uint32_t>(m));
    if (!oc->mutable_local()->ParseFromString(ir::serializeGraph(local)))
      return internalError(label + ": its local graph does not serialize");
    return Status::success();
  };
  if (const strategy::OpInfo* info = strategy::defaultRegistry().findEntry(n);
      info && info->collective) {
    const strategy::RuleContext ctx{g_, n};
    strategy::OpCollective inside = info->collective(ctx, computed_on, mesh_, nullptr);
    if (!inside.mesh_dims.empty()) {
      if (!info->collective_local)
        return internalError(label + ": the op's collective has no local graph");
      if (rewrite->local)
        return internalError(label + ": both a collective and a local rewrite's local graph");
      Expected<ir::Graph> local = info->collective_local(ctx, computed_on);
      if (!local.ok()) return local.error().withContext(label);
      APC_RETURN_IF_ERROR(recordLocal(*local, inside.mesh_dims));
    }
  }
  if (rewrite->local) APC_RETURN_IF_ERROR(recordLocal(*rewrite->local, {}));
  for (const SymbolicSize& e : rewrite->symbolic) {
    // Only symbols an input carries have a value at run time (a data-dependent size keeps its
    // hint, as before).
    if (!inputSymbol(e.symbol)) continue;
    proto::SymbolicArg* a = program_.add_symbolic_args();
    a->set_node(id.v);
    a->set_input(static_cast<uint32_t>(e.input));
    a->set_element(static_cast<int32_t>(e.element));
    a->set_symbol(e.symbol);
    a->set_per_symbol(e.per_symbol);
    artifact::toProto(e.placement, a->mutable_placement());
    a->set_rank(static_cast<uint32_t>(e.rank));
    a->set_dim(static_cast<uint32_t>(e.dim));
    a->set_part(e.part == SymbolicSize::Part::kSize     ? proto::SymbolicArg::SIZE
                : e.part == SymbolicSize::Part::kOffset ? proto::SymbolicArg::OFFSET
                                                        : proto::SymbolicArg::END);
    a->set_scale(e.scale);
    a->set_shift(e.shift);
  }
  return Status::success();
}

Status Lowerer::emitOutputs() {
  std::vector<Leaf> leaves;
  APC_RETURN_IF_ERROR(collectLeaves(g_.outputs(), &p_.spec.outputs, "", leaves));
  std::vector<ir::ValueId> local_leaves;
  for (const Leaf& leaf : leaves) {
    const ir::Value& v = g_.value(leaf.value);
    if (v.isTensor() && v.tensor && placement_[v.id.v]) {
      PlacementTuple want = leaf.want ? *leaf.want : *placement_[v.id.v];
      if (want.size() != mesh_.ndim())
        return invalidArgument("output " + leaf.path + ": placement of " +
                               std::to_string(want.size()) + " entries");
      PlacementTuple final_t = cost::partialAsReplicate(want);
      ir::ValueId local;
      if (v.producer.valid()) {
        APC_ASSIGN_OR_RETURN(local,
                             edge(leaf.value, final_t, std::vector<bool>(mesh_.ndim(), false),
                                  "output " + leaf.path, {}));
      } else {
        APC_ASSIGN_OR_RETURN(local, localInput(leaf.value));
        final_t = mesh::replicated(mesh_.ndim());
      }
      const auto& mp = p_.spec.mixed_precision;
      ir::DType have = out_.value(local).tensor->dtype;
      ir::DType want_dtype = ir::isFloating(have) && (mp.output_dtype || mp.param_dtype)
                                 ? mp.output_dtype.value_or(v.tensor->dtype)
                                 : have;
      if (want_dtype != have) local = castTo(local, want_dtype, {}, -1);
      local_leaves.push_back(local);
      addProgramTensor(leaf.path, *v.tensor, final_t, local, program_.mutable_outputs());
      program_.mutable_outputs()->rbegin()->set_dtype(ir::dtypeName(want_dtype));
    } else {
      APC_ASSIGN_OR_RETURN(ir::ValueId local, localInput(leaf.value));
      local_leaves.push_back(local);
      proto::ProgramTensor* pt = program_.add_outputs();
      pt->set_name(leaf.path);
      pt->set_value(local.v);
    }
  }
  size_t next = 0;
  std::function<ir::OutputTree(const ir::OutputTree&)> copy = [&](const ir::OutputTree& t) {
    ir::OutputTree c = t;
    if (t.kind == ir::OutputTree::Kind::kLeaf) {
      c.leaf = local_leaves.at(next++);
    } else {
      for (size_t i = 0; i < t.children.size(); ++i) c.children[i] = copy(t.children[i]);
    }
    return c;
  };
  out_tree_ = copy(g_.outputs());
  return Status::success();
}

void Lowerer::recordDivisibility() {
  // Where each symbol enters: the first program input dim that carries it.
  std::map<std::string, std::pair<uint32_t, uint32_t>> origin;
  for (int i = 0; i < program_.inputs_size(); ++i) {
    const proto::ProgramTensor& t = program_.inputs(i);
    for (int d = 0; d < t.global_shape_size(); ++d)
      if (!t.global_shape(d).symbol().empty())
        origin.emplace(t.global_shape(d).symbol(),
                       std::make_pair(static_cast<uint32_t>(i), static_cast<uint32_t>(d)));
  }
  if (origin.empty()) return;
  std::set<std::tuple<uint32_t, uint32_t, int64_t>> seen;
  for (const ir::Node& n : g_.nodes()) {
    const NodePlacements& np = placed_[n.id.v];
    if (n.kind != ir::NodeKind::kOp || !np.present || !live_[n.id.v]) continue;
    // Mesh dims on which an output is a Partial that uneven pieces would get wrong.
    std::vector<bool> reducing(mesh_.ndim(), false);
    for (const auto& t : np.outputs)
      if (t)
        for (size_t m = 0; m < t->size(); ++m)
          reducing[m] =
              reducing[m] || ((*t)[m].isPartial() && (*t)[m].reduceOp() != mesh::ReduceOp::kSum);
    // A token-local region's sort (apc/strategy/token_local.h; no rule cuts the sorted dim): the
    // region's positions are the rank's coordinate x its piece's size, exact for equal pieces.
    const bool region_sort = (n.op == "aten::sort" || n.op == "aten::argsort") &&
                             !np.inputs.empty() && np.inputs[0] && !n.inputs.empty() &&
                             g_.value(n.inputs[0]).tensor &&
                             g_.value(n.inputs[0]).tensor->rank() == 1;
    if (region_sort)
      for (size_t m = 0; m < np.inputs[0]->size(); ++m)
        reducing[m] = reducing[m] || (*np.inputs[0])[m].isShard(0);
    if (std::none_of(reducing.begin(), reducing.end(), [](bool b) { return b; })) continue;
    for (size_t i = 0; i < n.inputs.size() && i < np.inputs.size(); ++i) {
      const ir::Value& v = g_.value(n.inputs[i]);
      if (!np.inputs[i] || !v.tensor) continue;
      const PlacementTuple& t = *np.inputs[i];
      for (int d = 0; d < static_cast<int>(v.tensor->rank()); ++d) {
        const ir::Dim& dim = v.tensor->shape[static_cast<size_t>(d)];
        auto it = origin.find(dim.symbol);
        if (!dim.isSymbolic() || it == origin.end()) continue;
        int64_t pieces = 1;
        bool reduced_here = false;
        for (size_t m = 0; m < t.size(); ++m)
          if (t[m].isShard(d)) {
            pieces *= mesh_.shape()[m];
            reduced_here = reduced_here || reducing[m];
          }
        if (!reduced_here || !seen.insert({it->second.first, it->second.second, pieces}).second)
          continue;
        proto::DivisibleDim* dd = program_.add_divisible();
        dd->set_input(it->second.first);
        dd->set_dim(it->second.second);
        dd->set_symbol(dim.symbol);
        dd->set_pieces(pieces);
        dd->set_node(n.qualifiedOp() + (n.module_path.empty() ? "" : " (" + n.module_path + ")"));
        if (region_sort)
          dd->set_why(
              "runs its token-local region on (positions of equal pieces are wrong for "
              "unequal ones)");
      }
    }
  }
}

Status Lowerer::recordPrediction() {
  proto::Prediction* pr = program_.mutable_prediction();
  pr->set_cost_model(model_.describe());
  pr->set_compute_us(p_.totals.compute_us);
  // The communication is what this program runs: its redistributions, each priced as edge()
  // lowered it, not the plan's edges. Lowering makes one redistribution per (value, placement,
  // gradient placement), which every reader of it shares: where the plan priced the gradient
  // all-reduce of each of q, k and v's projections' input on its own, the program reduces their
  // summed gradient once (hf_llama_tiny's tp: 16 calls priced, 9.1 ms, 10 run). The gradients
  // decidePartialGradients keeps partial are priced at the parameters that now reduce them.
  double fwd = 0, bwd = 0;
  for (const proto::Redistribution& r : program_.redistributions()) {
    fwd += r.priced_forward_us();
    bwd += r.priced_backward_us();
  }
  // Grouped parameter gathers (artifact::paramGatherGroups: the runtime gathers a group's
  // parameters with ONE all-gather of a flat buffer in forward, once more in backward where they
  // are re-gathered, and with overlap, its default, reduces their gradients with ONE
  // reduce-scatter): the plan priced every member's collective on its own; what the group saves
  // (the latencies of all calls but one) is taken off the prediction.
  {
    const std::vector<int> groups = artifact::paramGatherGroups(program_);
    // Per collective step of a group: the members' calls priced on their own, and the bytes of
    // the group's one call.
    struct Step {
      cost::CollectiveKind kind = cost::CollectiveKind::kAllGather;
      uint32_t mesh_dim = 0;
      double separate = 0, bytes = 0;
      bool used = false;
    };
    struct Group {
      bool regather = false;
      std::vector<Step> gathers, grads;
    };
    auto add = [&](std::vector<Step>& steps, size_t j, cost::CollectiveKind kind, uint32_t dim,
                   double bytes) {
      if (steps.size() <= j) steps.resize(j + 1);
      Step& st = steps[j];
      // A single-step group with a member of each form runs one all-reduce.
      if (!st.used || kind == cost::CollectiveKind::kAllReduce) st.kind = kind;
      st.used = true;
      st.mesh_dim = dim;
      st.bytes += bytes;
      st.separate += model_.collectiveUs(kind, dim, mesh_.size(dim), bytes);
    };
    std::map<int, Group> by_group;
    for (size_t i = 0; i < groups.size(); ++i) {
      if (groups[i] < 0) continue;
      const proto::Redistribution& red = program_.redistributions(
          static_cast<int>(program_.node_redistribution(static_cast<int>(i)) - 1));
      Group& grp = by_group[groups[i]];
      grp.regather = red.regather();
      for (int j = 0; j < red.forward_size(); ++j)
        add(grp.gathers, static_cast<size_t>(j), cost::CollectiveKind::kAllGather,
            red.forward(j).mesh_dim(), static_cast<double>(red.forward(j).priced_bytes()));
      // The gradients: each member priced its own (a reduce-scatter, an all-reduce then a local
      // slice, or a chain of such steps); the group runs one call per collective step, one
      // all-reduce for a single step when any member takes one (GroupedReduceScatter).
      const artifact::GatherGradientForm form = artifact::gatherGradientForm(red);
      if (!red.requires_grad() || form == artifact::GatherGradientForm::kOther) continue;
      size_t j = 0;
      for (const proto::RedistStep& st : red.backward()) {
        if (st.kind() == proto::LOCAL_SLICE) continue;
        add(grp.grads, j++,
            st.kind() == proto::ALL_REDUCE ? cost::CollectiveKind::kAllReduce
                                           : cost::CollectiveKind::kReduceScatter,
            st.mesh_dim(), static_cast<double>(st.priced_bytes()));
      }
    }
    auto saving = [&](const std::vector<Step>& steps) {
      double out = 0;
      for (const Step& st : steps)
        out += st.separate -
               model_.collectiveUs(st.kind, st.mesh_dim, mesh_.size(st.mesh_dim), st.bytes);
      return out;
    };
    double fwd_saving = 0, bwd_saving = 0;
    for (const auto& [id, grp] : by_group) {
      const double gather = saving(grp.gathers);
      fwd_saving += gather;
      if (grp.regather) bwd_saving += gather;
      bwd_saving += saving(grp.grads);
    }
    fwd -= fwd_saving;
    bwd -= bwd_saving;
  }
  pr->set_forward_comm_us(fwd);
  pr->set_backward_comm_us(bwd);
  pr->set_comm_us(fwd + bwd);
  pr->set_step_us(p_.totals.total_us - p_.totals.comm_us + fwd + bwd);  // recomputation kept
  // Gradient buckets (artifact::deferredGradParameters: the runtime reduces those gradients in
  // flat buckets of kDefaultGradBucketBytes, the first kFirstGradBucketBytes, laid out as
  // backward reaches them): per (mesh dim, op, reduce dtype), each parameter once, in reverse
  // parameter order, priced as one all-reduce per bucket. The plan priced each at its share of
  // a bucket (cost::bucketedGradientUs); recorded: what the buckets save against that (negative:
  // the latency each bucket pays, and a smaller bucket's premium), and what reducing them one by
  // one would add.
  {
    const std::vector<int> deferred = artifact::deferredGradParameters(program_);
    // (the all-reduces' mesh dims, op, reduce dtype): a bucket runs one all-reduce per mesh dim.
    using Key = std::tuple<std::vector<uint32_t>, int, std::string>;
    std::map<Key, std::map<int, double>> bytes_by_param;  // key -> parameter -> priced bytes
    double separate = 0, latencies = 0;
    for (size_t r = 0; r < deferred.size(); ++r) {
      if (deferred[r] < 0) continue;
      const proto::Redistribution& red = program_.redistributions(static_cast<int>(r));
      const proto::RedistStep& st = red.backward(0);
      separate += red.priced_backward_us();
      std::vector<uint32_t> dims;
      double own = 0;  // the edge's all-reduces on their own
      for (const proto::RedistStep& s : red.backward()) {
        dims.push_back(s.mesh_dim());
        own += model_.collectiveUs(cost::CollectiveKind::kAllReduce, s.mesh_dim(),
                                   mesh_.size(s.mesh_dim()), static_cast<double>(s.priced_bytes()));
      }
      latencies += own - red.priced_backward_us();
      double& b =
          bytes_by_param[{dims, static_cast<int>(st.reduce_op()), red.reduce_dtype()}][deferred[r]];
      b = std::max(b, static_cast<double>(st.priced_bytes()));
    }
    if (!bytes_by_param.empty()) {
      const double cap = static_cast<double>(artifact::kDefaultGradBucketBytes);
      const double first_cap = static_cast<double>(artifact::kFirstGradBucketBytes);
      double bucketed = 0;
      for (const auto& [key, params] : bytes_by_param) {
        const std::vector<uint32_t>& dims = std::get<0>(key);
        double bucket = 0;
        bool first = true;
        auto close = [&] {
          if (bucket > 0)
            for (uint32_t m : dims)
              bucketed +=
                  model_.collectiveUs(cost::CollectiveKind::kAllReduce, m, mesh_.size(m), bucket);
          bucket = 0;
          first = false;
        };
        for (auto it = params.rbegin(); it != params.rend(); ++it) {
          if (bucket > 0 && bucket + it->second > (first ? first_cap : cap)) close();
          bucket += it->second;
        }
        close();
      }
      pr->set_grad_bucket_bytes(artifact::kDefaultGradBucketBytes);
      pr->set_grad_bucket_saving_us(separate - bucketed);
      pr->set_grad_unbucketed_extra_us(latencies);
    }
  }
  // The optimizers of apc-train, kernel by kernel over each local shard (bytes read + written per
  // element, in units of the shard's size): SGD p -= lr g is a scaled copy of g (2) and a
  // subtraction (3); AdamW is a decay of p (2), m = b1 m + (1-b1) g (2 + 3), v = b2 v + (1-b2) g^2
  // (2 + 4), v / c2 (2), sqrt (2), + eps (2) and p += -lr m / denom (4).
  static constexpr double kSgd[] = {2, 3};
  static constexpr double kAdamW[] = {2, 2, 3, 2, 4, 2, 2, 2, 4};
  double sgd = 0, adamw = 0;
  for (const proto::ProgramTensor& t : program_.parameters()) {
    if (!t.requires_grad()) continue;
    double numel = 1;
    for (const proto::Piece& piece : t.local()) numel *= static_cast<double>(piece.size());
    const std::string& stored = t.storage_dtype().empty() ? t.dtype() : t.storage_dtype();
    const ir::DType dtype = ir::parseDType(stored).value_or(ir::DType::kF32);
    const double bytes = numel * static_cast<double>(ir::dtypeBytes(dtype));
    // Each kernel as the cost model prices a memory-bound op (the measured elementwise curve
    // where calibrated), called directly (CostModel::directKernelUs).
    auto kernelUs = [&](double k) {
      return model_.directKernelUs(
          model_.computeUs(cost::OpFamily::kPointwise, 0, k * bytes, dtype));
    };
    for (double k : kSgd) sgd += kernelUs(k);
    for (double k : kAdamW) adamw += kernelUs(k);
  }
  pr->set_optimizer_sgd_us(sgd);
  pr->set_optimizer_adamw_us(adamw);
  static_assert(plan::kGradBucketBytes == artifact::kDefaultGradBucketBytes,
                "the memory model's gradient bucket is the runtime's default");
  static_assert(
      cost::kGradBucketPricingBytes == static_cast<double>(artifact::kFirstGradBucketBytes),
      "a bucketed gradient is priced in the runtime's first gradient bucket");
  {
    // The plan's estimates, unless the runtime groups parameter gathers (known here, from the
    // program): then predicted again with the groups.
    std::vector<plan::MemoryEstimate> memory = p_.memory;
    const std::vector<plan::GatherGroup> gather_groups = memoryGatherGroups(program_);
    if (memory.empty() || !gather_groups.empty()) {
      auto predicted = plan::predictMemoryAll(g_, p_, gather_groups);
      if (predicted.ok()) memory = std::move(predicted).value();
    }
    for (const plan::MemoryEstimate& e : memory) {
      proto::PeakMemory* m = pr->add_peak_memory();
      m->set_optimizer(e.optimizer);
      m->set_peak_bytes(e.peak_bytes);
      m->set_phase(e.phase);
      m->set_saved_activations(e.saved_activations);
      m->set_persistent_bytes(e.persistent_bytes);
      m->set_forward_peak(e.forward_peak);
      m->set_loss_peak(e.loss_peak);
      m->set_backward_peak(e.backward_peak);
      m->set_optimizer_peak(e.optimizer_peak);
    }
  }
  std::vector<double> by_graph_node(g_.numNodes(), 0.0);
  for (const plan::PlanNode& n : p_.nodes)
    if (n.graph_node && *n.graph_node < by_graph_node.size())
      by_graph_node[*n.graph_node] = n.compute_us;
  for (int32_t src : source_node_)
    pr->add_node_compute_us(src >= 0 && static_cast<size_t>(src) < by_graph_node.size()
                                ? by_graph_node[static_cast<size_t>(src)]
                                : 0.0);
  return Status::success();
}

Expected<proto::Program> Lowerer::run() {
  if (rank_ < 0 || rank_ >= mesh_.worldSize())
    return invalidArgument("rank " + std::to_string(rank_) + " outside the mesh " +
                           mesh_.toString());
  coord_ = mesh_.coordinate(rank_);
  APC_RETURN_IF_ERROR(readPlacements());
  decideLiveness();
  decidePartialGradients();
  vmap_.assign(g_.numValues(), ir::ValueId());
  out_.name = g_.name;
  for (const ir::Node& n : g_.nodes()) {
    if (!live_[n.id.v]) continue;
    if (n.kind == ir::NodeKind::kOp)
      APC_RETURN_IF_ERROR(emitOp(n));
    else
      APC_RETURN_IF_ERROR(emitLeafNode(n));
  }
  APC_RETURN_IF_ERROR(emitOutputs());
  recordDivisibility();
  out_.setOutputs(out_tree_);
  APC_RETURN_IF_ERROR(out_.verify());

  proto::Graph* pg = program_.mutable_graph();
  if (!pg->ParseFromString(ir::serializeGraph(out_)))
    return internalError("the program's graph does not round-trip through protobuf");
  for (int i = 0; i < pg->nodes_size(); ++i)
    if (node_redistribution_.at(static_cast<size_t>(i)) != 0)
      pg->mutable_nodes(i)->set_kind("redistribute");
  for (uint32_t r : node_redistribution_) program_.add_node_redistribution(r);
  for (size_t i = 0; i < source_node_.size(); ++i) {
    const int32_t src = source_node_[i];
    program_.add_source_node(src);
    if (src < 0) continue;
    const ir::Node& n = g_.node(ir::NodeId(static_cast<uint32_t>(src)));
    if (!strategy::defaultRegistry().drawsRandomNumbers(g_, n)) continue;
    program_.add_random_nodes(static_cast<uint32_t>(i));
    program_.add_random_pieces(randomPiece(n));
  }
  program_.set_format_version(artifact::kProgramFormatVersion);
  program_.set_rank(static_cast<uint32_t>(rank_));
  program_.set_world_size(static_cast<uint32_t>(mesh_.worldSize()));
  for (int64_t s : mesh_.shape()) program_.add_mesh_shape(s);
  for (const std::string& s : mesh_.names()) program_.add_mesh_names(s);
  for (int64_t c : coord_) program_.add_coordinate(c);
  program_.set_model_name(p_.model.model_name);
  program_.set_model_hash(p_.model.model_sha256);
  program_.set_plan_hash(p_.content_hash);
  if (const auto& mp = p_.spec.mixed_precision; mp.param_dtype || mp.reduce_dtype) {
    proto::MixedPrecision* pm = program_.mutable_mixed_precision();
    if (mp.param_dtype) pm->set_param_dtype(ir::dtypeName(*mp.param_dtype));
    if (mp.reduce_dtype) pm->set_reduce_dtype(ir::dtypeName(*mp.reduce_dtype));
  }
  // The checkpoint segments first: the gather groups the prediction prices depend on them
  // (artifact::paramGatherGroups).
  for (const std::string& module : p_.checkpoint) {
    const std::optional<ir::NodeRange> r = ir::checkpointRange(out_, module);
    if (!r)
      return invalidArgument("the plan checkpoints module '" + module +
                             "', which cannot be recomputed in this rank's program (its nodes "
                             "are not contiguous, it updates state in place, or it passes a "
                             "non-tensor value on)");
    if (program_.checkpoints_size() > 0 && r->first <= program_.checkpoints().rbegin()->last())
      return invalidArgument(
          "the plan's checkpointed modules overlap or are out of node order at '" + module + "'");
    proto::CheckpointSegment* cs = program_.add_checkpoints();
    cs->set_module(module);
    cs->set_first(r->first);
    cs->set_last(r->last);
  }
  if (options_.predict) {
    APC_RETURN_IF_ERROR(recordPrediction());
  }
  if (!options_.predict) return std::move(program_);
  // The runtime's overlap, replayed on the finished program (its checkpoints included).
  const StepSchedule schedule = simulateStep(out_, program_, model_, mesh_);
  program_.mutable_prediction()->set_hidden_comm_us(schedule.hidden_us);
  program_.mutable_prediction()->set_exposed_comm_us(schedule.exposed_comm_us);
  program_.mutable_prediction()->set_overlap_efficiency(model_.device().overlap_efficiency);
  return std::move(program_);
}

}  // namespace

Expected<proto::Program> lowerRank(const ir::Graph& g, const plan::Plan& p, int64_t rank,
                                   const LowerOptions& options) {
  APC_ASSIGN_OR_RETURN(cost::CostModel model, cost::costModelFor(p.spec));
  Lowerer l(g, p, model, rank, options);
  return l.run();
}

Expected<std::vector<plan::MemoryEstimate>> predictRuntimeMemory(const ir::Graph& g,
                                                                 const plan::Plan& p) {
  // Two parameters redistributed at least (a group has two members): a parameter whose placement
  // differs from a consumer's input placement.
  std::set<uint32_t> redistributed;
  for (const plan::PlanNode& c : p.nodes)
    for (const plan::PlanEdge& e : c.in_edges) {
      if (e.from >= p.nodes.size() || e.input >= c.input_placements.size()) continue;
      const plan::PlanNode& src = p.nodes[e.from];
      if (src.kind == "parameter" && !src.outputs.empty() &&
          c.input_placements[e.input] != src.outputs.front())
        redistributed.insert(e.from);
    }
  std::vector<plan::GatherGroup> groups;
  if (redistributed.size() >= 2) {
    LowerOptions options;
    options.predict = false;
    if (auto program = lowerRank(g, p, 0, options); program.ok())
      groups = memoryGatherGroups(*program);
  }
  return plan::predictMemoryAll(g, p, groups);
}

Status lowerEachRank(const ir::Graph& g, const plan::Plan& p,
                     const std::function<Status(const proto::Program&)>& sink,
                     const LowerOptions& options) {
  APC_ASSIGN_OR_RETURN(cost::CostModel model, cost::costModelFor(p.spec));  // once for all ranks
  for (int64_t r = 0; r < p.spec.mesh.worldSize(); ++r) {
    Lowerer l(g, p, model, r, options);
    APC_ASSIGN_OR_RETURN(proto::Program prog, l.run());
    APC_RETURN_IF_ERROR(sink(prog));
  }
  return Status::success();
}

Expected<std::vector<proto::Program>> lowerPlan(const ir::Graph& g, const plan::Plan& p,
                                                const LowerOptions& options) {
  APC_ASSIGN_OR_RETURN(cost::CostModel model, cost::costModelFor(p.spec));  // once for all ranks
  std::vector<proto::Program> out;
  for (int64_t r = 0; r < p.spec.mesh.worldSize(); ++r) {
    Lowerer l(g, p, model, r, options);
    APC_ASSIGN_OR_RETURN(proto::Program prog, l.run());
    out.push_back(std::move(prog));
  }
  return out;
}

}  // namespace apc::lower
